"""Time-to-target arithmetic and the placement planner (pure: hand-computed expectations)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.placement.config import JobShape
from ops.placement.plan import Option, after, evaluate, make_plan, node_seconds
from ops.placement.timeline import Counting, Segment, periodic_segments, time_to_target

H = 3600.0


@pytest.mark.parametrize(
    ("counting", "target", "expected"),
    [
        # Site a runs 0-10 at 1/s, site b 5-20 at 2/s.
        (Counting.ELASTIC, 5.0, 5.0),  # a alone
        (Counting.ELASTIC, 20.0, 10.0),  # 5 alone, then 15 at 3/s
        (Counting.ELASTIC, 30.0, 15.0),  # 20 by t=10, then b alone
        (Counting.ELASTIC, 41.0, math.inf),  # 10 + 30 tokens is all there is
        (Counting.GANG, 15.0, 10.0),  # only 5-10 counts, at 3/s
        (Counting.GANG, 16.0, math.inf),
        (Counting.AFTER_ALL, 15.0, 10.0),  # from t=5 on
        (Counting.AFTER_ALL, 25.0, 15.0),  # 15 by t=10, then b alone at 2/s
        (Counting.ELASTIC, 0.0, 0.0),
    ],
)
def test_time_to_target(counting: Counting, target: float, expected: float) -> None:
    sites = [[Segment(0, 10, 1.0)], [Segment(5, 20, 2.0)]]
    assert time_to_target(sites, target, counting) == pytest.approx(expected)


def test_after_all_needs_every_site_at_once() -> None:
    # a's first job ends before b starts: the run only starts with a's second job at 12.
    sites = [[Segment(0, 4, 1.0), Segment(12, 30, 1.0)], [Segment(6, 30, 1.0)]]
    assert time_to_target(sites, 4.0, Counting.AFTER_ALL) == pytest.approx(14.0)
    assert time_to_target(sites, 4.0, Counting.ELASTIC) == pytest.approx(4.0)


def test_periodic_segments_resubmit_after_each_wait() -> None:
    segs = periodic_segments(1.0, 3.0, walltime_s=2.0, wait_s=1.0, tokens_per_s=5.0, horizon_s=10.0)
    assert [(s.start_s, s.end_s) for s in segs] == [(1, 3), (4, 6), (7, 9)]  # the next would start at 10


def _opt(site: str, nodes: int, start_h: float, rate: float, hours: float = 24.0, **kw: object) -> Option:
    shape = JobShape(nodes=nodes, time_s=int(hours * H))
    return Option(site, shape, start_h * H, rate, start_h * H, **kw)  # type: ignore[arg-type]


def test_small_shape_now_beats_big_shape_later() -> None:
    # 100 tokens/s-hours: 1 node now reaches 100 units at 10 h; 4 nodes after 8 h reach it at 10.5 h.
    small, big = _opt("a", 1, 0, 10 / H), _opt("a", 4, 8, 40 / H)
    plan = make_plan({"a": [small, big]}, {"a": big}, 100.0)
    [d] = plan.decisions
    assert d.submit and d.option is small
    assert plan.time_to_target_s == pytest.approx(10 * H)
    assert plan.start_with_any_s == pytest.approx(10.5 * H)
    assert d.reason == "1 node from +0s: target +10h00m; instead of 4 nodes (start +8h00m) -> target +10h30m"


def test_site_starting_after_the_target_is_not_asked() -> None:
    fast, late = _opt("fast", 1, 0, 1.0), _opt("late", 1, 30, 1.0)
    plan = make_plan({"fast": [fast], "late": [late]}, {"fast": fast, "late": late}, 10 * H)
    d = {x.site: x for x in plan.decisions}
    assert d["fast"].submit and not d["late"].submit
    assert d["late"].reason == "predicted start +30h00m is after the target is reached (+10h00m)"
    # Waiting for both: the late site's start, then 2/s.
    assert plan.wait_for_all_s == pytest.approx(30 * H + 10 * H / 2)
    assert plan.training_starts_s == 0
    # The fast site's 24 h job covers the 10 h to the target; the late one is not expected to run.
    runs = {x["site"]: x["expected_runs_s"] for x in plan.to_json()["sites"]}
    assert runs == {"fast": [[0.0, 10 * H]], "late": []}


def test_expected_runs_include_resubmissions() -> None:
    # 2 h jobs, 1 h wait before each: runs 1-3, 4-6, 7-9 h; 6 h of training at 1/s reach 6 h * 1/s at 9 h.
    opt = _opt("a", 1, 1, 1.0, hours=2)
    plan = make_plan({"a": [opt]}, {"a": opt}, 6 * H)
    assert plan.time_to_target_s == pytest.approx(9 * H)
    assert plan.to_json()["sites"][0]["expected_runs_s"] == [[H, 3 * H], [4 * H, 6 * H], [7 * H, 9 * H]]


def test_ties_go_to_fewer_node_hours() -> None:
    # Same time-to-target either way (the second site adds nothing before 1 h); fewer nodes win.
    a = _opt("a", 1, 0, 1.0)
    b_small, b_big = _opt("b", 1, 2, 1.0), _opt("b", 8, 2, 8.0)
    plan = make_plan({"a": [a], "b": [b_big, b_small]}, {"a": a, "b": b_big}, 1 * H)
    assert plan.time_to_target_s == pytest.approx(H)
    assert {d.site: d.submit for d in plan.decisions} == {"a": True, "b": False}
    assert node_seconds([a, b_small], H) == pytest.approx(H)


def test_unknown_throughput_and_existing_jobs_are_not_submitted() -> None:
    running = _opt("a", 2, 0, 1.0, first_end_s=5 * H, existing_job="42")
    unknown = _opt("b", 2, 0, 0.0)
    plan = make_plan({"a": [running], "b": [unknown]}, {"a": running, "b": unknown}, 2 * H)
    d = {x.site: x for x in plan.decisions}
    assert not d["a"].submit and d["a"].reason.startswith("job 42 already submitted")
    assert not d["b"].submit and "no throughput known" in d["b"].reason
    assert plan.time_to_target_s == pytest.approx(2 * H)
    assert plan.to_json()["sites"][0]["existing_job"] == "42"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "+0s"),
        (89.4, "+89s"),
        (90, "+2m"),
        (5399, "+90m"),
        (5400, "+1h30m"),
        (47 * H + 59 * 60, "+47h59m"),
        (48 * H, "+2d00h"),
        (100 * H, "+4d04h"),
        (math.inf, "never"),
    ],
)
def test_durations_for_people(seconds: float, text: str) -> None:
    assert after(seconds) == text


def test_no_throughput_anywhere_means_never() -> None:
    unknown = _opt("b", 2, 0, 0.0)
    plan = make_plan({"b": [unknown]}, {"b": unknown}, 1.0)
    assert math.isinf(plan.time_to_target_s) and plan.to_json()["time_to_target_s"] is None


def test_too_many_combinations_is_an_error() -> None:
    opts = {s: [_opt(s, n, 0, 1.0) for n in range(1, 6)] for s in "abcdefg"}
    with pytest.raises(ValueError, match="78125 shape combinations"):
        make_plan(opts, {s: o[0] for s, o in opts.items()}, 1.0)


sites_st = st.lists(st.tuples(st.floats(0, 50), st.floats(1, 48), st.floats(1, 10)), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(sites=sites_st, target=st.floats(1, 100))
def test_elastic_never_later_than_after_all_never_later_than_gang(
    sites: list[tuple[float, float, float]], target: float
) -> None:
    opts = [_opt(f"s{i}", 1, start, rate / H, hours=wall) for i, (start, wall, rate) in enumerate(sites)]
    elastic, after_all, gang = (evaluate(opts, target, c) for c in Counting)
    assert elastic <= after_all * (1 + 1e-9) and after_all <= gang * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(
    sites=st.lists(st.tuples(st.floats(0, 20), st.floats(0, 20)), min_size=1, max_size=3),
    target=st.floats(1, 200),
)
def test_plan_is_never_worse_than_the_configured_shapes(
    sites: list[tuple[float, float]], target: float
) -> None:
    candidates, defaults = {}, {}
    for i, (big_start, small_start) in enumerate(sites):
        big, small = _opt(f"s{i}", 4, big_start, 4 / H), _opt(f"s{i}", 1, small_start, 1 / H)
        candidates[f"s{i}"], defaults[f"s{i}"] = [small, big], big
    plan = make_plan(candidates, defaults, target)
    assert plan.time_to_target_s <= plan.start_with_any_s * (1 + 1e-3)
    assert plan.start_with_any_s <= plan.wait_for_all_s * (1 + 1e-9)
