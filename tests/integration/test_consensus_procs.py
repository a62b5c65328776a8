"""Election and the round-commit log with real `peer serve` processes on loopback.

Rounds are driven without training (`--round-interval`: the leader commits empty rounds), so the
tests exercise election, leases, replication, voter changes and recovery from disk quickly.
"""

from __future__ import annotations

import asyncio
import datetime
import signal
import time
from pathlib import Path
from typing import Any


from peer.core.commitlog import AppendEntries, LogIndex
from peer.core.election import ElectionConfig, Epoch, Header, SiteId
from peer.transport.channels import ChannelPool
from peer.transport.consensus_rpc import CONSENSUS
from peer.transport.oneway import OneWaySender
from tests.integration.peers import Cluster, ops, status, wait_for

# The lan preset (elections in 1-2 s): local_test's 0.3 s timeouts churn leaders on a loaded 2-core
# machine, which is the election working, not what these tests are about.
ELECTION = ElectionConfig.lan()
# A follower notices a dead leader within election_timeout_max, then a pre-vote and a vote round
# trip elect the next; allow for one split vote: 2 timeouts. Polling `ops status` adds up to ~1 s.
ELECTION_BOUND_S = 2 * ELECTION.election_timeout_max_s + 1.0
ROUNDS = ["--round-interval", "0.3"]
SETTLE_S = 30.0


PRESET = "lan"


def _docs(cluster: Cluster, sites: list[str] | None = None) -> dict[str, dict[str, Any]]:
    return {s: status(cluster.peers[s].address) for s in (sites or list(cluster.peers))}


def _agreed_leader(cluster: Cluster, sites: list[str]) -> str | None:
    docs = _docs(cluster, sites)
    leaders = {d["leader"] for d in docs.values()}
    epochs = {d["epoch"] for d in docs.values()}
    if len(leaders) == 1 and len(epochs) == 1 and None not in leaders:
        return leaders.pop()
    return None


def _three(cluster: Cluster, rounds: bool = True) -> str:
    extra = ROUNDS if rounds else []
    a = cluster.start("a", extra=extra)
    cluster.start("b", join=[a.address], extra=extra)
    cluster.start("c", join=[a.address], extra=extra)
    sites = ["a", "b", "c"]
    wait_for(lambda: all(d["voters"] == sites for d in _docs(cluster).values()), SETTLE_S, "three voters")
    wait_for(lambda: _agreed_leader(cluster, sites) is not None, SETTLE_S, "one agreed leader")
    leader = _agreed_leader(cluster, sites)
    assert leader is not None
    return leader


def test_three_peers_elect_one_leader_and_commit_rounds(cluster: Cluster) -> None:
    leader = _three(cluster)
    docs = _docs(cluster)
    roles = {s: d["consensus"]["role"] for s, d in docs.items()}
    assert sorted(roles.values()) == ["follower", "follower", "leader"]
    assert roles[leader] == "leader"
    assert docs[leader]["consensus"]["lease_remaining_s"] > 0
    start = docs[leader]["committed_round"]
    wait_for(lambda: min(d["committed_round"] for d in _docs(cluster).values()) >= start + 3, SETTLE_S,
             "three more rounds committed on every peer")


def test_kill_9_leader_elects_a_successor_with_higher_epoch(cluster: Cluster) -> None:
    leader = _three(cluster)
    old_epoch = status(cluster.peers[leader].address)["epoch"]
    killed_at = time.time()
    cluster.peers[leader].proc.kill()
    cluster.peers[leader].proc.wait()
    rest = [s for s in ("a", "b", "c") if s != leader]

    def successor() -> bool:
        new = _agreed_leader(cluster, rest)
        return new is not None and new != leader and status(cluster.peers[new].address)["epoch"] > old_epoch

    wait_for(successor, SETTLE_S, "a successor leader")
    new = _agreed_leader(cluster, rest)
    # Measured on the peers' own log clocks, not on our (slow) status polling.
    elected_at = min(t for t, line in _log_lines(cluster.peers[new].log())
                     if t > killed_at and f": {new}" in line and "leader of epoch" in line)
    took = elected_at - killed_at
    assert took <= ELECTION_BOUND_S, f"election took {took:.2f}s > bound {ELECTION_BOUND_S:.2f}s"
    before = max(d["committed_round"] for d in _docs(cluster, rest).values())
    wait_for(lambda: min(d["committed_round"] for d in _docs(cluster, rest).values()) > before, SETTLE_S,
             "the two survivors to keep committing")


