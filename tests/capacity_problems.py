"""Random planning problems for the capacity property (tests/test_capacity.py) and its
benchmark (benchmarks/capacity_bench.py), and the check both apply to what the planner says.

Memory is drawn relative to what the tables need, from far too little to plenty, so most
problems sit where tiers bind; the solver's size thresholds are drawn too, so the class model,
the joint model and the placement repair each get problems of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from planner.spec.config import build_cluster, cluster_fields, hardware_path, read_yaml
from planner.cost.cost_model import cache_index_bytes, shard_storage_bytes, slow_tier_bytes
from planner.spec.schemes import cache_rows
from planner.spec.config import constrain
from planner.spec.errors import ConfigError, PlannerError
from planner.plan.document import Plan
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from planner.spec.specs import GIB, TableSpec, TieringSpec, TrainingSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import TIERS, ShardingType

PROFILES = {"cpu": "cpu_gloo", "cuda": "a100_zionex"}
SOLVER_PATHS = {  # (class_model_max_variables, joint_model_max_booleans)
    "default": (50_000, 20_000),
    "joint": (0, 20_000),
    "repair": (0, 0),
}


@dataclass(frozen=True)
class Case:
    problem: PlanningProblem
    solver: SolverConfig


@st.composite
def cases(draw) -> Case:
    device = draw(st.sampled_from(sorted(PROFILES)))
    local = draw(st.integers(1, 4))
    nodes = draw(st.integers(1, 2))
    def shape() -> tuple:
        return int(10 ** draw(st.floats(2, 6.7))), 4 * draw(st.integers(1, 64)), draw(st.floats(1, 50)), draw(st.floats(0.8, 1.2))

    count = draw(st.integers(1, 8))
    alike = draw(st.booleans())  # models often repeat one table shape (and tie every option's cost)
    shapes = [shape()] * count if alike else [shape() for _ in range(count)]
    tables = tuple(TableSpec(f"t{i}", *s) for i, s in enumerate(shapes))
    training = TrainingSpec(draw(st.sampled_from([64, 512, 2048])), draw(st.sampled_from(["rowwise_adagrad", "sgd", "adam"])))
    samples = training.batch_size_per_rank * local * nodes
    need = sum(shard_storage_bytes(t.num_embeddings, t.embedding_dim, training.embedding_optimizer, samples) for t in tables)
    per_rank = max(1, int(need / (local * nodes) * 10 ** draw(st.floats(-0.7, 0.5))))  # the device tier's share
    ssd_per_node = draw(st.sampled_from([0, 4 * need, 4 * need, 4 * need]))
    profile = cluster_fields(read_yaml(hardware_path(PROFILES[device]), "profile"), "profile")
    sizes = {"num_nodes": nodes, "ranks_per_node": local, "ssd_bytes_per_node": ssd_per_node}
    if device == "cuda":
        sizes |= {"hbm_bytes_per_rank": per_rank, "ddr_bytes_per_node": int(per_rank * local * draw(st.floats(0, 8)))}
    else:
        sizes |= {"ddr_bytes_per_node": per_rank * local}
    tiering = TieringSpec(
        enabled=draw(st.sampled_from([False, True, True, True])),
        load_factors=tuple(sorted(set(draw(st.lists(st.sampled_from([0.05, 0.1, 0.25, 0.5]), min_size=1, max_size=3))))),
    )
    class_max, joint_max = SOLVER_PATHS[draw(st.sampled_from(sorted(SOLVER_PATHS)))]
    solver = SolverConfig(time_limit_s=0.5, class_model_max_variables=class_max, joint_model_max_booleans=joint_max)
    problem = PlanningProblem(tables, build_cluster(profile, sizes), training, tiering, {})
    if draw(st.integers(0, 3)) == 0:  # a user's constraints: rules on some tables, groups, a memory reserve
        device_tier = problem.cluster.device_tier
        rules = [{"match": draw(st.sampled_from(["t0", "t*", "t1*"])) if count > 1 else "t0",
                  "schemes": draw(st.lists(st.sampled_from([s.value for s in ShardingType]), min_size=1, max_size=4, unique=True)),
                  "max_shards": draw(st.sampled_from([1, 2, 8]))}]
        world = nodes * local
        if draw(st.booleans()):  # a pin
            rules.append({"match": draw(st.sampled_from(["t0", "t1*"])) if count > 1 else "t0",
                          "ranks": sorted(draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=world)))})
        section = {"tables": rules, "reserve_gib_per_rank": {device_tier: per_rank * draw(st.sampled_from([0.0, 0.1, 0.4])) / GIB}}
        if count > 2 and draw(st.booleans()):
            section["colocate" if draw(st.booleans()) else "apart"] = [["t0", "t2"]]
        try:
            problem = constrain(problem, section)
        except ConfigError:
            pass  # a reserve past the tier, a rule matching no table (one-line refusals too); plan unconstrained
    return Case(problem, solver)


def broken_rule(plan: Plan, problem: PlanningProblem) -> str | None:
    """The first table whose layout or place a constraint forbids, in words; None when every rule holds."""
    constraints = problem.constraints
    for rule in constraints.rules if constraints else ():
        for name, t in plan.tables.items():
            if rule.applies_to(name) and ((rule.schemes and t.sharding_type not in rule.schemes)
                                          or (rule.max_shards and len(t.shards) > rule.max_shards)
                                          or (rule.ranks is not None and not set(t.ranks) <= rule.ranks)):
                return f"table {name} is {t.sharding_type} x{len(t.shards)} on {t.ranks} against {rule.describe()}"
    for group in constraints.colocate if constraints else ():
        places = {tuple(plan.tables[n].ranks) for n in group.tables}
        if len(places) != 1 or len(places.pop()) != 1:
            return f"{group.describe()} has its tables on {[plan.tables[n].ranks for n in group.tables]}"
    for group in constraints.apart if constraints else ():
        held = [set(plan.tables[n].ranks) for n in group.tables]
        if any(a & b for i, a in enumerate(held) for b in held[i + 1:]):
            return f"{group.describe()} has its tables on {[plan.tables[n].ranks for n in group.tables]}"
    return None


def plan_bytes_per_rank(plan: Plan, problem: PlanningProblem) -> np.ndarray:
    """Bytes per rank and tier recomputed from the plan's shards alone (not from the
    solver's accounting): rows, or a cache's rows, and the output buffers where the shard
    computes (a cache's index too), and a cached shard's rows in its backing tier."""
    cluster, training = problem.cluster, problem.training
    out = np.zeros((cluster.world_size, len(TIERS)), dtype=np.int64)
    device = TIERS.index(cluster.device_tier)
    optimizer = training.embedding_optimizer
    for table in plan.tables.values():
        samples = training.batch_size_per_rank * (1 if table.sharding_type == "data_parallel" else cluster.world_size)
        for s in table.shards:
            resident = cache_rows(s.rows, table.cache_load_factor) if table.cached else s.rows
            out[s.rank, device] += shard_storage_bytes(resident, s.cols, optimizer, samples)
            if table.cached:
                out[s.rank, device] += cache_index_bytes(s.rows, resident, problem.tiering.policy, s.tier, cluster.device)
                out[s.rank, TIERS.index(s.tier)] += slow_tier_bytes(s.rows, s.cols, optimizer, s.tier, cluster.device)
    return out


def plan_or_refusal(case: Case) -> Plan | PlannerError:
    """What `dlrm-scale plan` would end with: a plan, or a user-facing one-line refusal."""
    try:
        return make_plan(case.problem, config=case.solver)
    except PlannerError as e:
        return e


def overfilled(plan: Plan, problem: PlanningProblem) -> str | None:
    """The first rank and tier the plan overfills, in words; None when every tier holds."""
    caps = np.array([problem.cluster.capacity_bytes_per_rank(t) for t in TIERS], dtype=np.int64)
    used = plan_bytes_per_rank(plan, problem)
    for rank, tier in zip(*np.nonzero(used > caps)):
        return f"rank {rank} {TIERS[tier]}: {used[rank, tier]:,} > {caps[tier]:,} bytes"
    return None
