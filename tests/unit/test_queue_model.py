"""The queue-model simulator: exact small cases, invariants per trial, and the CLI's last line."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest

from ops.placement import queue_model as qm
from ops.placement.queue_model import Scenario, ShapeQueue, SiteModel
from ops.placement.timeline import Counting

REPO = Path(__file__).resolve().parents[2]
H = qm.HOUR


def _one_site(trace_h: tuple[float, ...], walltime_h: float = 10.0) -> Scenario:
    return Scenario(
        sites=(SiteModel("a", 100.0, 1, walltime_h, (ShapeQueue(1, 0.0, trace_h=trace_h),)),),
        target_tokens=100.0 * 15 * H,
    )


def test_single_site_with_a_recorded_trace_is_exact() -> None:
    # Waits are always 1 h; 15 h of training at 10 h per job: 1 + 10 + 1 + 5 = 17 h.
    for name, (choose, counting) in qm.POLICIES.items():
        ttt, node_h = qm.simulate(_one_site((1.0,)), seed=3, choose=choose, counting=counting)
        assert ttt == pytest.approx(17 * H), name
        assert node_h == pytest.approx(15.0), name


def test_no_queue_means_no_difference() -> None:
    results = qm.run(Scenario.three_sites().scaled(0.0), trials=3, seed=0)
    full_pool_h = 1.5e11 / (640_000 + 768_000 + 768_000) / H
    for r in results:
        assert r.hours == pytest.approx((full_pool_h,) * 3), r.policy
    assert qm.reduction(results) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_policies_meet_the_same_queue(seed: int) -> None:
    # Same submissions, looser counting rules: never later (common random numbers).
    sc = Scenario.three_sites()
    gang, wait_all, any_ = (
        qm.simulate(sc, seed, qm.naive, c)[0] for c in (Counting.GANG, Counting.AFTER_ALL, Counting.ELASTIC)
    )
    assert any_ <= wait_all <= gang
    assert qm.Queue(sc, seed).wait_s(1, 2, 0) == qm.Queue(sc, seed).wait_s(1, 2, 0)


def test_queue_aware_beats_naive_on_average_and_the_result_is_seeded() -> None:
    results = qm.run(Scenario.three_sites(), trials=40, seed=100)
    by = {r.policy: r.mean_h for r in results}
    assert by["queue-aware"] < by["start-with-any"] < by["wait-for-all"] < by["gang"]
    again = qm.run(Scenario.three_sites(), trials=40, seed=100)
    assert [r.hours for r in results] == [r.hours for r in again]


def test_perfect_predictions_help_more_than_bad_ones() -> None:
    sc = Scenario.three_sites()
    sharp = qm.run(Scenario(sc.sites, sc.target_tokens, prediction_sigma=0.0), trials=40, seed=0)
    blurred = qm.run(Scenario(sc.sites, sc.target_tokens, prediction_sigma=3.0), trials=40, seed=0)
    assert qm.reduction(sharp) > qm.reduction(blurred)


def test_scenario_validation() -> None:
    with pytest.raises(ValueError, match="must be its largest shape"):
        SiteModel("a", 1.0, 2, 1.0, (ShapeQueue(2, 1.0), ShapeQueue(4, 1.0)))
    with pytest.raises(ValueError):
        ShapeQueue(1, -1.0)
    with pytest.raises(ValueError):
        Scenario((), 1.0)


def test_scenario_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        "target_tokens = 3.6e5\nprediction_sigma = 0.0\n"
        '[[sites]]\nname = "x"\ntokens_per_s = 100.0\ndefault_nodes = 1\nwalltime_h = 2.0\n'
        "[[sites.shapes]]\nnodes = 1\ntrace_h = [0.5]\n"
    )
    sc = qm.load_scenario(path)
    assert qm.simulate(sc, 0, qm.naive, Counting.ELASTIC)[0] == pytest.approx(1.5 * H)
    path.write_text("target_tokens = 1\n")
    with pytest.raises(ValueError, match="not a queue-model scenario"):
        qm.load_scenario(path)


def test_script_prints_the_table_and_ends_with_the_reduction() -> None:
    out = subprocess.run(
        [str(REPO / "scripts/queue_model"), "--trials", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert out[1].split() == ["policy", "mean_h", "p10_h", "p50_h", "p90_h", "node_h", "vs_wait_for_all"]
    assert [line.split()[0] for line in out[2:6]] == ["gang", "wait-for-all", "start-with-any", "queue-aware"]
    m = re.fullmatch(r"reduction_vs_wait_for_all=(-?\d+\.\d)", out[-1])
    assert m and math.isclose(float(m.group(1)), -float(out[5].split()[-1].rstrip("%")), abs_tol=0.05)
