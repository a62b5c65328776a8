"""scripts/bench_successor's arithmetic: gap, waste and lateness of each hand-over, from starts and ends."""

from __future__ import annotations

import math
from types import ModuleType

from tests.support.scripts import load_script

import pytest

def _load() -> ModuleType:
    return load_script("bench_successor")


bench = _load()
# A job of 180 s started at 0 that left at 145; handover 80: its window opens at 100.
BEFORE = bench.Allocation(start=0.0, end=145.0, wall_s=180.0)


@pytest.mark.parametrize(("after_start", "gap", "waste", "late", "early"), [
    (100.0, 0.0, 0.0, 0.0, False),   # on time: both run from 100 to 145, the window's overlap
    (130.0, 0.0, 0.0, 30.0, False),  # late, yet before the end: 30 s of the window lost
    (175.0, 30.0, 0.0, 75.0, False),  # after the end: the site was out 30 s
    (95.0, 0.0, 5.0, 0.0, False),    # 5 s early: burnt, within the tolerance
    (20.0, 0.0, 80.0, 0.0, True),    # `after:` on a free queue: 80 s of a second allocation burnt
])
def test_a_boundary_is_measured_against_the_predecessors_end_and_window(
        after_start: float, gap: float, waste: float, late: float, early: bool) -> None:
    assert bench.boundary(BEFORE, after_start, 80.0, 10.0) == bench.Boundary(gap, waste, late, early)


def test_waste_stops_at_the_predecessors_end_when_it_ended_before_its_window() -> None:
    cut_short = bench.Allocation(start=0.0, end=50.0, wall_s=180.0)  # cancelled at 50
    assert bench.boundary(cut_short, 20.0, 80.0, 10.0).waste_s == 30.0  # both ran only 20..50


def test_a_chain_counts_hand_overs_up_to_the_first_not_complete() -> None:
    chain = [bench.Allocation(0.0, 145.0, 180.0), bench.Allocation(110.0, 255.0, 180.0),
             bench.Allocation(300.0, None, 180.0), bench.Allocation(None, None, 180.0)]
    got = bench.boundaries(chain, 80.0, 10.0)
    assert [(b.gap_s, b.late_s) for b in got] == [(0.0, 10.0), (45.0, 90.0)]


def test_the_summary_and_the_ratio_to_the_baseline() -> None:
    s = bench.summarize([bench.Boundary(0.0, 0.0, 10.0, False), bench.Boundary(30.0, 0.0, 70.0, False),
                         bench.Boundary(0.0, 60.0, 0.0, True)])
    assert (s.n, s.gap_median, s.gap_max, s.waste_max, s.late_median, s.early) == (3, 0.0, 30.0, 60.0, 10.0, 1)
    assert s.cost_mean == pytest.approx(30.0)
    assert bench.summarize([]).n == 0 and math.isnan(bench.summarize([]).gap_mean)
    assert (bench.ratio(30.0, 15.0), bench.ratio(0.0, 0.0), bench.ratio(1.0, 0.0)) == (2.0, 1.0, math.inf)
