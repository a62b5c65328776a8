"""How a peer reaches the others and is reached: its dialer (directly or through this host's
proxy), its tunnels to relays when its site accepts no inbound connection, and the relay it runs
for such sites when it is asked to (`relay_listen`).

The run file says which (peer/config.py: `reach`, `relays`, `proxy`, `relay_listen`); the parts
are in peer/transport/ (route, dialer, forwarder, tunnel, relay_server), and
docs/decisions/relays-for-outbound-sites.md says why they are built this way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import grpc

from peer.config import PeerConfig, parse_address
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.transport.channels import Credentials, open_channel
from peer.transport.dialer import Dialer, Egress
from peer.transport.relay_server import RelayServer
from peer.transport import route
from peer.transport.route import Direct
from peer.transport.tunnel import TunnelAgent

log = logging.getLogger("sitemesh.reach")

DIAL_BACK_S = 10.0
"""How long a member tries to reach a joining site where it advertises itself: a TLS handshake and
one call over a WAN, through a relay, take well under a second."""


class NoTunnel(OSError):
    """An outbound site none of whose relays took its tunnel: it would join unreachable."""


class NotReachable(OSError):
    """A member could not dial this site back where it advertises itself."""


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
            self.dialer.via_self = self.relay.local_route
            log.info("relaying for outbound sites on port %d", bound)
        if config.reach != "outbound":
            return
        local = route.local_host(config.listen.rsplit(":", 1)[0])
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

    async def dial_back(self, address: str, site: str) -> admin_pb2.DialBackReply:
        """Dials `address` and asks who answers (Admin/Status): reached if it is `site`."""
        started = time.monotonic()
        channel = open_channel(address, self._creds, self.dialer)
        try:
            status = await admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=DIAL_BACK_S)
        except grpc.aio.AioRpcError as err:
            return admin_pb2.DialBackReply(reached=False, error=f"{err.code().name}: {err.details()}",
                                           rtt_s=time.monotonic() - started, from_site=self._config.site)
        finally:
            await channel.close()
        rtt = time.monotonic() - started
        if status.self != site:
            return admin_pb2.DialBackReply(reached=False, error=f"site {status.self or '?'} answers there, not {site}",
                                           rtt_s=rtt, from_site=self._config.site)
        return admin_pb2.DialBackReply(reached=True, rtt_s=rtt, from_site=self._config.site)

    async def check_reachable(self, address: str, seeds: Iterable[str]) -> None:
        """Asks the first seed that answers to dial this peer back at `address`; NotReachable with
        the fix if it cannot. A seed that answers nothing or predates the check is passed over
        (joining through it says what is wrong with it)."""
        for seed in seeds:
            channel = open_channel(seed, self._creds, self.dialer)
            try:
                reply = await admin_pb2_grpc.AdminStub(channel).DialBack(
                    admin_pb2.DialBackRequest(from_site=self._config.site, address=address), timeout=2 * DIAL_BACK_S)
            except grpc.aio.AioRpcError as err:
                log.info("reachability not checked through %s (%s: %s)", seed, err.code().name, err.details())
                continue
            finally:
                await channel.close()
            if not reply.reached:
                fix = ("check that this site's relays forward to it (their logs)" if self.agent is not None else
                       'set reach = "outbound" with relays, or advertise another address (--advertise)')
                raise NotReachable(f"not reachable at {address} from {reply.from_site}: {reply.error}; {fix}")
            log.info("reachable at %s from %s (%.0f ms)", address, reply.from_site, 1000 * reply.rtt_s)
            return

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
