"""A peer whose `--join` seed never answers, but which the mesh reached through another member, stays.

Issue 38: a peer restarted with a starved peer as its seed caught up through another member and
then exited anyway when the join timeout ran out ("no seed answered"). Here the seed is a port
nobody listens on, and an operator's `ops join` on a member reaches the new peer instead. The new
peer runs the `lan` preset, whose anti-entropy (a push-pull every 30 s, whose reply would also
count as a join) comes after its join timeout, as a real run's does.

    .venv/bin/python -m pytest -q tests/integration/test_join_through_another.py
"""

from __future__ import annotations

import socket
import time

from tests.integration.peers import Cluster, states, wait_for

JOIN_TIMEOUT_S = 4.0


def _dead_address() -> str:
    with socket.socket() as s:  # bound and closed: nothing answers there
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_peer_found_by_the_mesh_does_not_exit_when_its_seed_never_answers(cluster: Cluster) -> None:
    a = cluster.start("a")
    cluster.start("b", join=[a.address])
    wait_for(lambda: states(a.address) == {"a": "alive", "b": "alive"}, 20, "b to join a")
    started = time.monotonic()
    c = cluster.start("c", join=[_dead_address()], extra=["--preset", "lan", "--join-timeout", str(JOIN_TIMEOUT_S)])
    joined = cluster.ops("join", "--peer", a.address, "--seed", c.address, timeout=30)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    wait_for(lambda: states(c.address) == {"a": "alive", "b": "alive", "c": "alive"}, 20, "c to learn the mesh")
    # c says it joined (without the fix it says nothing: at its join timeout it exits, closing stdout)
    # and is still serving past its join timeout.
    assert c.proc.stdout is not None
    line = c.proc.stdout.readline()
    assert line.startswith("peer c joined: 3 members"), f"c said {line!r}:\n{c.log()}"
    assert "through another member" in c.log()
    time.sleep(max(JOIN_TIMEOUT_S + 1.0 - (time.monotonic() - started), 0))
    assert c.proc.poll() is None, f"c exited ({c.proc.returncode}):\n{c.log()}"
    assert states(c.address)["c"] == "alive"
