"""A site of the run cannot break the run (issue 38): real `peer serve` processes with mutual TLS,
sent protocol-valid but false consensus messages by holders of real site certificates of the run.
Each probe once stopped the run; now the peers keep serving and rounds keep committing (the test
prints the committed round before and after each probe), and a repaired site catches up in seconds.

    .venv/bin/python -m pytest -q -s tests/integration/test_hostile_site.py
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ops.certs import LOOPBACK, issue
from peer.core.commitlog import AppendEntries, AppendReply, InstallSnapshot, LogIndex, Round, Snapshot
from peer.core.election import Epoch, Header, SiteId
from peer.transport.channels import Credentials
from tests.integration.peers import REPO, Cluster, Relay, _env, outbound, wait_for
from tests.integration.test_security import _consensus_send

SETTLE_S = 30.0
ROUNDS = ["--round-interval", "0.5"]


@pytest.fixture
def tls(tmp_path: Path):
    # lan: local_test's 0.3-0.6 s election timeouts move the leadership on a loaded machine, and
    # these tests check that the probes do not.
    c = Cluster(tmp_path, preset="lan", tls=True)
    yield c
    c.close()


def _mesh(tls: Cluster, relayed: bool = False) -> dict[str, object]:
    """a, b, c with committed rounds; `relayed`: b and c accept no inbound connection and are
    reached through a relay, which the probes sent to them go through too."""
    first = tls.start("a", extra=ROUNDS)
    via = outbound([Relay(tls, "r1")]) if relayed else []
    for site in ("b", "c"):
        tls.start(site, join=[first.address], extra=[*ROUNDS, *via])
    wait_for(lambda: len(tls.status(first.address)["voters"]) == 3 and tls.status(first.address)["committed_round"]
             >= 2, SETTLE_S, "three voters and committed rounds")
    return tls.status(first.address)


def _goes_on(tls: Cluster, probe: str, leader: str, epoch: int | None = None) -> None:
    """Every peer keeps serving, the same leader (at the same epoch, when given) commits 3 more rounds."""
    before = tls.status(tls.peers[leader].address)["committed_round"]
    wait_for(lambda: all(tls.status(p.address)["committed_round"] >= before + 3 for p in tls.peers.values()),
             SETTLE_S, f"rounds to go on committing after {probe}")
    now = tls.status(tls.peers[leader].address)
    print(f"{probe}: committed round {before} -> {now['committed_round']}, leader {now['leader']}, "
          f"epoch {now['epoch']}")
    assert now["leader"] == leader
    if epoch is not None:
        assert now["epoch"] == epoch
    for p in tls.peers.values():
        assert p.proc.poll() is None, p.log()[-3000:]
        assert "Traceback" not in p.log(), p.log()[-3000:]


@pytest.mark.parametrize("relayed", [False, True], ids=["direct", "through-a-relay"])
def test_false_messages_of_sites_of_the_run_are_refused_and_the_run_goes_on(tls: Cluster, relayed: bool) -> None:
    status = _mesh(tls, relayed)
    leader, epoch = status["leader"], status["epoch"]
    assert isinstance(leader, str) and isinstance(epoch, int)
    followers = sorted(s for s in tls.peers if s != leader)
    as_follower = Credentials.from_dir(tls.certs, followers[0])

    # 1. A snapshot far ahead from `d`, a certificate of the run whose site never joined.
    issue(tls.certs, "d", "site", tls.certs, LOOPBACK)
    snap = Snapshot(LogIndex(10**6), Epoch(epoch), Round(10**6), b"forged", ((SiteId("d"), "127.0.0.1:1"),))
    forged = InstallSnapshot(Header(SiteId("d"), "127.0.0.1:1", Epoch(epoch), 0), snap, 1)
    for site in followers:
        assert _consensus_send(tls.peers[site].address, Credentials.from_dir(tls.certs, "d"), forged) is None
    _goes_on(tls, "snapshot from a site that never joined", leader, epoch)
    for site in followers:
        assert tls.status(tls.peers[site].address)["consensus"]["commit_index"] < 10**6

    # 2. An ack far beyond the leader's log, from a voter.
    ack = AppendReply(Header(SiteId(followers[0]), tls.peers[followers[0]].address, Epoch(epoch), 0), True,
                      LogIndex(10**6), 1, "ok")
    assert _consensus_send(tls.peers[leader].address, as_follower, ack) is None
    _goes_on(tls, "ack beyond the leader's log", leader, epoch)

    # 3. An epoch at the wire's bound, from a voter, to the other follower.
    jump = AppendEntries(Header(SiteId(followers[0]), tls.peers[followers[0]].address, Epoch(2**62), 0),
                         LogIndex(0), Epoch(0), (), LogIndex(0), 1)
    assert _consensus_send(tls.peers[followers[1]].address, as_follower, jump) is None
    _goes_on(tls, "epoch 2^62 from a voter", leader, epoch)

    assert "cannot lead: neither a voter nor a member of the run" in tls.peers[followers[0]].log()
    assert "beyond this log's last" in tls.peers[leader].log()
    assert "implausible epoch 4611686018427387904" in tls.peers[followers[1]].log()


def test_a_repaired_site_catches_up_in_seconds_while_the_leader_stays(tls: Cluster) -> None:
    """`peer repair` then `peer serve --join`: the leader used to keep the match index of the old log
    and re-send an unusable prev_index until the leadership changed (40 s to minutes)."""
    status = _mesh(tls)
    leader, epoch = status["leader"], status["epoch"]
    assert isinstance(leader, str) and isinstance(epoch, int)
    site = next(s for s in sorted(tls.peers) if s != leader)
    lead = tls.peers[leader]
    wait_for(lambda: tls.status(tls.peers[site].address)["committed_round"] >= 6, SETTLE_S, "rounds applied")
    tls.peers[site].proc.send_signal(signal.SIGKILL)
    tls.peers[site].proc.wait()
    repaired = subprocess.run([sys.executable, "-m", "peer.cli", "repair", "--data-dir", str(tls.workdir / site),
                               "--yes"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=60)
    assert repaired.returncode == 0, repaired.stderr
    peer = tls.start(site, join=[lead.address], extra=ROUNDS)
    target = tls.status(lead.address)["consensus"]["commit_index"]
    took = wait_for(lambda: tls.status(peer.address)["consensus"]["applied_index"] >= target, SETTLE_S,
                    "the repaired site to catch up")
    print(f"repaired site caught up to index {target} in {took:.1f} s")
    assert took < 10.0
    now = tls.status(lead.address)
    assert now["leader"] == leader and now["epoch"] == epoch
    _goes_on(tls, "repair", leader, epoch)
