"""`ops autopilot` keeps a run going across allocations (issue 35): real peers, the real Slurm the
tests start, and the loop as a real process (tests/integration/autopilot_mesh.py). Site a is a
direct site; site b lives only in 3-minute Slurm jobs the loop queues, each successor with
`--begin` before its predecessor's end. Four allocation boundaries are crossed, every one handed
over (the successor trained a committed round beside its predecessor, which then left at Slurm's
SIGTERM before its wall time); the commit log has every round once, every data epoch that ended
is audited with none duplicated or lost, and every round's θ is the same on every member that
applied it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.autopilot_mesh import AutopilotMesh
from tests.integration.peers import wait_for
from tests.integration.slurm_cluster import SlurmCluster, slurm_fixture, slurm_session_fixture  # noqa: F401

BOUNDARIES = 4


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_the_loop_hands_a_site_over_across_four_allocations(slurm: SlurmCluster, tmp_path: Path) -> None:
    mesh = AutopilotMesh.start(tmp_path, slurm)
    try:
        def handed_over() -> bool:
            dropped = mesh.dropped("b")
            assert not dropped, f"jobs {dropped} of b ended without a handover: {mesh.jobs('b')}\n{mesh.decisions()}"
            return len(mesh.handovers("b")) >= BOUNDARIES

        wait_for(handed_over, 540, f"{BOUNDARIES} handovers", interval_s=2)
        mesh.stop_loop()
        jobs = mesh.jobs("b")
        assert jobs[BOUNDARIES + 1].state == "RUNNING", jobs
        assert mesh.handovers("b")[:BOUNDARIES] == list(range(1, BOUNDARIES + 1)), mesh.decisions()
        # Every job was the loop's, each successor queued while its predecessor ran, none twice.
        submitted = [d for d in mesh.decisions() if ": submitted " in d]
        assert [d.split()[2] for d in submitted] == [f"sitemesh-soak-b-{n}" for n in sorted(jobs)], submitted
        assert all("its successor may start from" in d for d in submitted[1:]), submitted
        rounds = mesh.commits()
        assert [c.round for c in rounds] == list(range(1, len(rounds) + 1)), "every round committed once"
        # The data: every epoch that ended, none duplicated or lost.
        epochs = [e for e in mesh.audit() if e["ended"]]
        assert len(epochs) >= 2, epochs
        assert [(e["epoch"], e["duplicated"], e["lost"]) for e in epochs] == [(e["epoch"], 0, 0) for e in epochs]
        # θ: the same after every round on every member that applied it, and every job handed over
        # from or to (the live one, b.j5, included) applied rounds with a.
        thetas = mesh.thetas()
        for member, applied in thetas.items():
            assert all(thetas["a"].get(r, h) == h for r, h in applied.items()), member
        for n in range(1, BOUNDARIES + 2):
            assert set(thetas[f"b.j{n}"]) & set(thetas["a"]), f"b.j{n} and a applied no round in common"
    finally:
        mesh.close()
