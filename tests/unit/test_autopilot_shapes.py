"""The operator loop's choice of node count from Slurm's predictions (ops/autopilot/shapes.py)."""

from __future__ import annotations

from ops.autopilot.shapes import ShapeOption, choose
from ops.placement.config import JobShape

HOUR = 3600.0
NOW = 1_800_000_000.0


def _shape(nodes: int) -> JobShape:
    return JobShape(nodes=nodes, time_s=int(2 * HOUR))


def _option(nodes: int, start_in_s: float | None, refused: str = "") -> ShapeOption:
    return ShapeOption(_shape(nodes), None if start_in_s is None else NOW + start_in_s, 1000.0 * nodes, refused)


def test_a_shape_that_starts_by_the_handover_beats_a_larger_one_that_leaves_the_site_out() -> None:
    # The successor may begin in 10 minutes: 4 nodes start by then; 8 nodes only 90 minutes later.
    got = choose([_option(4, 5 * 60), _option(8, 100 * 60)], _shape(4), NOW, NOW + 10 * 60)
    assert got.shape.nodes == 4 and got.start == NOW + 5 * 60
    assert got.reason.startswith("4 nodes: predicted start") and "(when it may begin)" in got.reason
    assert "8 nodes" in got.reason and "5400 s after it may begin" in got.reason


def test_a_larger_shape_that_starts_a_little_late_trains_more() -> None:
    # 8 nodes 10 minutes late: 8000 x 6600 s > 4000 x 7200 s.
    got = choose([_option(4, 0), _option(8, 10 * 60)], _shape(4), NOW, None)
    assert got.shape.nodes == 8


def test_equal_tokens_go_to_fewer_nodes() -> None:
    # 2 nodes at once: 2000 x 7200; 4 nodes an hour late: 4000 x 3600. Same tokens, half the nodes.
    got = choose([_option(4, HOUR), _option(2, 0)], _shape(4), NOW, None)
    assert got.shape.nodes == 2


def test_refused_shapes_are_never_chosen_and_are_named() -> None:
    got = choose([_option(1, 30), _option(2, None, "Requested node configuration is not available")],
                  _shape(1), NOW, None)
    assert got.shape.nodes == 1
    assert "2 nodes refused (Requested node configuration is not available)" in got.reason


def test_when_no_probe_answers_the_configured_shape_is_taken() -> None:
    got = choose([_option(2, None, "sbatch timed out"), _option(4, None, "sbatch timed out")], _shape(4), NOW, None)
    assert got.shape.nodes == 4 and got.start is None
    assert got.reason == "4 nodes (configured): no probe answered (2 nodes: sbatch timed out; 4 nodes: sbatch timed out)"
