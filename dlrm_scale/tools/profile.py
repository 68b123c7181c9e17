"""`dlrm-scale profile`: access statistics of every table from a sample of the training data.

A table-wise or column-wise shard serves every rank's ids, so the trace of a table is, per
step, the ids of all ranks' batches together: what its cache will see. The statistics
(planner.spec.access_stats) go to stats.json, which `dlrm-scale plan --stats` reads.
"""

from __future__ import annotations

import numpy as np

from dlrm_scale.training.criteo import criteo_data
from dlrm_scale.training.data import SyntheticData, feature_name
from planner.spec.access_stats import TableAccess, trace_access
from planner.spec.errors import ConfigError
from planner.spec.problem import PlanningProblem

MAX_BATCHES = 400  # the LFU replay costs O(batches^2) per table


def table_traces(problem: PlanningProblem, num_dense: int, batches: int, data_path: str | None = None,
                 seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Per table, the ids of each global step (all ranks' batches concatenated)."""
    world = problem.cluster.world_size
    b = problem.training.batch_size_per_rank
    if data_path is None:
        sources = [SyntheticData(problem.tables, num_dense, b * world, seed).batches(0, batches)]  # the whole global batch
    else:
        sources = [criteo_data(data_path, problem.tables, num_dense, b, r, world, "train").batches(0, batches) for r in range(world)]
    traces: dict[str, list[np.ndarray]] = {t.name: [] for t in problem.tables}
    for step_batches in zip(*sources):
        for t in problem.tables:
            traces[t.name].append(np.concatenate([batch.sparse_features[feature_name(t.name)].values().numpy()
                                                  for batch in step_batches]))
    return traces


def profile_access(problem: PlanningProblem, num_dense: int, batches: int, data_path: str | None = None,
                   seed: int = 0) -> dict[str, TableAccess]:
    if not 2 <= batches <= MAX_BATCHES:
        raise ConfigError(f"profile: --batches must be between 2 and {MAX_BATCHES}, got {batches}")
    traces = table_traces(problem, num_dense, batches, data_path, seed)
    found = min(len(v) for v in traces.values())
    if found < 2:
        raise ConfigError(f"profile: the data gave {found} full batches; give more data or a smaller --batch-size")
    global_batch = problem.training.batch_size_per_rank * problem.cluster.world_size
    return {t.name: trace_access(t.name, traces[t.name], t.num_embeddings, global_batch) for t in problem.tables}
