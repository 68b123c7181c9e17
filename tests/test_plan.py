import copy
import json

import pytest

from dlrm_scale.run_config import load_run_config
from planner.search.bounds import step_lower_bound_ms
from planner.spec.errors import PlanFormatError
from planner.plan.document import SCHEMA, Plan
from planner.plan.planning import make_plan
from planner.views.report import format_plan
from planner.search.solver import SolverConfig
from planner.spec.types import Perf, ShardCost, ShardGeometry, ShardingOption, ShardingType, Storage
from tests.conftest import make_cluster, make_problem, table


@pytest.fixture(scope="module")
def plan_doc():
    tables = [table("a", 5_000_000, 64, 20.0), table("b", 1000, 16), table("c", 300_000, 32, 3.0)]
    problem = make_problem(tables, make_cluster(num_nodes=2, ranks_per_node=2), batch=4096)
    return make_plan(problem, config=SolverConfig(time_limit_s=2)).to_dict()


def test_plan_json_has_the_v1_fields(plan_doc):
    assert plan_doc["schema"] == SCHEMA
    assert plan_doc["world_size"] == 4 and plan_doc["ranks_per_node"] == 2
    for t in plan_doc["tables"].values():
        assert {"sharding_type", "compute_kernel", "shards"} <= set(t)
        for s in t["shards"]:
            assert set(s) == {"rank", "row_offset", "col_offset", "rows", "cols", "tier"}
    assert [r["rank"] for r in plan_doc["ranks"]] == [0, 1, 2, 3]
    assert all({"predicted_ms", "memory_bytes"} <= set(r) for r in plan_doc["ranks"])
    pred = plan_doc["predicted"]
    assert pred["max_rank_ms"] == pytest.approx(max(r["predicted_ms"] for r in plan_doc["ranks"]))
    assert pred["lower_bound_ms"] <= pred["max_rank_ms"]


def test_round_trip_through_file(plan_doc, tmp_path):
    plan = Plan.from_dict(plan_doc)
    path = tmp_path / "p.json"
    plan.save(path)
    assert json.loads(path.read_text()) == plan_doc
    assert not list(tmp_path.glob("*.tmp"))


def corrupt(doc, edit):
    doc = copy.deepcopy(doc)
    edit(doc)
    return doc


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda d: d.update(schema="other"), "not a dlrm-scale/plan/v1"),
        (lambda d: d.pop("world_size"), "world_size"),
        (lambda d: d.update(world_size=3), "multiple of ranks_per_node"),
        (lambda d: d["tables"]["a"].update(sharding_type="diagonal"), "sharding_type"),
        (lambda d: d["tables"]["a"].update(compute_kernel="magic"), "compute_kernel"),
        (lambda d: d["tables"]["a"]["shards"][0].update(rank=99), "outside"),
        (lambda d: d["tables"]["a"]["shards"][0].update(tier="tape"), "tier"),
        (lambda d: d["tables"]["a"]["shards"][0].update(rows="many"), "wrong type"),
        (lambda d: d["tables"]["c"]["shards"].pop(), "cover|replica"),
        (lambda d: d["tables"]["a"].update(shards=[]), "no shards"),
    ],
)
def test_invalid_plans_give_one_line_naming_the_field(plan_doc, edit, fragment):
    with pytest.raises(PlanFormatError, match=fragment) as e:
        Plan.from_dict(corrupt(plan_doc, edit))
    assert "\n" not in str(e.value)


def test_overlapping_shards_are_rejected(plan_doc):
    doc = copy.deepcopy(plan_doc)
    doc["tables"]["b"] = {
        "sharding_type": "column_wise", "compute_kernel": "fused", "num_embeddings": 1000, "embedding_dim": 16,
        "shards": [
            {"rank": 0, "row_offset": 0, "col_offset": 0, "rows": 1000, "cols": 12, "tier": "hbm"},
            {"rank": 1, "row_offset": 0, "col_offset": 8, "rows": 1000, "cols": 4, "tier": "hbm"},
        ],
    }
    with pytest.raises(PlanFormatError, match="overlap"):
        Plan.from_dict(doc)


