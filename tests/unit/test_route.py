"""Addresses that carry their route (peer/transport/route.py) and the egress proxy choice (dialer.Egress)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.config import ConfigError, PeerConfig, check_peer_address
from peer.transport import route
from peer.transport.dialer import Egress
from peer.transport.route import Direct, Relayed


def test_direct_and_relayed_addresses_parse() -> None:
    assert route.parse("10.0.0.5:7001") == Direct("10.0.0.5", 7001)
    assert route.parse("[::1]:7001") == Direct("::1", 7001)
    assert route.parse("relay://lumi@r1.example.org:7100,[::1]:7101") == Relayed(
        "lumi", (Direct("r1.example.org", 7100), Direct("::1", 7101)))
    assert route.text(Direct("::1", 7101)) == "[::1]:7101"
    assert route.server_name("relay://lumi@r1:7100") == "lumi"
    assert route.server_name("node7.example:7001") == "node7.example"
    # A listener's own host reaches it on loopback when it is bound to a wildcard.
    assert [route.local_host(h) for h in ("", "0.0.0.0", "::", "[::]")] == ["127.0.0.1"] * 4
    assert route.local_host("10.0.0.5") == "10.0.0.5" and route.local_host("[::1]") == "::1"


@pytest.mark.parametrize("bad, says", [
    ("relay://lumi", "expected relay://SITE@"),
    ("relay://@r1:7100", "expected relay://SITE@"),
    ("relay://lu mi@r1:7100", "expected relay://SITE@"),
    ("relay://lumi@", "names no relay"),
    ("relay://lumi@r1", "not HOST:PORT"),
    ("relay://lumi@r1:99999", "not HOST:PORT"),
    ("relay://lumi@" + ",".join(f"r{i}:7100" for i in range(9)), "at most 8"),
    ("host-without-port", "not HOST:PORT"),
])
def test_bad_addresses_say_what_is_wrong(bad: str, says: str) -> None:
    with pytest.raises(route.BadRoute, match=says):
        route.parse(bad)


def test_outbound_site_config_advertises_its_relays_and_refuses_what_cannot_work(tmp_path: Path) -> None:
    base = {"site": "lumi", "certs": tmp_path}
    config = PeerConfig(**base, reach="outbound", relays=("r1:7100", "r2:7100"))
    assert config.dial_address("127.0.0.1:7001") == "relay://lumi@r1:7100,r2:7100"
    assert PeerConfig(**base).dial_address("127.0.0.1:7001") == "127.0.0.1:7001"
    for fields, says in [
        ({"reach": "outbound"}, "needs relays"),
        ({"reach": "outbound", "relays": ("r1:7100",), "advertise": "x:1"}, "advertises its relays"),
        ({"relays": ("r1:7100",)}, "relays are for reach"),
        ({"reach": "sideways"}, "use one of direct, outbound"),
        ({"reach": "outbound", "relays": ("r1",)}, "malformed relay address"),
        ({"proxy": "http://proxy"}, "give http://HOST:PORT"),
    ]:
        with pytest.raises(ConfigError, match=says):
            PeerConfig(**{**base, **fields})
    with pytest.raises(ConfigError, match="give --certs"):
        PeerConfig(site="lumi", insecure=True, reach="outbound", relays=("r1:7100",))
    check_peer_address("relay://lumi@r1:7100")
    with pytest.raises(ConfigError, match="malformed seed address"):
        check_peer_address("relay://lumi@", "seed address")


def test_egress_proxy_honours_no_proxy_and_never_proxies_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("https_proxy", "http://proxy.site.example:3128/")
    monkeypatch.setenv("no_proxy", ".cluster.local, login1")
    egress = Egress.from_env()
    assert egress.proxy == Direct("proxy.site.example", 3128)
    assert egress.proxy_for("relay.example.org") == Direct("proxy.site.example", 3128)
    assert egress.proxy_for("node1.cluster.local") is None
    assert egress.proxy_for("cluster.local") is None
    assert egress.proxy_for("login1") is None
    assert egress.proxy_for("127.0.0.1") is None
    assert Egress.from_env("http://other:8080", no_proxy="*").proxy_for("relay.example.org") is None
    assert Egress.from_env("http://other:8080", no_proxy="").proxy_for("127.0.0.1") == Direct("other", 8080)
    monkeypatch.delenv("https_proxy")
    assert Egress.from_env().proxy is None
    with pytest.raises(ValueError, match="HTTP CONNECT proxy"):
        Egress.from_env("socks5://x")
