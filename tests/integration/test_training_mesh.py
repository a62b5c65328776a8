"""DiLoCo training through the mesh with real processes: `peer serve --train` on loopback.

Three sites train a micro Qwen3 on a slice of the shipped corpus small enough to finish its data
epoch in a few rounds. The commit log on disk is the audit: no sample is in two commits (I4), and
at the end of the epoch every sample is in exactly one (I5), also when a site is killed with
SIGKILL in the middle of a round. Every live peer holds the same θ (I7) and the checkpoint loads
with `AutoModelForCausalLM.from_pretrained`. The first test runs the mesh over mutual TLS.
"""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from pathlib import Path

import pytest

from peer.core.commitlog import RoundCommit
from peer.logstore import FileStore
from peer.trainer.blocks import BlockIndex
from peer.trainer.config import DataConfig
from peer.trainer.inner import SLOW_ENV
from tests.integration.peers import Cluster, ops, status, wait_for

DOCS = 8  # 141 samples in 3 blocks
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "8", "--batch-size", "1",
         "--round-deadline", "120", "--checkpoint-every", "1"]
EPOCH_S = 300.0


PRESET = "lan"


def _training(cluster: Cluster, site: str) -> dict | None:
    return cluster.status(cluster.peers[site].address)["training"]


def _committed_samples(data_dir: Path) -> Counter[tuple[int, int]]:
    """(block, sample) -> number of commits holding it, read from a peer's commit log on disk."""
    counts: Counter[tuple[int, int]] = Counter()
    for entry in FileStore(data_dir / "consensus").reload().entries:
        if isinstance(entry.body, RoundCommit):
            for c in entry.body.contributors:
                for r in c.ranges:
                    counts.update((r.block_id, i) for i in range(r.start, r.end))
    return counts


def _epoch_samples_of(docs: int) -> set[tuple[int, int]]:
    """Every (block, sample) of the shipped corpus cut to its first `docs` documents."""
    blocks = BlockIndex(DataConfig.shipped(max_documents=docs)).blocks
    return {(b.block_id, i) for b in blocks for i in range(b.num_samples)}


def _epoch_samples() -> set[tuple[int, int]]:
    return _epoch_samples_of(DOCS)


def _start_three(cluster: Cluster, more: list[str] | None = None, env: dict[str, str] | None = None) -> None:
    train = [*TRAIN, "--start-sites", "3", *(more or [])]  # the first site up must not train the epoch alone
    a = cluster.start("a", extra=train, env=env)
    cluster.start("b", join=[a.address], extra=train, env=env)
    cluster.start("c", join=[a.address], extra=train, env=env)


