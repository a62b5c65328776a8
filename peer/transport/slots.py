"""Who may hold a peer's connections: slots per identity and per remote address, a share for the sites.

gRPC bounds a server's connections only in total (`grpc.max_allowed_incoming_connections`), first
come first served: a reader holding 510 idle TLS connections, or anyone opening TCP connections
and never finishing TLS, left the sites none (issue 38). peer/transport/front.py therefore accepts
connections itself and relays each to the gRPC server; this table, pure (no sockets, no clock of
its own), decides which it keeps, and says why it closes one:

* a connection is **pending** from its accept until its first call shows who holds it (the
  certificate the call came with). Pending connections are bounded per remote address and in
  total; a new one over either bound pushes out the oldest pending one (of that address, else of
  all): an honest client calls within a round trip or two of connecting, so the oldest pending
  connection is the one most likely doing nothing. One still pending after `identify_s` is closed.
* a **site**'s connections are bounded per site, and otherwise only by the total;
* anything else (an operator, a reader) is bounded per identity and all together, and the
  connection whose first call goes over is closed.

Pending and non-site connections together stay below the total, so the rest, `site_share`, only
sites can take. Idle connections are closed by gRPC itself (`grpc.max_connection_idle_ms`, a GOAWAY
the client understands), which peer/transport/channels.py sets from `SlotLimits.idle_s`.
docs/decisions/security-connection-slots.md says why.

    .venv/bin/python -m pytest tests/unit/test_slots.py -q
"""

from __future__ import annotations

import collections
import enum
import ipaddress
import math
from dataclasses import dataclass


class Kind(enum.Enum):
    PENDING = "pending"
    """No call yet: who holds it is not known."""
    SITE = "site"
    OTHER = "other"
    """An operator's or a reader's (any certificate that is not a site's)."""