def test_row_wise_blocks_must_follow_rank_order(plan_doc):
    doc = copy.deepcopy(plan_doc)
    doc["tables"]["b"] = {
        "sharding_type": "row_wise", "compute_kernel": "fused", "num_embeddings": 1000, "embedding_dim": 16,
        "shards": [{"rank": r, "row_offset": 250 * i, "col_offset": 0, "rows": 250, "cols": 16, "tier": "hbm"}
                   for i, r in enumerate([1, 0, 2, 3])],
    }
    with pytest.raises(PlanFormatError, match="row block i on rank i"):
        Plan.from_dict(doc)


def grid_doc(plan_doc, ranks, rows=(500, 500)):
    """Table b as a grid of two 8-column blocks, shard i of block c at [block c rows, ...] on ranks[2c + i]."""
    doc = copy.deepcopy(plan_doc)
    offsets = [0, rows[0]]
    doc["tables"]["b"] = {
        "sharding_type": "grid_shard", "compute_kernel": "fused", "num_embeddings": 1000, "embedding_dim": 16,
        "shards": [{"rank": ranks[2 * c + i], "row_offset": offsets[i], "col_offset": 8 * c, "rows": rows[i], "cols": 8, "tier": "hbm"}
                   for c in range(2) for i in range(2)],
    }
    return doc


def test_a_grid_puts_each_column_block_on_a_node_of_its_own(plan_doc):
    assert Plan.from_dict(grid_doc(plan_doc, [2, 3, 0, 1])).tables["b"].sharding_type == "grid_shard"
    for ranks in ([0, 1, 0, 1], [1, 0, 2, 3], [0, 2, 1, 3]):  # one node twice; row blocks out of local order; across nodes
        with pytest.raises(PlanFormatError, match="grid_shard table 'b' must put each column block's row block i on local rank i") as e:
            Plan.from_dict(grid_doc(plan_doc, ranks))
        assert "\n" not in str(e.value)
    with pytest.raises(PlanFormatError, match=r"row blocks of 500 rows \(ceil of 1000 / 2\), as TorchRec cuts them"):
        Plan.from_dict(grid_doc(plan_doc, [0, 1, 2, 3], rows=(600, 400)))


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(PlanFormatError, match="does not exist"):
        Plan.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlanFormatError, match="not valid JSON"):
        Plan.load(bad)


def test_cached_tables_carry_their_tier_cache_rows_and_load_factor(tmp_path):
    from planner.spec.specs import TableSpec, TieringSpec

    big = TableSpec("big", 40_000_000, 128, 4.0, zipf_exponent=1.1)
    cluster = make_cluster(ranks_per_node=2, hbm_gib=8, ssd_bytes_per_node=2**40)
    problem = make_problem([big, table("small")], cluster, tiering=TieringSpec(load_factors=(0.05, 0.2)))
    plan = make_plan(problem, config=SolverConfig(time_limit_s=2))
    doc = plan.to_dict()
    t = doc["tables"]["big"]
    assert t["compute_kernel"] in ("fused_uvm_caching", "key_value") and t["cache_load_factor"] in (0.05, 0.2)
    for s in t["shards"]:
        assert s["tier"] in ("ddr", "ssd") and s["cache_rows"] == -(-s["rows"] * t["cache_load_factor"] // 1)
    assert "cache_rows" not in doc["tables"]["small"]["shards"][0]
    assert Plan.from_dict(doc).to_dict() == doc
    broken = corrupt(doc, lambda d: d["tables"]["big"]["shards"][0].pop("cache_rows"))
    with pytest.raises(PlanFormatError, match="has no 'cache_rows'"):
        Plan.from_dict(broken)
    broken = corrupt(doc, lambda d: d["tables"]["big"].update(cache_load_factor=1.5))
    with pytest.raises(PlanFormatError, match=r"cache_load_factor 1.5 must be in \(0, 1\]"):
        Plan.from_dict(broken)


def test_a_plan_records_the_inputs_it_was_made_for():
    from dataclasses import replace

    from planner.plan.document import check_plan_inputs
    from planner.plan.inputs import PlanInputs

    problem = make_problem([table("a", 100_000, 32, 4.0), table("b", 1000, 32)], make_cluster(), batch=512)
    plan = make_plan(problem, config=SolverConfig(time_limit_s=2))
    assert plan.inputs == PlanInputs.of(problem) and plan.inputs.batch_size_per_rank == 512
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).inputs == plan.inputs
    check_plan_inputs(plan, problem)
    # more or less memory is a planning choice; a faster link prices every option anew
    roomier = replace(problem, cluster=replace(problem.cluster, hbm_bytes_per_rank=2 * problem.cluster.hbm_bytes_per_rank))
    check_plan_inputs(plan, roomier)
    faster = replace(problem, cluster=problem.cluster.with_costs(intra_node_gb_per_s=2 * problem.cluster.costs.intra_node_gb_per_s))
    with pytest.raises(PlanFormatError, match="priced with hardware profile .* before a re-calibration"):
        check_plan_inputs(plan, faster)
    other_batch = replace(problem, training=replace(problem.training, batch_size_per_rank=256))
    with pytest.raises(PlanFormatError, match="made for batch_size_per_rank 512, this run has 256"):
        check_plan_inputs(plan, other_batch)
    check_plan_inputs(replace(plan, inputs=None), other_batch)  # a plan written by hand records none


