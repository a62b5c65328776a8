"""`ops autopilot` keeps a run going across allocations (issue 35): real peers, the real Slurm the
tests start, and the loop as a real process (tests/integration/autopilot_mesh.py). Three sites:
a is a direct site; b and c live only in 3-minute Slurm jobs the loop queues, each successor with
`--begin` before its predecessor's end. Four allocation boundaries are crossed, two at each job
site, every one handed over (the successor trained a committed round beside its predecessor, which then left at Slurm's
SIGTERM before its wall time); the commit log has every round once, every data epoch that ended
is audited with none duplicated or lost, and every round's θ is the same on every member that
applied it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.autopilot_mesh import AutopilotMesh
from tests.integration.peers import wait_for
from tests.integration.slurm_cluster import SlurmCluster, slurm_fixture, slurm_session_fixture  # noqa: F401

SITES = ("b", "c")
PER_SITE = 2
"""Allocation boundaries each job site crosses: four in the run."""


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_the_loop_hands_three_sites_over_across_four_allocations(slurm: SlurmCluster, tmp_path: Path) -> None:
    mesh = AutopilotMesh.start(tmp_path, slurm, sites=SITES)
    try:
        def handed_over() -> bool:
            for site in SITES:
                dropped = mesh.dropped(site)
                assert not dropped, f"jobs {dropped} of {site} ended without a handover: {mesh.jobs(site)}\n{mesh.decisions()}"
            return all(len(mesh.handovers(site)) >= PER_SITE for site in SITES)

        wait_for(handed_over, 540, f"{PER_SITE} handovers at each of {SITES}", interval_s=2)
        mesh.stop_loop()
        thetas = mesh.thetas()
        for site in SITES:
            jobs = mesh.jobs(site)
            assert jobs[PER_SITE + 1].state == "RUNNING", jobs
            assert mesh.handovers(site)[:PER_SITE] == list(range(1, PER_SITE + 1)), mesh.decisions()
            # Every job was the loop's, each successor queued while its predecessor ran, none twice.
            submitted = [d for d in mesh.decisions() if f": submitted sitemesh-soak-{site}-" in d]
            assert [d.split()[2] for d in submitted] == [f"sitemesh-soak-{site}-{n}" for n in sorted(jobs)], submitted
            assert all("its successor may start from" in d for d in submitted[1:]), submitted
            # Every job handed over from or to (the live one included) applied rounds with a.
            for n in range(1, PER_SITE + 2):
                assert set(thetas[f"{site}.j{n}"]) & set(thetas["a"]), f"{site}.j{n} and a applied no round in common"
        rounds = mesh.commits()
        assert [c.round for c in rounds] == list(range(1, len(rounds) + 1)), "every round committed once"
        # The data: every epoch that ended, none duplicated or lost.
        epochs = [e for e in mesh.audit() if e["ended"]]
        assert len(epochs) >= 2, epochs
        assert [(e["epoch"], e["duplicated"], e["lost"]) for e in epochs] == [(e["epoch"], 0, 0) for e in epochs]
        # θ: the same after every round on every member that applied it.
        for member, applied in thetas.items():
            assert all(thetas["a"].get(r, h) == h for r, h in applied.items()), member
    finally:
        mesh.close()
