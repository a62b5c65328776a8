"""Sites that accept no inbound connection, reached through relays they dial out to: real peers,
real relays (`peer serve --role relay`), a real HTTP CONNECT proxy (Debian tinyproxy), mutual TLS.

On loopback every port is dialable, so what makes a site "outbound" here is what it advertises
(relay://SITE@RELAYS): every other peer reaches it only through a relay, and the relays' own
counts and logs show the traffic went there. tests/integration/test_relay_netns.py puts the sites
in network namespaces where nftables really drops inbound connections.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.peers import Cluster, Relay, audit, commits, free_port, outbound, wait_for
from tests.integration.test_training_mesh import _committed_samples, _epoch_samples_of

DOCS = 24  # ~420 samples, ~17 rounds: rounds with every site remain after the relay's death
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "8", "--batch-size", "1",
         "--round-deadline", "60", "--start-sites", "3"]


@pytest.fixture
def tinyproxy(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real HTTP CONNECT proxy on loopback: (its URL, its log)."""
    binary = shutil.which("tinyproxy")
    if binary is None:
        pytest.skip("tinyproxy is not installed (scripts/setup_slurm_packages.sh installs it as root)")
    port, log = free_port(), tmp_path / "tinyproxy.log"
    conf = tmp_path / "tinyproxy.conf"
    conf.write_text(f'Port {port}\nListen 127.0.0.1\nTimeout 600\nAllow 127.0.0.1\nLogFile "{log}"\n'
                    "LogLevel Connect\nMaxClients 200\n")
    proc = subprocess.Popen([binary, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _listening(port), 10, "tinyproxy to listen")
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _alive(cluster: Cluster, site: str) -> set[str]:
    doc = cluster.status(cluster.peers[site].address)
    return {m["site"] for m in doc["members"] if m["state"] == "alive"}


@pytest.mark.timeout(300)
def test_outbound_sites_join_through_relays_and_a_proxy_and_outlive_a_relay(tmp_path: Path,
                                                                          tinyproxy: tuple[str, Path]) -> None:
    proxy, proxy_log = tinyproxy
    cluster = Cluster(tmp_path, tls=True)
    relay_port = free_port()
    try:
        # a is direct and relays too; r1 only relays. b and c name r1 first, so r1 carries what they
        # send each other; a reaches them through its own relay (they dial back straight to a).
        a = cluster.start("a", extra=["--round-interval", "0.5", "--relay-listen", f"127.0.0.1:{relay_port}"])
        r1 = Relay(cluster, "r1")
        both = [r1.address, f"127.0.0.1:{relay_port}"]
        b = cluster.start("b", join=[a.address], extra=["--round-interval", "0.5", *outbound(list(both))])
        c = cluster.start("c", join=[a.address], extra=["--round-interval", "0.5", *outbound(list(both), proxy)])
        assert b.address == f"relay://b@{','.join(both)}"
        wait_for(lambda: all(_alive(cluster, s) == {"a", "b", "c"} for s in "abc"), 60, "three members alive")
        # An operator's tool reaches an outbound site by its relayed address too, and sees each
        # site's path and the round trip its probes measured.
        view = {m["site"]: m for m in cluster.status(c.address)["members"]}
        assert view["c"]["path"].startswith(f"outbound via {r1.address} (up), 127.0.0.1:{relay_port} (up)")
        assert view["b"]["path"] == f"via relay {r1.address}" and view["a"]["path"] == f"via proxy {proxy[7:]}"
        wait_for(lambda: all(m["rtt_ms"] is not None for m in cluster.status(a.address)["members"] if m["site"] != "a"),
                 30, "a's probes to measure every round trip")
        paths_from_a = {m["site"]: m["path"] for m in cluster.status(a.address)["members"]}
        assert paths_from_a["a"].startswith("direct, relaying")
        assert paths_from_a["b"] == paths_from_a["c"] == "via this peer's relay", paths_from_a
        # c reached its relays through the proxy only: the proxy's log shows its CONNECTs to them.
        connects = proxy_log.read_text()
        assert f"CONNECT {r1.address}" in connects and f"CONNECT 127.0.0.1:{relay_port}" in connects

        r1.kill()  # kill -9 of the relay carrying b and c to each other: they move to a's relay
        committed = {s: cluster.status(cluster.peers[s].address)["committed_round"] for s in "abc"}
        wait_for(lambda: all(cluster.status(cluster.peers[s].address)["committed_round"] >= committed[s] + 6
                             for s in "abc"), 60, "rounds to go on after the relay died")
        assert all(_alive(cluster, s) == {"a", "b", "c"} for s in "abc"), "nobody was taken for dead"
        assert "reaching c through relay" in b.log() and "reaching b through relay" in c.log()
    finally:
        cluster.close()


def test_an_outbound_site_that_no_relay_takes_does_not_join_half_working(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, tls=True)
    try:
        a = cluster.start("a")
        dead = f"127.0.0.1:{free_port()}"
        started = time.monotonic()
        with pytest.raises(AssertionError, match="did not start") as err:
            cluster.start("b", join=[a.address], extra=[*outbound([dead]), "--join-timeout", "3"])
        assert time.monotonic() - started < 60
        log = (tmp_path / "b.log").read_text()
        assert f"no relay took b's tunnel within 3 s ({dead}: " in log and "peer serve --role relay" in log, log
        assert str(err.value)
    finally:
        cluster.close()


def test_a_site_advertising_an_address_nobody_dials_is_refused_with_the_fix(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, tls=True)
    try:
        a = cluster.start("a")
        wrong = f"127.0.0.1:{free_port()}"  # nothing listens there: a typo, or a compute node's name
        b = cluster.start("b", join=[a.address], extra=["--advertise", wrong])
        assert b.proc.wait(timeout=60) == 2
        log = b.log()
        assert f"not reachable at {wrong} from a: UNAVAILABLE" in log, log
        assert 'set reach = "outbound" with relays, or advertise another address' in log
        assert "b" not in {m["site"] for m in cluster.status(a.address)["members"]}, "b never joined"
    finally:
        cluster.close()


@pytest.mark.timeout(900)
def test_three_outbound_sites_train_through_two_relays_and_lose_nothing_when_one_dies(
        tmp_path: Path, tinyproxy: tuple[str, Path]) -> None:
    proxy, proxy_log = tinyproxy
    cluster = Cluster(tmp_path, tls=True, preset="lan")
    try:
        r1, r2 = Relay(cluster, "r1"), Relay(cluster, "r2")
        relays: list[Relay | str] = [r1, r2]
        a = cluster.start("a", extra=[*TRAIN, *outbound(relays)])
        cluster.start("b", join=[a.address], extra=[*TRAIN, *outbound(relays)])
        cluster.start("c", join=[a.address], extra=[*TRAIN, *outbound(relays, proxy)])  # out only through the proxy

        def rounds_with_all() -> list[int]:
            return [c.round for c in commits(tmp_path / "a") if len(c.contributors) == 3]

        wait_for(lambda: len(rounds_with_all()) >= 1, 400, "a round every site contributed to")
        before = len(rounds_with_all())
        r1.kill()  # every site named r1 first: it carried the exchange
        wait_for(lambda: len(rounds_with_all()) >= before + 2, 400, "rounds with every site after the relay died")
        logs = "".join(cluster.peers[s].log() for s in "abc")
        assert f"through relay {r2.address} now (relay {r1.address}: " in logs, "r1 carried the sites until it died"
        wait_for(lambda: _done(cluster), 600, "the epoch to complete")
        wait_for(lambda: len({cluster.status(cluster.peers[s].address)["training"]["applied_round"]
                              for s in "abc"}) == 1, 120, "every site to apply the last round")
        hashes = {cluster.status(cluster.peers[s].address)["training"]["weights_hash"] for s in "abc"}
        assert len(hashes) == 1, "I7: every peer holds the same θ"
        counts = _committed_samples(tmp_path / "a")
        assert max(counts.values()) == 1 and set(counts) == _epoch_samples_of(DOCS)
        epoch = audit(*(tmp_path / s for s in "abc"))
        assert (epoch["duplicated"], epoch["lost"]) == (0, 0)
        assert "forwarded" in r2.stop()
        assert f"CONNECT {r2.address}" in proxy_log.read_text()
    finally:
        cluster.close()


def _done(cluster: Cluster) -> bool:
    return bool(cluster.status(cluster.peers["a"].address)["training"]["epoch_complete"])
