"""Divergence → automatic state transfer → identical θ (I7), with real processes.

Three `peer serve --train micro` sites on loopback. Site b runs with a test-only fault that flips one
bit of its θ in memory after the first round it applies (SITEMESH_FAULT_FLIP_THETA_AFTER_ROUND, a silent
memory error: the hash b believes it holds stays the committed one); its next apply must find the
hash mismatch, say why in its log and `ops status`, and install a healthy peer's θ. Then site c is
killed with SIGKILL, one bit of θ in its state file on disk is flipped, and it is restarted: the
start-up check against the log must find it and re-sync the same way. Every peer ends with the
same θ hash; `ops audit` finds nothing duplicated or lost.

    .venv/bin/python -m pytest -q tests/integration/test_resync.py
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from peer.theta_store import MOMENTUM_PREFIX
from peer.training import FLIP_THETA_ENV
from tests.integration.peers import Cluster, ops, status, wait_for

PRESET = "lan"
DOCS = 24  # 420 samples in 7 blocks: enough rounds for both faults
# The first round waits for all three sites: since the node stopped spinning, a's trainer trained the
# whole epoch (27 rounds) before b and c had started, and b's fault never met a round to apply.
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "8", "--batch-size", "2",
         "--round-deadline", "120", "--start-sites", "3"]


def _training(cluster: Cluster, site: str) -> dict:
    return status(cluster.peers[site].address)["training"] or {}


def _agree(cluster: Cluster) -> bool:
    docs = [_training(cluster, s) for s in ("a", "b", "c")]
    return len({(d.get("applied_round"), d.get("weights_hash")) for d in docs}) == 1 and docs[0]["applied_round"] > 0


def _flip_theta_on_disk(data_dir: Path) -> None:
    pointer = json.loads((data_dir / "state" / "applied.json").read_text())
    path = data_dir / "state" / pointer["file"]
    tensors = load_file(path)
    name = min(n for n in tensors if not n.startswith(MOMENTUM_PREFIX))
    t = tensors[name].clone()
    t.view(-1).view(torch.int32)[0] ^= 1
    tensors[name] = t
    save_file(tensors, path)


@pytest.mark.timeout(600)
def test_a_peer_whose_theta_diverges_resyncs_by_state_transfer(cluster: Cluster,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    a = cluster.start("a", extra=TRAIN)
    wait_for(lambda: status(a.address)["leader"] == "a", 60.0, "a to lead (the fault must hit a follower)")
    monkeypatch.setenv(FLIP_THETA_ENV, "1")
    cluster.start("b", join=[a.address], extra=TRAIN)
    monkeypatch.delenv(FLIP_THETA_ENV)
    cluster.start("c", join=[a.address], extra=TRAIN)

    wait_for(lambda: "re-synced" in (_training(cluster, "b").get("diverged") or ""), 300.0,
             "b to find its θ diverged and re-sync")
    diverged = _training(cluster, "b")["diverged"]
    assert "θ hash" in diverged and "(I7)" in diverged, diverged
    log = cluster.peers["b"].log()
    assert "fault injected" in log and "θ diverged from the log: round " in log, log[-3000:]
    assert "caught up by state transfer from" in log
    wait_for(lambda: _agree(cluster), 120.0, "every peer to hold the same θ")

    # Now on disk: c crashes, a bit of its stored θ flips, it starts again.
    cluster.peers["c"].proc.send_signal(signal.SIGKILL)
    cluster.peers["c"].proc.wait()
    _flip_theta_on_disk(cluster.workdir / "c")
    cluster.start("c", join=[a.address], extra=TRAIN)
    wait_for(lambda: "re-synced" in (_training(cluster, "c").get("diverged") or ""), 120.0,
             "c to find its θ on disk diverged and re-sync")
    assert "θ on disk has hash" in _training(cluster, "c")["diverged"]
    wait_for(lambda: any(_training(cluster, s).get("epoch_complete") for s in ("a", "b", "c")), 300.0,
             "the data epoch to complete")
    wait_for(lambda: _agree(cluster), 120.0, "every peer to hold the same θ at the end")
    audit = ops("audit", *(x for s in ("a", "b", "c") for x in ("--data-dir", str(cluster.workdir / s))),
                "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    (epoch,) = json.loads(audit.stdout)
    assert (epoch["duplicated"], epoch["lost"]) == (0, 0)
