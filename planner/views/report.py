"""Human-readable views of a plan: a terminal table and a per-rank stacked bar chart."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from planner.cost.step import rank_step_ms
from planner.plan.document import Plan
from planner.spec.specs import GIB
from planner.spec.types import TIERS


def format_plan(plan: Plan, max_rank_rows: int = 16, max_table_rows: int = 32) -> str:
    lines = []
    mix = Counter(t.sharding_type for t in plan.tables.values())
    lines.append(
        f"{len(plan.tables)} tables on {plan.world_size} ranks ({plan.ranks_per_node} per node), "
        f"cost model '{plan.cost_model}', solver '{plan.solver}' in {plan.solve_seconds:.2f}s"
    )
    lines.append("schemes: " + ", ".join(f"{k} {v}" for k, v in sorted(mix.items())))
    rep = plan.replication
    if rep is not None:  # 2D: the ranks below are one group's
        lines.append(f"2D sparse parallelism: the tables sharded over groups of {rep.group_size} ranks, {rep.replicas} replicas "
                     f"({rep.job_world_size} ranks) synced every {rep.sync_every_steps} steps: {rep.sync_ms:.4f} ms a sync, "
                     f"{rep.sync_ms_per_step:.4f} ms a step with the rows synced as replicas read them; the model is the 1D model")
    cached = {name: t for name, t in plan.tables.items() if t.cached}
    if cached:  # why a table is slower than it could be: its rows live in a slower tier
        kinds = Counter(f"{t.compute_kernel} ({t.shards[0].tier}, cache {t.cache_load_factor:g})" for t in cached.values())
        lines.append(f"cached tables {len(cached)}: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())))
    if plan.step is not None:  # what the search minimised, against its own bound
        lines.append(f"step {plan.step[0]:.4f} ms (each phase waits for its busiest rank, plus each sharding type's "
                     f"collectives), proven lower bound {plan.step[1]:.4f} ms, gap {100 * plan.step_gap:.2f}%")
        lines.append(f"busiest rank {plan.max_rank_ms:.4f} ms/step" + (", phases balanced" if "+phases" in plan.solver else ""))
    else:
        lines.append(f"busiest rank {plan.max_rank_ms:.4f} ms/step, lower bound {plan.lower_bound_ms:.4f} ms, gap {100 * plan.gap:.2f}%")
        lines.append(f"embedding step {rank_step_ms([r.perf for r in plan.ranks]):.4f} ms (each phase waits for its busiest rank)")
    header = f"{'rank':>5} {'total ms':>10} {'compute':>10} {'comms':>10} " + " ".join(f"{t + ' GiB':>9}" for t in TIERS)
    lines.append(header)
    ranks = sorted(plan.ranks, key=lambda r: -r.predicted_ms)[:max_rank_rows]
    for r in sorted(ranks, key=lambda r: r.rank):
        mem = " ".join(f"{r.memory.of_tier(t) / GIB:>9.3f}" for t in TIERS)
        lines.append(f"{r.rank:>5} {r.predicted_ms:>10.4f} {r.perf.compute_ms:>10.4f} {r.perf.comms_ms:>10.4f} {mem}")
    if len(plan.ranks) > max_rank_rows:
        lines.append(f"  ({len(plan.ranks) - max_rank_rows} lighter ranks not shown)")
    lines.append(f"{'table':<24} {'scheme':<18} {'kernel':<18} ranks")
    for name, t in list(plan.tables.items())[:max_table_rows]:
        lines.append(f"{name[:24]:<24} {t.sharding_type:<18} {t.compute_kernel:<18} {rank_list(t.ranks)}")
    if len(plan.tables) > max_table_rows:
        lines.append(f"  ({len(plan.tables) - max_table_rows} more tables in the plan file)")
    return "\n".join(lines)


def rank_list(ranks: list[int]) -> str:
    """Ranks as runs: [0, 1, 2, 3, 6] -> '0-3,6'."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def plot_plan(plan: Plan, path: str | Path, capacity_bytes: dict[str, int] | None = None) -> None:
    import matplotlib.pyplot as plt

    fig = plan_figure(plan, capacity_bytes)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def plan_figure(plan: Plan, capacity_bytes: dict[str, int] | None = None):
    """Per-rank stacked bars: compute and comms time (top), bytes per tier (bottom) against
    each tier's capacity per rank (`capacity_bytes`, dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ranks = [r.rank for r in plan.ranks]
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(max(6, 0.25 * len(ranks)) + 1.5, 6), sharex=True)
    bottom = [0.0] * len(ranks)
    for label, values in (
        ("fwd compute", [r.perf.fwd_compute_ms for r in plan.ranks]),
        ("bwd compute", [r.perf.bwd_compute_ms for r in plan.ranks]),
        ("input dist", [r.perf.input_dist_ms for r in plan.ranks]),
        ("fwd comms", [r.perf.fwd_comms_ms for r in plan.ranks]),
        ("bwd comms", [r.perf.bwd_comms_ms for r in plan.ranks]),
    ):
        ax_t.bar(ranks, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax_t.axhline(plan.lower_bound_ms, color="k", linestyle="--", linewidth=1, label="lower bound")
    ax_t.set_ylabel("ms / step")
    ax_t.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    ax_t.set_title(f"{len(plan.tables)} tables, {plan.world_size} ranks, gap {100 * (plan.gap if plan.step is None else plan.step_gap):.2f}%")
    bottom = [0.0] * len(ranks)
    for tier in TIERS:
        values = [r.memory.of_tier(tier) / GIB for r in plan.ranks]
        if any(values):
            bars = ax_m.bar(ranks, values, bottom=bottom, label=tier)
            bottom = [b + v for b, v in zip(bottom, values)]
            capacity = (capacity_bytes or {}).get(tier)
            if capacity:
                ax_m.axhline(capacity / GIB, color=bars.patches[0].get_facecolor(), linestyle="--", linewidth=1,
                             label=f"{tier} capacity")
    ax_m.set_ylabel("GiB")
    ax_m.set_xlabel("rank")
    ax_m.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
