"""How a peer reaches the others and is reached: its dialer (directly or through this host's
proxy), its tunnels to relays when its site accepts no inbound connection, and the relay it runs
for such sites when it is asked to (`relay_listen`).

The run file says which (peer/config.py: `reach`, `relays`, `proxy`, `relay_listen`); the parts
are in peer/transport/ (route, dialer, forwarder, tunnel, relay_server), and
docs/decisions/relays-for-outbound-sites.md says why they are built this way.
"""

from __future__ import annotations

import logging

from peer.config import PeerConfig, parse_address
from peer.transport.channels import Credentials
from peer.transport.dialer import Dialer, Egress
from peer.transport.relay_server import RelayServer
from peer.transport.route import Direct
from peer.transport.tunnel import TunnelAgent

log = logging.getLogger("sitemesh.reach")

_UNSPECIFIED = ("", "0.0.0.0", "::", "[::]")


class NoTunnel(OSError):
    """An outbound site none of whose relays took its tunnel: it would join unreachable."""


class Reach:
    """One peer's ways in and out (built from its config; started once its servers are bound)."""

    def __init__(self, config: PeerConfig, creds: Credentials) -> None:
        self._config = config
        self._creds = creds
        self.dialer = Dialer(Egress.from_env(config.proxy))
        self.agent: TunnelAgent | None = None
        self.relay: RelayServer | None = None

    async def start(self, grpc_port: int, bulk_port: int | None, wait_s: float) -> None:
        """Starts the relay (if asked for) and the tunnels (outbound), and waits up to `wait_s` for a
        first tunnel: NoTunnel, naming each relay's failure and the fix, if none came up."""
        config = self._config
        if config.relay_listen:
            host, port = parse_address(config.relay_listen, "relay_listen address")
            self.relay = RelayServer(self._creds)
            bound = await self.relay.start(host.strip("[]"), port)
            log.info("relaying for outbound sites on port %d", bound)
        if config.reach != "outbound":
            return
        listen_host = config.listen.rsplit(":", 1)[0]
        local = "127.0.0.1" if listen_host in _UNSPECIFIED else listen_host.strip("[]")
        services = {"grpc": Direct(local, grpc_port)}
        if bulk_port is not None:
            services["bulk"] = Direct(local, bulk_port)
        self.agent = TunnelAgent(config.site, config.relays, self._creds, self.dialer, services)
        self.agent.start()
        if not await self.agent.wait_up(wait_s):
            whys = "; ".join(f"{s.relay}: {s.why}" for s in self.agent.states.values())
            await self.close()
            raise NoTunnel(f"no relay took {config.site}'s tunnel within {wait_s:.0f} s ({whys}): start a relay "
                           "(`peer serve --role relay`) at one of the relays named, or fix the proxy setting")

    def describe(self) -> str:
        """One line for `ops status`: how this peer is reached."""
        if self.agent is None:
            return "direct" + (f", relaying on {self._config.relay_listen}" if self.relay is not None else "")
        return "outbound via " + ", ".join(
            f"{s.relay} ({'up' if s.up else 'down: ' + s.why})" for s in self.agent.states.values())

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.close()
        if self.relay is not None:
            await self.relay.close()
        self.dialer.close()
