"""Config, plan and stats loaders never end in a traceback: any input is a spec/plan or a PlannerError.

Derandomized, so CI sees the same examples every run; set derandomize=False locally to explore."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.spec.access_stats import load_stats
from dlrm_scale.run_config import load_problem
from planner.spec.config import load_tables_csv
from planner.spec.errors import PlannerError
from planner.plan.document import Plan

# numbers at the edges too: past int64, thousands of digits, NaN and infinities
numbers = st.one_of(st.integers(-10, 10**12), st.integers(-2**70, 2**70), st.just(10**3000), st.floats(allow_nan=True, allow_infinity=True))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
keys = st.sampled_from(["hardware", "cluster", "training", "tables", "tables_csv", "model", "batch_size_per_rank",
                        "world_size", "name", "num_embeddings", "embedding_dim", "pooling_factor", "ranks_per_node",
                        "hbm_gib_per_rank", "ddr_gib_per_node", "train", "steps", "typo"])
configs = st.dictionaries(keys, values, max_size=6)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(configs, values))
def test_config_loader_gives_a_problem_or_a_planner_error(tmp_path, doc):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    try:
        load_problem(path)
    except PlannerError as e:
        assert "\n" not in str(e)


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), name=st.sampled_from(["c.yaml", "t.csv"]))
def test_any_bytes_give_a_spec_or_a_planner_error(tmp_path, data, name):
    """Encodings: binary files, BOMs, invalid UTF-8 sequences."""
    path = tmp_path / name
    path.write_bytes(data)
    try:
        load_problem(path) if name.endswith(".yaml") else load_tables_csv(path)
    except PlannerError as e:
        assert "\n" not in str(e)


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_csv_loader_gives_tables_or_a_planner_error(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text("name,num_embeddings,embedding_dim,pooling_factor\n" + text)
    try:
        load_tables_csv(path)
    except PlannerError:
        pass


shard = st.fixed_dictionaries({k: st.one_of(st.integers(-2, 50), st.text(max_size=3), scalars) for k in ("rank", "row_offset", "col_offset", "rows", "cols")},
                              optional={"tier": st.one_of(st.sampled_from(["hbm", "ddr", "ssd"]), scalars), "cache_rows": scalars}) \
    | st.dictionaries(st.text(max_size=5), scalars)
table = st.fixed_dictionaries({"sharding_type": st.sampled_from(["table_wise", "row_wise", "column_wise", "data_parallel", "bogus"]),
                               "compute_kernel": st.sampled_from(["fused", "dense", "x", "key_value", "fused_uvm_caching"]),
                               "shards": st.one_of(st.lists(shard, max_size=3), scalars)},
                              optional={"cache_load_factor": scalars, "num_embeddings": st.one_of(st.integers(0, 60), scalars),
                                        "embedding_dim": st.one_of(st.integers(0, 60), scalars)})
plans = st.fixed_dictionaries({"schema": st.sampled_from(["dlrm-scale/plan/v1", "v0"]), "world_size": st.one_of(st.integers(-1, 8), scalars),
                               "ranks_per_node": st.integers(-1, 8), "tables": st.one_of(st.dictionaries(st.text(max_size=4), table, max_size=3), scalars)},
                              optional={"ranks": st.one_of(st.lists(st.dictionaries(st.text(max_size=6), scalars, max_size=3), max_size=2), scalars),
                                        "predicted": st.one_of(st.dictionaries(st.sampled_from(["max_rank_ms", "lower_bound_ms", "gap"]), scalars), scalars)})


@settings(max_examples=200, deadline=None, derandomize=True)
@given(doc=st.one_of(plans, values))
def test_plan_loader_gives_a_plan_or_a_planner_error(doc):
    try:
        Plan.from_dict(doc)
    except PlannerError as e:
        assert "\n" not in str(e)


stats_table = st.fixed_dictionaries({}, optional={k: values for k in ("batch_size", "pooling_factor", "distinct_ids", "unique_ids_per_batch",
                                                                         "cache_fractions", "lru_hit_rate", "lfu_hit_rate")})
stats_docs = st.fixed_dictionaries({"schema": st.sampled_from(["dlrm-scale/stats/v1", "v0"]),
                                    "tables": st.dictionaries(st.text(max_size=4), st.one_of(stats_table, values), max_size=3)})


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(stats_docs, values))
def test_stats_loader_gives_statistics_or_a_planner_error(tmp_path, doc):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(doc))
    try:
        load_stats(path)
    except PlannerError as e:
        assert "\n" not in str(e)
