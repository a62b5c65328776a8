"""One site handed over from one Slurm job to the next without losing a round (issue 35, item 2):
real peers with mutual TLS. Site b's job 1 and job 2 are members of their own (b.j1, b.j2) under
b's one certificate; the first round opens once a, b.j1 and b.j2 are live (so that the epoch
cannot end before the successor's trainer is up, however fast the machine), they train together,
then job 1 gets SIGTERM, as Slurm sends it before the wall time, and leaves. The run goes on with
a and b.j2; at the end every sample of the epoch is committed once (`ops audit` over a, b's job 1
and b's job 2) and a and b.j2 hold the same θ. (A successor that joins after rounds were committed
takes θ by state transfer, as every late joiner does: tests/integration/test_darl_mesh.py.)"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.peers import Cluster, audit, commits, wait_for
from tests.integration.test_training_mesh import _committed_samples, _epoch_samples_of

DOCS = 32  # 509 samples: rounds with all three, then with a and b.j2 alone
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "8", "--batch-size", "1",
         "--round-deadline", "60", "--start-sites", "3"]


def _training(cluster: Cluster, member: str) -> dict:
    t = cluster.status(cluster.peers[member].address)["training"]
    assert t is not None
    return t


@pytest.mark.timeout(900)
def test_a_sites_next_job_takes_over_without_losing_a_round(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, tls=True, preset="lan")
    try:
        a = cluster.start("a", extra=TRAIN)
        cluster.start("b", join=[a.address], extra=[*TRAIN, "--job", "1"])
        cluster.peers["b.j1"] = cluster.peers.pop("b")
        # The successor starts beside job 1: a member of its own, under b's certificate.
        cluster.start("b", join=[a.address], extra=[*TRAIN, "--job", "2"])
        cluster.peers["b.j2"] = cluster.peers.pop("b")
        wait_for(lambda: any({c.site for c in commit.contributors} >= {"a", "b.j1", "b.j2"}
                             for commit in commits(tmp_path / "a")), 400, "a round both of b's jobs trained")
        members = {m["site"] for m in cluster.status(a.address)["members"] if m["state"] == "alive"}
        assert members == {"a", "b.j1", "b.j2"}

        old = cluster.peers["b.j1"].proc
        old.send_signal(signal.SIGTERM)  # Slurm's --signal before the wall time: a graceful leave
        assert old.wait(timeout=120) == 0
        left = max(c.round for c in commits(tmp_path / "a"))
        wait_for(lambda: any(c.round > left and {x.site for x in c.contributors} == {"a", "b.j2"}
                             for c in commits(tmp_path / "a")), 400, "rounds after job 1 left")
        wait_for(lambda: _training(cluster, "a")["epoch_complete"], 600, "the epoch to complete")
        wait_for(lambda: _training(cluster, "a")["applied_round"] == _training(cluster, "b.j2")["applied_round"],
                 120, "b's job 2 to apply the last round")
        assert _training(cluster, "a")["weights_hash"] == _training(cluster, "b.j2")["weights_hash"]
        rounds = [c.round for c in commits(tmp_path / "a")]
        assert rounds == list(range(1, len(rounds) + 1)), "every round committed once, none skipped"
        counts = _committed_samples(tmp_path / "a")
        assert max(counts.values()) == 1 and set(counts) == _epoch_samples_of(DOCS)
        epoch = audit(tmp_path / "a", tmp_path / "b" / "j1", tmp_path / "b" / "j2")
        assert (epoch["duplicated"], epoch["lost"]) == (0, 0)
    finally:
        cluster.close()