def _option(name, sharding_type, shard_ms):
    cost = ShardCost(Perf(fwd_compute_ms=shard_ms), Storage())
    return ShardingOption(name, sharding_type, "fused", "hbm", tuple(ShardGeometry(0, 0, 100, 8) for _ in range(2)), (cost, cost))


def test_the_step_bound_is_the_least_over_sets_of_sharding_types():
    """Hand arithmetic: two tables on two ranks, each table-wise-like (2 shards of 1 ms) or
    replicated (2 shards of 3 ms). The busiest rank's bound is 1 ms; the types' fixed cost is 10
    ms a sharded type and 1 ms for replicas. Replicas alone: their own bound is 6 ms (each rank
    carries 3 + 3), plus 1 = 7 ms; the sharded type alone 2 (a shard of each table a rank) + 10 =
    12; both 1 + 11 = 12."""
    options = {t: [_option(t, ShardingType.COLUMN_WISE, 1.0), _option(t, ShardingType.DATA_PARALLEL, 3.0)] for t in "ab"}
    fixed = {ShardingType.COLUMN_WISE: 10.0, ShardingType.DATA_PARALLEL: 1.0}
    assert step_lower_bound_ms(options, 2, 1.0, lambda types: sum(fixed[t] for t in types)) == pytest.approx(7.0)
    fixed[ShardingType.DATA_PARALLEL] = 9.0  # now the sharded type alone is cheapest: 2 + 10
    assert step_lower_bound_ms(options, 2, 1.0, lambda types: sum(fixed[t] for t in types)) == pytest.approx(12.0)
    options["b"] = options["b"][1:]  # b replicated only: no plan uses the sharded type alone; replicas 6 + 9
    assert step_lower_bound_ms(options, 2, 1.0, lambda types: sum(fixed[t] for t in types)) == pytest.approx(15.0)


def _one_shard_option(name, sharding_type, shard_ms):
    cost = ShardCost(Perf(fwd_compute_ms=shard_ms), Storage())
    return ShardingOption(name, sharding_type, "fused", "hbm", (ShardGeometry(0, 0, 100, 8),), (cost,))


def test_the_step_bound_takes_each_set_of_types_own_bounds():
    """The two tables above, with a third option each: whole on one rank, 5 ms. Fixed costs: the
    sharded type 10 ms, replicas 1, whole tables 3. Replicas and whole tables together would be
    1 ms (the bound over every option) + 4; their options alone carry at least 5 ms a rank (a whole
    table each, or 6 of replicas), so 5 + 4 = 9, and replicas alone, 6 + 1 = 7, is the least.
    A search over the whole tables' options that proved their busiest rank at least 8 ms bounds
    every set within them: whole tables alone 8 + 3; one over every type, at 9 ms, every set."""
    cw, dp, tw = ShardingType.COLUMN_WISE, ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE
    options = {t: [_option(t, cw, 1.0), _option(t, dp, 3.0), _one_shard_option(t, tw, 5.0)] for t in "ab"}
    fixed = {cw: 10.0, dp: 1.0, tw: 3.0}

    def types_ms(types):
        return sum(fixed[t] for t in types)

    assert step_lower_bound_ms(options, 2, 1.0, types_ms) == pytest.approx(7.0)
    fixed[dp] = 9.0  # replicas dearer: whole tables alone, 5 + 3, are the least
    assert step_lower_bound_ms(options, 2, 1.0, types_ms) == pytest.approx(8.0)
    assert step_lower_bound_ms(options, 2, 1.0, types_ms, {frozenset({tw}): 8.0}) == pytest.approx(11.0)  # 8 + 3; replicas 6 + 9 = 15
    assert step_lower_bound_ms(options, 2, 1.0, types_ms, {frozenset({cw, dp, tw}): 9.0}) == pytest.approx(12.0)  # 9 + 3


