"""A site of 2 torch.distributed ranks and a site of 1 train together through the real mesh.

Real `peer serve --train` processes on loopback; site a's trainer is a 2-rank gloo job started by
its peer (`--nproc-per-node 2`, peer/trainer/launch.py), site b's a single process. Every peer must
hold the same θ after every round; the data epoch is committed exactly once (`ops audit`), also
when a's rank 1 is killed with SIGKILL in the middle of a round: the site reports nothing for that
round, its peer restarts the ranks and the site trains again.

Try it:
    .venv/bin/python -m pytest -q tests/integration/test_ranks_mesh.py
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.integration.peers import Cluster, audit, commits, status, wait_for

DOCS = 12  # 213 samples in 4 blocks: enough rounds for the slower-starting site to join in
COMMON = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "6", "--batch-size", "2",
          "--round-deadline", "120", "--start-sites", "2"]  # the first site up must not train the epoch alone
TWO_RANKS = [*COMMON, "--nproc-per-node", "2"]
EPOCH_S = 400.0
PRESET = "lan"


def _training(cluster: Cluster, site: str) -> dict:
    return status(cluster.peers[site].address)["training"]


def _same_theta_every_round(cluster: Cluster) -> None:
    """I7 round by round: every round both peers applied has one θ. A peer that joined late caught
    up by state transfer (checked against the committed hash) and applied the rounds after it."""
    a, b = cluster.peers["a"].thetas(), cluster.peers["b"].thetas()
    both = sorted(a.keys() & b.keys())
    assert len(both) >= 3, f"too few rounds applied by both peers: a {sorted(a)}, b {sorted(b)}"
    assert max(a) == max(b) == both[-1]
    assert {r: a[r] for r in both} == {r: b[r] for r in both}, f"I7: θ differs: a {a}, b {b}"


def _contributions(data_dir: Path) -> list[tuple[int, str]]:
    """(round, site) of every contributor in the commit log on disk."""
    return [(c.round, x.site) for c in commits(data_dir) for x in c.contributors]


def _start(cluster: Cluster) -> None:
    a = cluster.start("a", extra=TWO_RANKS)
    cluster.start("b", join=[a.address], extra=COMMON)


def _epoch_done(cluster: Cluster) -> None:
    wait_for(lambda: any(_training(cluster, s)["epoch_complete"] for s in ("a", "b")), EPOCH_S,
             "the data epoch to complete")
    wait_for(lambda: _training(cluster, "a")["applied_round"] == _training(cluster, "b")["applied_round"], 60.0,
             "both peers to apply the last round")


@pytest.mark.timeout(900)
def test_two_rank_site_and_one_rank_site_train_an_epoch_with_one_theta(cluster: Cluster) -> None:
    _start(cluster)
    _epoch_done(cluster)
    _same_theta_every_round(cluster)
    contributions = _contributions(cluster.workdir / "a")
    assert any(s == "a" for _, s in contributions), "the 2-rank site contributed"
    assert any(s == "b" for _, s in contributions), "the 1-rank site contributed"
    epoch = audit(cluster.workdir / "a", cluster.workdir / "b")
    assert (epoch["duplicated"], epoch["lost"]) == (0, 0)
    assert epoch["committed_once"] == epoch["samples_total"]


def _rank_pids(log: Path, rank: int) -> list[int]:
    return [int(p) for p in re.findall(rf"rank {rank}/2 on \S+ pid (\d+) joined", log.read_text())]


@pytest.mark.timeout(900)
def test_killed_rank_costs_its_site_one_round_and_the_site_recovers(cluster: Cluster) -> None:
    _start(cluster)
    worker_log = cluster.workdir / "a" / "state" / "trainer-worker.log"
    wait_for(lambda: _training(cluster, "a")["applied_round"] >= 1, EPOCH_S, "the first round")
    # Mid-round: the leader opens the next round as soon as one is applied, so a's ranks are busy.
    time.sleep(1.0)
    (victim,) = _rank_pids(worker_log, 1)
    killed_at = _training(cluster, "a")["applied_round"]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: "trainer restarted" in cluster.peers["a"].log(), 180.0, "a's peer to restart its ranks")
    assert len(_rank_pids(worker_log, 1)) == 2, "a new rank 1"
    # A rank that dies in a round the site was asked to train: the report carries no pseudo-gradient
    # and the leader excludes it. One that dies in a round trained ahead (overlap, the default):
    # nothing was reported yet, so the site reports nothing and the samples go back on their leases.
    assert re.search(r"round \d+: a: excluded: .*training failed|round \d+: trained ahead, but training failed",
                     cluster.peers["a"].log() + cluster.peers["b"].log()), \
        "the site reported nothing usable for the round its rank died in"
    # The launcher names the dead rank (or rank 0 saw its peer go first and said so).
    text = worker_log.read_text()
    assert f"trainer rank 1 (pid {victim}) failed: signal SIGKILL" in text or "Connection closed by peer" in text
    _epoch_done(cluster)
    assert any(r > killed_at + 1 and s == "a" for r, s in _contributions(cluster.workdir / "b")), \
        "the site trained again after its ranks were restarted"
    _same_theta_every_round(cluster)
    epoch = audit(cluster.workdir / "a", cluster.workdir / "b")
    assert (epoch["duplicated"], epoch["lost"]) == (0, 0)
    assert epoch["committed_once"] == epoch["samples_total"]