@dataclass(frozen=True)
class SlotLimits:
    """How many connections a peer's listener keeps, and of whom."""

    total: int = 512
    """Connections at once. A site holds two or three to each peer (gossip and consensus share one
    channel, the exchange another, a reconnect a third for a moment); `ops` one per command."""
    pending_total: int = 128
    """Connections not past their first call, of all addresses together."""
    pending_per_address: int = 16
    """Of one remote address (an IPv6 address's /64): a host's sites connect one by one, each within
    milliseconds; a loopback test mesh of eight starts well under it."""
    identify_s: float = 10.0
    """A connection with no call this long after its accept is closed: gRPC's handshake timeout
    (channels.HANDSHAKE_TIMEOUT_MS); an honest client calls right after its handshake."""
    per_site: int = 32
    """Connections of one site (its certificate's name): ten times what it needs."""
    others_total: int = 64
    """Connections of operators and readers, all together."""
    per_other: int = 8
    """Of one operator or reader: `ops status --watch` and a script beside it need one or two each."""
    idle_s: float = 120.0
    """A connection with no call open this long is closed (gRPC's GOAWAY; the client reconnects on
    its next call). A site's gossip channel is never idle that long; an exchange channel between
    rounds may be, and pays one handshake (two round trips) for it."""

    def __post_init__(self) -> None:
        for name in ("total", "pending_total", "pending_per_address", "per_site", "others_total", "per_other"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("identify_s", "idle_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if self.pending_per_address > self.pending_total or self.per_other > self.others_total:
            raise ValueError("a bound per address or identity cannot pass its total")
        if self.site_share < 1:
            raise ValueError(f"pending_total ({self.pending_total}) + others_total ({self.others_total}) leave "
                             f"the sites no share of total ({self.total})")

    @property
    def site_share(self) -> int:
        """Connections only sites can have, whatever everyone else holds."""
        return self.total - self.pending_total - self.others_total


@dataclass(frozen=True)
class Close:
    """A connection to close (or, from `admit`, refused), and why."""

    conn: int
    cause: str
    """What bound it hit, in a few fixed words: refusals are counted by (cause, who)."""
    who: str
    """The address or identity it is counted against."""
    reason: str
    """One line for the log and, for a call that is refused, the caller."""


@dataclass(frozen=True)
class Admission:
    admitted: bool
    closes: tuple[Close, ...]
    """Connections to close: the new one itself when it is not admitted, else the pending ones it
    pushed out."""


@dataclass
class _Conn:
    address: str
    since: float
    kind: Kind = Kind.PENDING
    name: str = ""
    """The site's name, or "reader bob"; empty for a pending one and a plaintext caller."""


def address_key(host: str) -> str:
    """What connections are counted per: the IPv4 address (an IPv4-mapped IPv6 one unwrapped), or an
    IPv6 address's /64, since one host is given a whole /64."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class Slots:
    """The connections a listener holds, by kind, address and identity."""

    def __init__(self, limits: SlotLimits = SlotLimits()) -> None:
        self.limits = limits
        self._conns: dict[int, _Conn] = {}
        self._pending: dict[int, None] = {}
        """Pending connections in accept order (dicts keep insertion order): the oldest first."""
        self._pending_at: dict[str, dict[int, None]] = {}
        """address -> its pending connections, oldest first."""
        self._held: collections.Counter[tuple[Kind, str]] = collections.Counter()
        """(kind, name) -> connections past their first call."""
        self._others = 0

    def __len__(self) -> int:
        return len(self._conns)

    def holding(self) -> dict[str, int]:
        """Connections by kind ("pending", "site", "other"), for status and tests."""
        counts = collections.Counter(c.kind.value for c in self._conns.values())
        return {kind.value: counts[kind.value] for kind in Kind}

    def held_by(self, kind: Kind, name: str) -> int:
        return self._held[(kind, name)]

    def admit(self, conn: int, address: str, now: float) -> Admission:
        """A connection from `address` was accepted."""
        limits = self.limits
        pushed: Close | None = None
        at = self._pending_at.get(address, {})
        if len(at) >= limits.pending_per_address:
            pushed = self._push_out(next(iter(at)), "pending per address",
                                    f"{address} has {len(at)} connections that made no call yet, the most one "
                                    "address may have here; the oldest is closed")
        elif len(self._pending) >= limits.pending_total:
            pushed = self._push_out(next(iter(self._pending)), "pending",
                                    f"{len(self._pending)} connections made no call yet, the most this peer "
                                    "keeps; the oldest is closed")
        elif len(self._conns) >= limits.total:
            if not self._pending:
                return Admission(False, (Close(conn, "total", address,
                                               f"{len(self._conns)} connections are open, the most this peer "
                                               "keeps, and every one has made its call"),))
            pushed = self._push_out(next(iter(self._pending)), "total",
                                    f"{len(self._conns)} connections are open, the most this peer keeps; the "
                                    "oldest that made no call yet is closed")
        self._conns[conn] = _Conn(address, now)
        self._pending[conn] = None
        self._pending_at.setdefault(address, {})[conn] = None
        return Admission(True, () if pushed is None else (pushed,))

    def identify(self, conn: int, kind: Kind, name: str) -> Close | None:
        """The first call on `conn` came from a `kind` named `name` (empty for a plaintext caller,
        which no per-site bound applies to). None if it keeps its slot; else a Close, and the
        connection is no longer counted. A connection identified already (or closed) is let be."""
        c = self._conns.get(conn)
        if c is None or c.kind is not Kind.PENDING:
            return None
        limits = self.limits
        held = self._held[(kind, name)]
        refused: Close | None = None
        if kind is Kind.SITE and name and held >= limits.per_site:
            refused = Close(conn, "per site", name, f"site {name} holds {held} connections here, the most one site may")
        elif kind is Kind.OTHER and held >= limits.per_other:
            refused = Close(conn, "per identity", name,
                            f"{name} holds {held} connections here, the most one operator or reader may")
        elif kind is Kind.OTHER and self._others >= limits.others_total:
            refused = Close(conn, "others", name,
                            f"operators and readers hold {self._others} connections here, the most they may "
                            "together (the rest is the sites')")
        if refused is not None:
            self.release(conn)
            return refused
        self._unpend(conn, c)
        c.kind, c.name = kind, name
        self._held[(kind, name)] += 1
        if kind is Kind.OTHER:
            self._others += 1
        return None

    def release(self, conn: int) -> None:
        """`conn` is closed (by either end); a second release is ignored."""
        c = self._conns.pop(conn, None)
        if c is None:
            return
        if c.kind is Kind.PENDING:
            self._unpend(conn, c)
            return
        key = (c.kind, c.name)
        self._held[key] -= 1
        if not self._held[key]:
            del self._held[key]
        if c.kind is Kind.OTHER:
            self._others -= 1

    def expire(self, now: float) -> list[Close]:
        """Pending connections accepted `identify_s` or longer before `now`; they are released."""
        closes: list[Close] = []
        for conn in list(self._pending):
            c = self._conns[conn]
            if c.since + self.limits.identify_s > now:
                break  # accept order: the rest are younger
            closes.append(Close(conn, "no call", c.address,
                                f"a connection from {c.address} made no call within {self.limits.identify_s:g} s "
                                "of its accept"))
            self.release(conn)
        return closes

    def next_deadline(self) -> float:
        """When `expire` has something to do (inf: no pending connection)."""
        oldest = next(iter(self._pending), None)
        return math.inf if oldest is None else self._conns[oldest].since + self.limits.identify_s

    def _push_out(self, conn: int, cause: str, reason: str) -> Close:
        """Closes the pending `conn` (counted against its address) to make room for a new one."""
        who = self._conns[conn].address
        self.release(conn)
        return Close(conn, cause, who, reason)

    def _unpend(self, conn: int, c: _Conn) -> None:
        del self._pending[conn]
        at = self._pending_at[c.address]
        del at[conn]
        if not at:
            del self._pending_at[c.address]