def test_the_step_bound_sweeps_only_the_sets_that_could_be_least():
    """Against the definition, every set of types with its own sweep: random options of up to four
    types over six tables on three ranks, some sets' bounds proven."""
    import itertools
    import random

    from planner.search.bounds import shard_limited_bound_ms

    rng = random.Random(7)
    kinds = [ShardingType.COLUMN_WISE, ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.ROW_WISE]
    for _ in range(30):
        options = {}
        for t in "abcdef":
            offered = rng.sample(kinds, rng.randint(1, 4))
            options[t] = [(_option if rng.random() < 0.5 else _one_shard_option)(t, k, rng.uniform(0.5, 6.0)) for k in offered]
        fixed = {k: rng.uniform(0.0, 4.0) for k in kinds}
        proven = {frozenset(rng.sample(kinds, rng.randint(1, 4))): rng.uniform(1.0, 9.0) for _ in range(rng.randint(0, 2))}
        rank_ms = shard_limited_bound_ms(options, 3)
        every = []
        for size in range(1, 5):
            for subset in itertools.combinations(kinds, size):
                only = {t: [o for o in opts if o.sharding_type in subset] for t, opts in options.items()}
                if all(only.values()):
                    within = [ms for types, ms in proven.items() if types >= set(subset)]
                    every.append(max([rank_ms, *within, shard_limited_bound_ms(only, 3)]) + sum(fixed[k] for k in subset))
        got = step_lower_bound_ms(options, 3, rank_ms, lambda types: sum(fixed[k] for k in types), proven)
        assert got == pytest.approx(min(every))


def test_the_summary_reports_the_gap_of_the_step_the_search_minimised():
    """tiny.yaml goes all data-parallel (one all-reduce instead of three all-to-alls): its
    busiest rank is far above the busiest-rank bound, but its step is proven optimal."""
    plan = make_plan(load_run_config("configs/tiny.yaml").problem)
    step_ms, bound_ms = plan.step
    assert plan.gap > 1.0 and step_ms == pytest.approx(bound_ms) and plan.step_gap == pytest.approx(0.0, abs=1e-9)
    summary = format_plan(plan)
    assert f"proven lower bound {bound_ms:.4f} ms, gap 0.00%" in summary and "488" not in summary
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.step == plan.step


@pytest.mark.parametrize("config", ["criteo_kaggle", "bench_embedding_bound", "bench_tiered"])
def test_the_step_never_beats_its_bound(config):
    plan = make_plan(load_run_config(f"configs/{config}.yaml").problem, config=SolverConfig(time_limit_s=2.0))
    assert plan.lower_bound_ms <= plan.step[1] <= plan.step[0] * (1 + 1e-9)


def test_the_hardware_digest_covers_what_the_machine_costs_not_its_topology():
    """A plan made with a profile is refused under a re-calibrated one, not under another --hbm-gb."""
    from dataclasses import replace

    from planner.plan.inputs import hardware_digest

    cluster = make_cluster()
    assert hardware_digest(cluster) == hardware_digest(replace(cluster, hbm_bytes_per_rank=cluster.hbm_bytes_per_rank // 2, name="x"))
    assert hardware_digest(cluster) != hardware_digest(cluster.with_costs(lookup_fwd_ns=cluster.costs.lookup_fwd_ns + 1.0))
    assert cluster.with_costs(lookup_fwd_ns=7.0).costs.lookup_fwd_ns == 7.0 and cluster.costs.lookup_fwd_ns == 0.0
