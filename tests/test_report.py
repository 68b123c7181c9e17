"""The plan's terminal table and plot say what a reader needs: where each table went, whole
rank numbers, a legend that covers no bar, and each tier's capacity."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from dlrm_scale.run_config import load_problem
from planner.plan.planning import make_plan
from planner.views.report import format_plan, plan_figure, rank_list


@pytest.fixture(scope="module")
def plan():
    return make_plan(load_problem("configs/tiny.yaml"))


def test_the_terminal_view_maps_every_table_to_its_ranks(plan):
    text = format_plan(plan)
    for name, t in plan.tables.items():
        assert any(line.startswith(name) and line.endswith(rank_list(t.ranks)) for line in text.splitlines()), name
    assert rank_list([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"


def test_the_plot_has_whole_rank_ticks_an_outside_legend_and_capacity_lines(plan):
    fig = plan_figure(plan, {"ddr": 3 * 2**30})
    top, memory = fig.axes
    fig.canvas.draw()
    ticks = [t for t in memory.get_xticks() if memory.get_xlim()[0] <= t <= memory.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    renderer = fig.canvas.get_renderer()
    for ax in (top, memory):
        assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # beside, not over
    capacity = [line for line in memory.get_lines() if line.get_label() == "ddr capacity"]
    assert capacity and capacity[0].get_ydata()[0] == pytest.approx(3.0)
    plt.close(fig)
