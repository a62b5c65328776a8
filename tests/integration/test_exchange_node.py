"""The node's exchange end to end: `peer serve --train ... --wire int4` on loopback, three sites.

Every round goes through reduce-scatter with int4 pseudo-gradients and mean shards (error feedback
on every site that trains): the epoch is committed exactly once, every peer holds the same θ (I7: all decode
the same bytes), no owner had to be reduced around (the leader's mean-shard requests reached the
owners before the commit), and each site that trained kept its error-feedback residual on disk.
"""

from __future__ import annotations

import signal

import pytest

from peer.training import RESIDUAL_FILE
from tests.integration.peers import Cluster, status, wait_for
from tests.integration.test_training_mesh import EPOCH_S, TRAIN, _committed_samples, _epoch_samples_of

PRESET = "lan"


@pytest.mark.timeout(600)
def test_three_int4_sites_train_an_epoch_by_reduce_scatter_and_agree_on_theta(cluster: Cluster) -> None:
    # The first round waits for all three sites (a's trainer could otherwise train the epoch alone
    # while the others start; this test needs at least two contributors in a round), and half again
    # the shared test's data leaves every site a block.
    train = [*TRAIN, "--wire", "int4", "--start-sites", "3"]
    docs = 12
    train[train.index("--max-documents") + 1] = str(docs)
    a = cluster.start("a", extra=train)
    cluster.start("b", join=[a.address], extra=train)
    cluster.start("c", join=[a.address], extra=train)
    sites = ("a", "b", "c")

    def training(s: str) -> dict:
        return status(cluster.peers[s].address)["training"]

    wait_for(lambda: any((t := training(s)) and t["epoch_complete"] for s in sites), EPOCH_S, "the epoch to end")
    wait_for(lambda: len({training(s)["applied_round"] for s in sites}) == 1, 60.0, "every peer to apply it")
    assert len({training(s)["weights_hash"] for s in sites}) == 1, "I7: every peer holds the same θ"
    counts = _committed_samples(cluster.workdir / "a")
    assert max(counts.values()) == 1 and set(counts) == _epoch_samples_of(docs)
    trained = [s for s in sites if " trained: " in cluster.peers[s].log()]  # a late joiner may get no lease
    assert len(trained) >= 2, trained
    for s in sites:
        log = cluster.peers[s].log()
        assert "reduced the shards of" not in log, log[-3000:]
        assert (cluster.workdir / s / "state" / RESIDUAL_FILE).exists() == (s in trained), s


@pytest.mark.timeout(600)
def test_three_sparse_sites_all_gather_agree_on_theta_and_keep_feedback_across_a_restart(cluster: Cluster) -> None:
    """`--wire sparse`: every peer sums the sites' sparse pseudo-gradients itself (no mean shards),
    every peer holds the same θ, the epoch is trained exactly once, and b's error-feedback residual,
    on disk when b is killed, is loaded by the restarted b."""
    train = [*TRAIN, "--wire", "sparse", "--start-sites", "3"]
    docs = 12
    train[train.index("--max-documents") + 1] = str(docs)
    a = cluster.start("a", extra=train)
    cluster.start("b", join=[a.address], extra=train)
    cluster.start("c", join=[a.address], extra=train)
    sites = ("a", "b", "c")
    residual = cluster.workdir / "b" / "state" / RESIDUAL_FILE

    def training(s: str) -> dict:
        return status(cluster.peers[s].address)["training"]

    wait_for(residual.exists, EPOCH_S, "b to send a sparse pseudo-gradient")
    cluster.peers["b"].proc.send_signal(signal.SIGKILL)
    cluster.peers["b"].proc.wait(timeout=10)
    assert residual.exists()
    cluster.start("b", join=[a.address], extra=train)
    wait_for(lambda: any((t := training(s)) and t["epoch_complete"] for s in sites), EPOCH_S, "the epoch to end")
    wait_for(lambda: len({training(s)["applied_round"] for s in sites}) == 1, 60.0, "every peer to apply it")
    assert len({training(s)["weights_hash"] for s in sites}) == 1, "I7: every peer holds the same θ"
    counts = _committed_samples(cluster.workdir / "a")
    assert max(counts.values()) == 1 and set(counts) == _epoch_samples_of(docs)
    assert "error feedback: residual of the last round sent loaded" in cluster.peers["b"].log()
    for s in sites:
        log = cluster.peers[s].log()
        assert "mean shard" not in log, log[-3000:]
