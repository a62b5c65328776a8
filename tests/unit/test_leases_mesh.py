"""A synchronous in-memory mesh of lease cores for unit tests: manual clock, FIFO delivery, cut links."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from peer.audit import EpochLedger
from peer.election import SiteId
from peer.lease_client import LeaseClient
from peer.lease_types import LeaseEvent, Message, Send
from peer.leases import LeaseConfig, LeaseOwner
from peer.ring import RingView

CFG = LeaseConfig(ttl=10.0, renew_every=2.0, retry_after=1.0, max_grant=3)
UNIVERSE = {100 + i: 8 for i in range(12)}


class Mesh:
    def __init__(self, sites: Iterable[str], universe: dict[int, int] | None = None) -> None:
        self.universe = universe or UNIVERSE
        self.now = 0.0
        self.ledgers: dict[SiteId, EpochLedger] = {}
        self.owners: dict[SiteId, LeaseOwner] = {}
        self.clients: dict[SiteId, LeaseClient] = {}
        self.queue: deque[tuple[SiteId, Send]] = deque()
        self.cut: set[SiteId] = set()
        """Sites whose messages (both ways) are lost."""
        self.events: list[LeaseEvent] = []
        self.delivered: list[tuple[SiteId, Message]] = []
        self.views: list[RingView] = []
        for s in sites:
            self.add(SiteId(s), amnesiac=False)

    def add(self, s: SiteId, amnesiac: bool) -> None:
        ledger = EpochLedger(self.universe)
        self.ledgers[s] = ledger
        self.owners[s] = LeaseOwner(s, ledger, CFG, amnesiac=amnesiac)
        self.clients[s] = LeaseClient(s, ledger, CFG, prefetch=2)

    def crash(self, s: str) -> None:
        del self.owners[SiteId(s)], self.clients[SiteId(s)], self.ledgers[SiteId(s)]

    def effects(self, frm: SiteId, effs: Iterable[object]) -> None:
        for e in effs:
            if isinstance(e, LeaseEvent):
                self.events.append(e)
            else:
                assert isinstance(e, Send)
                self.queue.append((frm, e))

    def set_view(self, members: Iterable[str]) -> RingView:
        v = RingView.of(len(self.views) + 1, members)
        prev = self.views[-1] if self.views else None
        self.views.append(v)
        for s in list(self.owners):
            self.effects(s, self.owners[s].set_view(v, 1, self.now, previous=prev))
            self.effects(s, self.clients[s].set_view(v, 1, self.now))
        return v

    def send(self, frm: str, msg: Message, to: str) -> None:
        self.queue.append((SiteId(frm), Send(SiteId(to), msg)))

    def run(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if not self.queue:
                return
            frm, e = self.queue.popleft()
            if frm in self.cut or e.to in self.cut or e.to not in self.owners:
                continue
            self.delivered.append((e.to, e.msg))
            self.effects(e.to, self.owners[e.to].receive(e.msg, self.now))
            self.effects(e.to, self.clients[e.to].receive(e.msg, self.now))
        raise AssertionError("mesh did not settle")

    def tick(self, dt: float, sites: Iterable[str] | None = None) -> None:
        self.now += dt
        for s in [SiteId(x) for x in sites] if sites is not None else list(self.owners):
            self.effects(s, self.owners[s].tick(self.now))
            self.effects(s, self.clients[s].tick(self.now))
        self.run()

    def commit(self, round_: int, contributors: list[tuple[str, tuple]]) -> None:
        for s in list(self.owners):
            self.ledgers[s].apply(round_, [(SiteId(c), rs) for c, rs in contributors])
            self.effects(s, self.owners[s].on_commit(self.now))
            self.effects(s, self.clients[s].on_commit(self.now))
        self.run()

    def primary_of(self, block: int) -> SiteId:
        p = self.views[-1].primary(block)
        assert p is not None
        return p