@pytest.mark.timeout(600)
def test_three_sites_train_an_epoch_exactly_once_and_agree_on_theta(tls_cluster: Cluster) -> None:
    """Over mutual TLS, as a real run (the other tests run --insecure), with overlapped rounds (the
    default)."""
    cluster = tls_cluster
    # A micro round trains its 8 steps in ~1 s, faster than a round commits and is applied here
    # (~2 s): θ_{r-1} would come after the last step and never be folded in mid-round. Steps 5x as
    # slow (as on a slower accelerator) put the fold between steps, as a real model's rounds do.
    _start_three(cluster, env={SLOW_ENV: "5"})
    # The leader reports the end of the epoch; the others follow by applying the last round.
    wait_for(lambda: any((t := _training(cluster, s)) and t["epoch_complete"] for s in ("a", "b", "c")),
             EPOCH_S, "the data epoch to complete")
    wait_for(lambda: len({_training(cluster, s)["applied_round"] for s in ("a", "b", "c")}) == 1, 60.0,
             "every peer to apply the last round")
    docs = {s: _training(cluster, s) for s in ("a", "b", "c")}
    assert len({d["weights_hash"] for d in docs.values()}) == 1, "I7: every peer holds the same θ"
    logs = "".join(cluster.peers[s].log() for s in ("a", "b", "c"))
    # Overlap is on by default: rounds trained ahead of θ_{r-1}, which was folded in between steps
    # (the same θ everywhere above: the fold is site-local, the committed θ is not).
    assert re.search(r"round \d+: training \d+ leased samples, ahead of θ_\d+", logs), "no round trained ahead"
    assert re.search(r"round \d+: trained ahead; θ_\d+ folded in after \d+ of \d+ steps", logs), "no fold"
    counts = _committed_samples(cluster.workdir / "a")
    assert max(counts.values()) == 1, "I4: no sample in two commits"
    assert set(counts) == _epoch_samples(), "I5: every sample of the epoch committed"
    audit = ops("audit", "--data-dir", str(cluster.workdir / "c"), "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    (epoch,) = json.loads(audit.stdout)
    assert (epoch["duplicated"], epoch["lost"]) == (0, 0)
    assert epoch["committed_once"] == epoch["samples_total"] == len(_epoch_samples())
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cluster.workdir / "b" / "checkpoints" / "latest")
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.timeout(600)
def test_site_killed_mid_round_loses_and_duplicates_nothing(cluster: Cluster) -> None:
    """Serial rounds (`--overlap off`): a site trains a round only once θ_{r-1} is here."""
    _start_three(cluster, ["--overlap", "off"])
    wait_for(lambda: (t := _training(cluster, "a")) is not None and t["applied_round"] >= 1, EPOCH_S,
             "the first round")
    cluster.peers["c"].proc.send_signal(signal.SIGKILL)
    cluster.peers["c"].proc.wait()
    wait_for(lambda: any((t := _training(cluster, s)) and t["epoch_complete"] for s in ("a", "b")),
             EPOCH_S, "a and b to finish the epoch without c")
    wait_for(lambda: _training(cluster, "a")["applied_round"] == _training(cluster, "b")["applied_round"], 60.0,
             "a and b to apply the last round")
    assert _training(cluster, "a")["weights_hash"] == _training(cluster, "b")["weights_hash"]
    counts = _committed_samples(cluster.workdir / "b")
    assert max(counts.values()) == 1, "I4: no sample in two commits"
    assert set(counts) == _epoch_samples(), "I5: the killed site's samples were trained by others"
    assert not any("ahead of θ_" in cluster.peers[s].log() for s in ("a", "b")), "--overlap off trained ahead"
    # The epoch may end before membership has declared c dead; its voter seat goes once it has.
    wait_for(lambda: status(cluster.peers["a"].address)["voters"] == ["a", "b"], 60.0,
             "the dead site to lose its voter seat")


@pytest.mark.timeout(600)
def test_two_data_epochs_are_each_committed_exactly_once(cluster: Cluster) -> None:
    """The log rolls the data epoch over when its last sample commits; leases start over with it."""
    docs = 6  # 84 samples in 2 blocks
    train = ["--train", "micro", "--max-documents", str(docs), "--inner-steps", "8", "--batch-size", "2",
             "--round-deadline", "120", "--data-epochs", "2", "--start-sites", "2"]
    a = cluster.start("a", extra=train)
    cluster.start("b", join=[a.address], extra=train)
    wait_for(lambda: any((t := _training(cluster, s)) and t["epoch_complete"] for s in ("a", "b")), EPOCH_S,
             "both data epochs to complete")
    wait_for(lambda: all(_training(cluster, s)["data_epoch"] == 2 for s in ("a", "b")), 60.0,
             "both peers to apply the last round")
    wait_for(lambda: all(_training(cluster, s)["leases_held"] == 0 for s in ("a", "b")), 30.0,
             "the sites to give their leases back once the run's data is done")
    t = _training(cluster, "a")
    assert t["samples_committed"] == t["samples_total"] == 2 * len(_epoch_samples_of(docs))
    audit = ops("audit", "--data-dir", str(cluster.workdir / "a"), "--data-dir", str(cluster.workdir / "b"), "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    rows = json.loads(audit.stdout)
    assert [r["epoch"] for r in rows] == [0, 1]
    for row in rows:
        assert (row["duplicated"], row["lost"], row["committed_once"]) == (0, 0, len(_epoch_samples_of(docs)))
        assert row["grants"] >= 2, "every block is leased again in the new epoch"