def test_paused_leader_steps_down_and_its_stale_messages_are_refused(cluster: Cluster) -> None:
    leader = _three(cluster, rounds=False)  # a quiet log: nothing but the fenced message could move it
    old_epoch = status(cluster.peers[leader].address)["epoch"]
    victim = cluster.peers[leader]
    rest = [s for s in ("a", "b", "c") if s != leader]
    victim.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: (_agreed_leader(cluster, rest) or leader) != leader, SETTLE_S, "a new leader")
        # Keep it paused well past its lease so that it resumes believing it still leads.
        time.sleep(ELECTION.election_timeout_max_s)
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: status(victim.address)["consensus"]["role"] == "follower"
             and status(victim.address)["epoch"] > old_epoch, SETTLE_S, "the old leader to step down")
    # A heartbeat the old leader sent at its old epoch, delivered late (as a network that held it
    # would): the follower refuses it, says why, and its state does not move.
    target = cluster.peers[rest[0]]
    before = status(target.address)
    late = AppendEntries(Header(SiteId(leader), victim.address, Epoch(old_epoch), 0), LogIndex(0), Epoch(0), (),
                         LogIndex(before["consensus"]["commit_index"] + 5), seq=1)
    assert asyncio.run(_deliver(target.address, late))
    wait_for(lambda: f"refused AppendEntries from {leader}: stale epoch {old_epoch}" in target.log(), 10.0,
             "the refusal in the follower's log")
    after = status(target.address)
    assert (after["epoch"], after["leader"]) == (before["epoch"], before["leader"]), "state moved"
    assert after["leader"] != leader


def test_two_of_three_leave_and_the_last_commits_alone(cluster: Cluster) -> None:
    leader = _three(cluster)
    followers = [s for s in ("a", "b", "c") if s != leader]
    for site in [followers[0], leader]:  # a follower, then the leader itself
        result = ops("leave", "--peer", cluster.peers[site].address)
        assert result.returncode == 0, result.stderr
        assert cluster.peers[site].proc.wait(timeout=30) == 0
    last = followers[1]
    addr = cluster.peers[last].address
    wait_for(lambda: status(addr)["voters"] == [last] and status(addr)["leader"] == last, SETTLE_S,
             f"{last} to be the only voter and leader")
    before = status(addr)["committed_round"]
    wait_for(lambda: status(addr)["committed_round"] >= before + 3, SETTLE_S, f"{last} to commit rounds alone")


def test_stop_all_then_restart_one_resumes_from_disk(cluster: Cluster) -> None:
    _three(cluster)
    wait_for(lambda: min(d["committed_round"] for d in _docs(cluster).values()) >= 3, SETTLE_S, "3 rounds")
    for peer in cluster.peers.values():
        peer.proc.send_signal(signal.SIGKILL)
        peer.proc.wait()
    on_disk = _applied_round(cluster.workdir / "a")
    a = cluster.start("a", extra=ROUNDS)
    doc = status(a.address)
    assert doc["voters"] == ["a", "b", "c"]
    assert doc["committed_round"] == on_disk, "resumes at the round its disk says it applied"
    # Alone among three voters it cannot elect itself (no majority), and must not commit anything.
    time.sleep(ELECTION.election_timeout_max_s * 3)
    doc = status(a.address)
    assert doc["leader"] is None
    assert doc["committed_round"] == on_disk
    # A second voter back makes a majority: the run continues after the last committed round.
    # (Ports are picked afresh here, so b joins through a to learn its new address.)
    b = cluster.start("b", join=[a.address], extra=ROUNDS)
    wait_for(lambda: status(a.address)["leader"] is not None, SETTLE_S, "a leader among a and b")
    wait_for(lambda: min(status(x.address)["committed_round"] for x in (a, b)) > on_disk + 2, SETTLE_S,
             "rounds after the restart")


async def _deliver(address: str, msg: object) -> bool:
    pool = ChannelPool()
    try:
        return await OneWaySender(CONSENSUS, pool, timeout_s=5.0).send(address, msg)
    finally:
        await pool.close()


def _log_lines(text: str) -> list[tuple[float, str]]:
    """(unix time, line) for each line of a peer log (its asctime is local time, ms precision)."""
    out = []
    for line in text.splitlines():
        try:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            continue
        out.append((stamp.timestamp(), line))
    return out


def _applied_round(data_dir: Path) -> int:
    import json

    return int(json.loads((data_dir / "state" / "applied.json").read_text())["round"])
