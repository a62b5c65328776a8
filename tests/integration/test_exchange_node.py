"""The node's exchange end to end: `peer serve --train ... --wire int4` on loopback, three sites.

Every round goes through reduce-scatter with int4 pseudo-gradients and mean shards (error feedback
on every site that trains): the epoch is committed exactly once, every peer holds the same θ (I7: all decode
the same bytes), no owner had to be reduced around (the leader's mean-shard requests reached the
owners before the commit), and each site that trained kept its error-feedback residual on disk.
"""

from __future__ import annotations

import signal

import pytest

from peer.round_exchange import RESIDUAL_FILE
from tests.integration.peers import Cluster, status, wait_for
from tests.integration.test_training_mesh import EPOCH_S, TRAIN, _committed_samples, _epoch_samples_of

PRESET = "lan"
SITES = ("a", "b", "c")
DOCS = 12  # half again the shared test's data: every site gets a block


def _start_three(cluster: Cluster, wire: str) -> list[str]:
    """Sites a, b, c training with `wire`; the first round waits for all three (a's trainer could
    otherwise train the epoch alone while the others start, and these tests need at least two
    contributors in a round). Returns their flags, for a restart."""
    train = [*TRAIN, "--wire", wire, "--start-sites", "3"]
    train[train.index("--max-documents") + 1] = str(DOCS)
    a = cluster.start("a", extra=train)
    cluster.start("b", join=[a.address], extra=train)
    cluster.start("c", join=[a.address], extra=train)
    return train


def _training(cluster: Cluster, site: str) -> dict:
    return status(cluster.peers[site].address)["training"]


def _epoch_once_and_same_theta(cluster: Cluster) -> None:
    """Waits for the epoch's end on every peer, then: the same θ everywhere (I7), every sample once."""
    wait_for(lambda: any((t := _training(cluster, s)) and t["epoch_complete"] for s in SITES), EPOCH_S,
             "the epoch to end")
    wait_for(lambda: len({_training(cluster, s)["applied_round"] for s in SITES}) == 1, 60.0,
             "every peer to apply it")
    assert len({_training(cluster, s)["weights_hash"] for s in SITES}) == 1, "I7: every peer holds the same θ"
    counts = _committed_samples(cluster.workdir / "a")
    assert max(counts.values()) == 1 and set(counts) == _epoch_samples_of(DOCS)


@pytest.mark.timeout(600)
def test_three_int4_sites_train_an_epoch_by_reduce_scatter_and_agree_on_theta(cluster: Cluster) -> None:
    _start_three(cluster, "int4")
    _epoch_once_and_same_theta(cluster)
    trained = [s for s in SITES if " trained: " in cluster.peers[s].log()]  # a late joiner may get no lease
    assert len(trained) >= 2, trained
    for s in SITES:
        log = cluster.peers[s].log()
        assert "reduced the shards of" not in log, log[-3000:]
        assert (cluster.workdir / s / "state" / RESIDUAL_FILE).exists() == (s in trained), s


@pytest.mark.timeout(600)
def test_three_sparse_sites_all_gather_agree_on_theta_and_keep_feedback_across_a_restart(cluster: Cluster) -> None:
    """`--wire sparse`: every peer sums the sites' sparse pseudo-gradients itself (no mean shards),
    every peer holds the same θ, the epoch is trained exactly once, and b's error-feedback residual,
    on disk when b is killed, is loaded by the restarted b."""
    train = _start_three(cluster, "sparse")
    residual = cluster.workdir / "b" / "state" / RESIDUAL_FILE
    wait_for(residual.exists, EPOCH_S, "b to send a sparse pseudo-gradient")
    cluster.peers["b"].proc.send_signal(signal.SIGKILL)
    cluster.peers["b"].proc.wait(timeout=10)
    assert residual.exists()
    cluster.start("b", join=[cluster.peers["a"].address], extra=train)
    _epoch_once_and_same_theta(cluster)
    assert "error feedback: residual of the last round sent loaded" in cluster.peers["b"].log()
    for s in SITES:
        log = cluster.peers[s].log()
        assert "mean shard" not in log, log[-3000:]
