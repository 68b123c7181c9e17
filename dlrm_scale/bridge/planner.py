"""dlrm-scale's planner behind TorchRec's `ShardingPlanner` interface: the one-line swap.

    from dlrm_scale import EmbeddingShardingPlanner      # was: from torchrec.distributed.planner import ...
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=512, constraints=constraints)
    plan = planner.collective_plan(model, sharders, pg)
    model = DistributedModelParallel(model, plan=plan, sharders=sharders, ...)

It reads the module's tables as TorchRec's enumerator does (bridge.module_tables), the
Topology and ParameterConstraints as our specs (bridge.topology, bridge.parameter_constraints),
plans them as `dlrm-scale plan` would the same config (planner.api), and keeps the plan:
`planner.last_plan` (bound, gap, per-rank breakdown), `save()` and `save_config()` for
`dlrm-scale explain`, `diff` and `plan --from`.

`collective_plan` plans on rank 0 and sends the plan as plan/v1 JSON (nothing is unpickled);
every rank checks it against its own inputs' digest, and an error on rank 0 is raised on every
rank with its line, so no rank waits for a plan that never comes.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist
import yaml
from torch import nn
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import EmbeddingModuleShardingPlan, ModuleSharder, ShardingPlan, ShardingPlanner

from dlrm_scale.bridge.broadcast import broadcast_text
from dlrm_scale.bridge.module_tables import ModuleTable, embedding_optimizer, module_tables
from dlrm_scale.bridge.parameter_constraints import comm_precisions, runtime_fields, table_rule, table_spec, tiering_section
from dlrm_scale.bridge.sharding_plan import parameter_sharding
from dlrm_scale.bridge.topology import DEFAULT_PROFILE, cluster_settings
from planner.api import WHERE, config_document
from planner.plan.document import Plan, check_plan_inputs
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from planner.spec import errors
from planner.spec.config import cluster_fields, hardware_path, problem_from_doc, read_yaml
from planner.spec.errors import ConfigError, PlannerError
from planner.spec.problem import PlanningProblem
from planner.spec.specs import TrainingSpec

DEFAULT_EMBEDDING_OPTIMIZER = TrainingSpec().embedding_optimizer  # where neither the module nor the caller says


class EmbeddingShardingPlanner(ShardingPlanner):
    """TorchRec's `EmbeddingShardingPlanner` arguments (`topology`, `batch_size`, `constraints`),
    and ours:

    hardware: the profile whose fitted costs price the plan (a name or a .yaml path; default
        a100_zionex on CUDA, cpu_gloo on CPU); the Topology gives the shape and capacities.
    placement: the config's `constraints:` section (co-location, keep-apart, pins, per-rank
        reserves), as a dictionary.
    stats: access statistics of `dlrm-scale profile` (a stats.json path).
    time_limit_s, gap, seed: the search's (`dlrm-scale plan --time-limit --gap`).
    embedding_optimizer: where neither apply_optimizer_in_backward nor the sharders' fused
        params say it (it sizes the optimizer state).
    """

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        constraints: Mapping[str, ParameterConstraints] | None = None,
        *,
        hardware: str | None = None,
        placement: Mapping[str, Any] | None = None,
        stats: str | Path | None = None,
        time_limit_s: float = 10.0,
        gap: float = SolverConfig.target_gap,
        seed: int = 0,
        embedding_optimizer: str | None = None,
    ) -> None:
        self.topology = topology
        self.batch_size = batch_size or BATCH_SIZE
        self.constraints = dict(constraints or {})
        self.hardware = hardware
        self.placement = placement
        self.stats = stats
        self.solver = SolverConfig(time_limit_s=time_limit_s, target_gap=gap, seed=seed)
        self.embedding_optimizer = embedding_optimizer
        self.last_plan: Plan | None = None
        self.last_config: dict[str, Any] | None = None  # the config `dlrm-scale plan` makes last_plan from

    # ---- TorchRec's interface --------------------------------------------------------------
    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> ShardingPlan:
        problem, tables = self.problem(module, sharders)
        self.last_plan = make_plan(problem, config=self.solver)
        return self._sharding_plan(tables, problem.cluster.device)

    def collective_plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]] | None = None,
                        pg: dist.ProcessGroup | None = None) -> ShardingPlan:
        """Plans on rank 0 of `pg` (default: the world) and sends every rank its plan."""
        if pg is None:
            if not dist.is_initialized():
                raise ConfigError("collective_plan needs torch.distributed.init_process_group() first; on one process use plan()")
            pg = dist.GroupMember.WORLD
        sharders = get_default_sharders() if sharders is None else sharders
        message = None
        if pg.rank() == 0:
            try:
                problem, tables = self.problem(module, sharders, pg.size())
                message = {"plan": make_plan(problem, config=self.solver).to_dict()}
            except PlannerError as e:
                message = {"error": str(e), "kind": type(e).__name__}
            except Exception as e:  # not the user's: the others must not wait for it either
                broadcast_text(pg, json.dumps({"error": f"rank 0 failed to plan: {type(e).__name__}: {e}", "kind": "RuntimeError"}))
                raise
        message = json.loads(broadcast_text(pg, json.dumps(message) if message is not None else None))
        if "error" in message:
            raise getattr(errors, message["kind"], RuntimeError)(message["error"])
        plan = Plan.from_dict(message["plan"], "rank 0's plan")
        if pg.rank() != 0:
            problem, tables = self.problem(module, sharders, pg.size())
            check_plan_inputs(plan, problem, "rank 0's plan", "give every rank the same model, sharders and planner arguments")
        self.last_plan = plan
        return self._sharding_plan(tables, problem.cluster.device)

    # ---- ours ------------------------------------------------------------------------------
    def problem(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]],
                world_size: int | None = None) -> tuple[PlanningProblem, list[ModuleTable]]:
        """What `plan` solves, and the module's tables; every refusal is raised here."""
        topology = self.topology or default_topology(world_size)
        if world_size is not None and topology.world_size != world_size:
            raise ConfigError(f"topology: world_size {topology.world_size} but the process group has {world_size} ranks; give it {world_size}")
        device = topology.compute_device
        settings = cluster_settings(topology)
        tables = module_tables(module, sharders, device)
        names = {t.name for t in tables}
        unknown = sorted(set(self.constraints) - names)
        if unknown:
            raise ConfigError(f"constraints['{unknown[0]}']: the module has no table of that name; its tables: {', '.join(sorted(names)[:8])}")
        hardware = self.hardware or DEFAULT_PROFILE[device]
        profile_device = cluster_fields(read_yaml(hardware_path(hardware), "hardware profile"), f"hardware profile {hardware}").get("device")
        if profile_device != device:
            raise ConfigError(f"hardware profile '{hardware}' prices a {profile_device} cluster but the topology's compute_device is "
                              f"{device}; name a {device} profile")
        fwd, bwd = comm_precisions(list({id(t.sharder): t.sharder for t in tables}.values()))
        rules = [r for t in tables if (r := table_rule(t, self.constraints.get(t.name), device)) is not None]
        self.last_config = config_document(
            [table_spec(t, self.constraints.get(t.name), self.batch_size) for t in tables], hardware,
            cluster=settings, batch_size_per_rank=self.batch_size,
            training={"embedding_optimizer": self._optimizer(tables), "fwd_comm_precision": fwd, "bwd_comm_precision": bwd},
            tiering=tiering_section(self.constraints), constraints=_merged(rules, self.placement),
        )
        problem = problem_from_doc(self.last_config, WHERE, Path.cwd(), stats_path=self.stats)
        return problem, tables

    def save(self, path: str | Path) -> None:
        """The last plan as plan/v1 JSON (`dlrm-scale explain PATH --config`, `diff`, `plan --from`)."""
        if self.last_plan is None:
            raise ConfigError("nothing planned yet: call plan() or collective_plan() before save()")
        self.last_plan.save(path)

    def save_config(self, path: str | Path) -> None:
        """The config `dlrm-scale plan` plans the last module from: tables, cluster, training,
        tiering and constraints as this planner read them."""
        if self.last_config is None:
            raise ConfigError("nothing planned yet: call plan() or collective_plan() before save_config()")
        Path(path).write_text(yaml.safe_dump(self.last_config, sort_keys=False))

    def _optimizer(self, tables: list[ModuleTable]) -> str:
        found = embedding_optimizer(tables)
        if found is not None and self.embedding_optimizer is not None and found != self.embedding_optimizer:
            raise ConfigError(f"embedding_optimizer={self.embedding_optimizer!r} but the tables train with {found}; drop the argument")
        return found or self.embedding_optimizer or DEFAULT_EMBEDDING_OPTIMIZER

    def _sharding_plan(self, tables: list[ModuleTable], device: str) -> ShardingPlan:
        plan = self.last_plan
        per_module: dict[str, dict] = {}
        for t in tables:
            table = plan.tables[t.name]
            sharding = parameter_sharding(table, device, plan.ranks_per_node)
            given = runtime_fields(self.constraints.get(t.name))
            if table.cached and "cache_params" in given:  # the user's cache settings, at the plan's load factor
                given["cache_params"] = replace(given["cache_params"], load_factor=table.cache_load_factor)
            per_module.setdefault(t.path, {})[t.name] = replace(sharding, **given)
        return ShardingPlan({path: EmbeddingModuleShardingPlan(p) for path, p in per_module.items()})


def _merged(rules: list[dict[str, Any]], placement: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The config's `constraints:` section: the sharders' and ParameterConstraints' rules, then the caller's."""
    section = dict(placement or {})
    if rules:
        given = section.get("tables", [])
        if not isinstance(given, list):
            raise ConfigError("placement['tables'] must be a list of rules, as a config's constraints: tables: holds")
        section["tables"] = rules + given
    return section or None


def default_topology(world_size: int | None) -> Topology:
    """TorchRec's own default: the process group's ranks, LOCAL_WORLD_SIZE of them per host, on
    the GPU when there is one."""
    if world_size is None:
        if not dist.is_initialized():
            raise ConfigError("no topology: give topology=Topology(world_size=..., compute_device=...), or plan after "
                              "init_process_group()")
        world_size = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return Topology(world_size=world_size, local_world_size=local, compute_device="cuda" if torch.cuda.is_available() else "cpu")
