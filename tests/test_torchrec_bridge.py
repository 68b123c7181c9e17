import pytest
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from dlrm_scale.bridge.sharding_plan import from_sharding_plan, to_sharding_plan
from dlrm_scale.bridge.torchrec_cost import TorchRecCostModel, TorchRecEstimates, torchrec_planner_plan
from dlrm_scale.run_config import load_problem
from planner.plan.document import Plan, check_geometry, table_layout
from planner.plan.planning import make_plan
from planner.views.scoring import rank_times_ms
from planner.search.solver import SolverConfig
from planner.spec.types import ShardingType
from tests.conftest import make_cluster, make_problem, table

SCHEMES = [
    (ShardingType.DATA_PARALLEL, 4, "dense", None),
    (ShardingType.TABLE_WISE, 1, "fused", [3]),
    (ShardingType.COLUMN_WISE, 4, "fused", [2, 0, 3, 1]),
    (ShardingType.TABLE_COLUMN_WISE, 2, "fused", [2, 3]),
    (ShardingType.ROW_WISE, 4, "fused", None),
    (ShardingType.TABLE_ROW_WISE, 2, "fused", [2, 3]),
]


def every_scheme_plan() -> tuple[Plan, dict]:
    tables, shapes = {}, {}
    for i, (st, n, kernel, ranks) in enumerate(SCHEMES):
        t = table(f"t_{st.value}", 1001 + i, 16)
        tables[t.name] = table_layout(t, st, ranks or list(range(n)), "ddr")
        assert tables[t.name].compute_kernel == kernel
        shapes[t.name] = (t.num_embeddings, t.embedding_dim)
    return Plan(4, 2, tables, (), 0.0, 0.0), shapes


def test_plan_to_torchrec_and_back_is_identity():
    plan, shapes = every_scheme_plan()
    for name, t in plan.tables.items():
        check_geometry(name, t)
    sharding_plan = to_sharding_plan(plan, "cpu")
    ps = sharding_plan.plan[""]
    assert ps["t_column_wise"].ranks == [2, 0, 3, 1]
    assert ps["t_data_parallel"].sharding_spec is None
    back = from_sharding_plan(sharding_plan, shapes, 4, 2, "cpu")
    assert back.tables == plan.tables


def test_torchrec_cost_model_matches_torchrec_enumerator():
    problem = make_problem([table("a", 50_000, 64, 7.0), table("b", 1000, 64, 1.0)], make_cluster(ranks_per_node=4), batch=512)
    ours = {(o.sharding_type.value, len(o.shards)): o for o in _options(problem, "a")}
    est = TorchRecEstimates(problem)
    enumerator = EmbeddingEnumerator(est.topology, batch_size=512, constraints=est.constraints)
    theirs = [o for o in enumerator.enumerate(est.collection, [EmbeddingBagCollectionSharder()]) if o.name == "a" and o.compute_kernel in ("fused", "dense")]
    compared = set()
    for o in theirs:
        mine = ours.get((o.sharding_type, len(o.shards)))
        if mine is None:  # e.g. TorchRec's one-shard column_wise (ours calls it table_wise)
            continue
        assert mine.total_ms == pytest.approx(sum(s.perf.total for s in o.shards), rel=1e-9)
        assert mine.shards[0].storage.hbm_bytes == o.shards[0].storage.hbm
        compared.add(o.sharding_type)
    assert {"data_parallel", "table_wise", "row_wise"} <= compared


def _options(problem, name):
    from planner.search.candidates import enumerate_options

    return enumerate_options(problem, TorchRecCostModel(problem))[name]


def test_scoring_our_plan_with_torchrec_model_equals_its_prediction():
    problem = load_problem("configs/criteo_kaggle.yaml")
    plan = make_plan(problem, TorchRecCostModel(problem), SolverConfig(time_limit_s=2))
    scored = rank_times_ms(plan, problem, TorchRecCostModel(problem))
    assert scored.max() == pytest.approx(plan.max_rank_ms, rel=1e-9)


def test_torchrec_planner_baseline_gives_a_valid_plan():
    problem = load_problem("configs/criteo_kaggle.yaml")
    plan, seconds = torchrec_planner_plan(problem)
    assert seconds > 0 and set(plan.tables) == {t.name for t in problem.tables}
    for name, t in plan.tables.items():
        check_geometry(name, t)
    assert rank_times_ms(plan, problem, TorchRecCostModel(problem)).max() > 0


def test_cached_tables_map_to_torchrec_kernels_with_their_load_factor():
    """On CUDA a cached table keeps FBGEMM's caching kernel and the plan's load factor."""
    from planner.spec.specs import TableSpec

    big, small = TableSpec("big", 10_000, 16), TableSpec("small", 100, 16)
    tables = {
        "big": table_layout(big, ShardingType.COLUMN_WISE, [0, 1], "ddr", 0.25),
        "small": table_layout(small, ShardingType.ROW_WISE, [0, 1], "ssd", 0.5),
    }
    plan = Plan(2, 2, tables, (), 0.0, 0.0)
    tr = to_sharding_plan(plan, "cuda")
    ps = tr.plan[""]
    assert ps["big"].compute_kernel == "fused_uvm_caching" and ps["big"].cache_params.load_factor == 0.25
    assert ps["small"].compute_kernel == "key_value" and ps["small"].cache_params.load_factor == 0.5
    back = from_sharding_plan(tr, {"big": (10_000, 16), "small": (100, 16)}, 2, 2, "cuda")
    assert back.tables == plan.tables


def test_scoring_a_cached_plan_charges_its_misses():
    from planner.cost.cost_model import AnalyticCostModel
    from planner.spec.specs import TableSpec

    t = TableSpec("t", 1_000_000, 64, 8.0, zipf_exponent=1.05)
    problem = make_problem([t], make_cluster(ranks_per_node=2, ssd_bytes_per_node=2**40, ssd_latency_us=1.0))
    model = AnalyticCostModel(problem.cluster, problem.training)
    in_memory = Plan(2, 2, {"t": table_layout(t, ShardingType.TABLE_WISE, [0], "hbm")}, (), 0.0, 0.0)
    small, large = (Plan(2, 2, {"t": table_layout(t, ShardingType.TABLE_WISE, [0], "ssd", f)}, (), 0.0, 0.0) for f in (0.05, 0.4))
    times = [rank_times_ms(p, problem, model)[0] for p in (in_memory, large, small)]
    assert times[0] < times[1] < times[2]
