"""A synchronous in-memory mesh of lease cores for unit tests: manual clock, FIFO delivery, cut links."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from peer.core.audit import EpochLedger
from peer.core.election import SiteId
from peer.core.lease_client import LeaseClient
from peer.core.lease_types import GrantRequest, LeaseEvent, Message, Send, spans
from peer.core.lease_config import LeaseConfig
from peer.core.leases import LeaseOwner
from peer.core.ring import RingView
from peer.core.vouchers import VoucherKeys

CFG = LeaseConfig(ttl=10.0, renew_every=2.0, retry_after=1.0, max_grant=3)
UNIVERSE = {100 + i: 8 for i in range(12)}


class Mesh:
    def __init__(self, sites: Iterable[str], universe: dict[int, int] | None = None,
                 keys: dict[str, VoucherKeys] | None = None) -> None:
        self.universe = universe or UNIVERSE
        self.keys = {SiteId(s): k for s, k in (keys or {}).items()}
        """Each site's voucher keys (absent: it vouches unsigned, as in an insecure run)."""
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
        self.paces: dict[str, float] = {}
        """LeaseHeader.pace of the hand-made messages of tests/unit/test_leases.py (absent: 0)."""
        for s in sites:
            self.add(SiteId(s), amnesiac=False)

    def add(self, s: SiteId, amnesiac: bool, boot: int = 0) -> None:
        ledger = EpochLedger(self.universe)
        self.ledgers[s] = ledger
        self.owners[s] = LeaseOwner(s, ledger, CFG, amnesiac=amnesiac, boot=boot, keys=self.keys.get(s))
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


# --- the holder core driven through the mesh ---


def _settle(m: Mesh, rounds: int = 4) -> None:
    for _ in range(rounds):
        m.tick(0.1)


def test_holder_prefetches_starts_one_block_trains_and_contributes_what_was_vouched() -> None:
    from peer.core.admission import admit_round
    from peer.core.lease_types import LeaseState

    m = Mesh("abc")
    m.set_view("abc")
    _settle(m)
    a = m.clients[SiteId("a")]
    assert len(a.held) == 2 and sum(h.started for h in a.held.values()) == 1
    got = a.next_samples(5, m.now)
    assert sum(x.end - x.start for _, sp in got for x in sp) == 5 and len(got) == 1
    (block, _), = got
    m.effects(SiteId("a"), a.end_round(1, m.now))
    m.run()
    c = a.offer(1)
    assert c is not None and [(r.block_id, r.start, r.end) for r in c.ranges] == [(block, 0, 5)]
    owner = m.primary_of(block)
    assert m.owners[owner].records[block].state is LeaseState.STARTED, "3 samples left: kept"
    (d,) = admit_round(1, [c], m.ledgers[SiteId("a")])
    assert d.included, d.reason


def test_holder_drops_a_lease_the_owner_reports_lost_and_its_samples_are_not_vouched() -> None:
    m = Mesh("abc")
    m.set_view("abc")
    _settle(m)
    a = m.clients[SiteId("a")]
    (block, _), = a.next_samples(2, m.now)
    owner = m.owners[m.primary_of(block)]
    rec = owner.records[block]
    owner.records[block] = rec.bumped(1, holder=SiteId("b"), generation=rec.generation + 1)  # stolen/reclaimed
    m.tick(CFG.renew_every)
    assert block not in a.held and any("stale: generation" in r for r in a.lost_reasons)
    m.effects(SiteId("a"), a.end_round(1, m.now))
    m.run()
    c = a.offer(1)
    assert c is not None and all(r.block_id != block for r in c.ranges)


def test_holder_stops_training_when_its_lease_runs_out_on_its_own_clock() -> None:
    m = Mesh("abc")
    m.set_view("abc")
    _settle(m)
    a = m.clients[SiteId("a")]
    m.cut = {SiteId("a")}  # no renewal gets through
    m.tick(0.8 * CFG.ttl - 0.5, sites=["a"])
    assert a.next_samples(1, m.now), "still valid"
    m.tick(1.0, sites=["a"])
    assert a.next_samples(1, m.now) == () and not a.held


def test_graceful_leave_releases_every_lease() -> None:
    from peer.core.lease_types import EventKind

    m = Mesh("abc")
    m.set_view("abc")
    _settle(m)
    a = m.clients[SiteId("a")]
    held = set(a.held)
    m.effects(SiteId("a"), a.release_all(m.now))
    m.run()
    released = {e.block for e in m.events if e.kind is EventKind.RELEASE and e.site == "a"}
    assert held and released == held
    assert all(m.owners[m.primary_of(b)].records[b].holder is None for b in held)
    sent = len(m.delivered)
    m.tick(CFG.retry_after * 3)
    assert not any(isinstance(msg, GrantRequest) and msg.header.site == "a" for _, msg in m.delivered[sent:])
    assert not a.held, "a leaving site takes no new lease"


def test_a_block_trained_under_two_leases_is_claimed_under_the_newest() -> None:
    from peer.core.lease_client import Held
    from peer.core.lease_types import Gen, Trained

    m = Mesh("abc")
    m.set_view("abc")
    _settle(m)
    a = m.clients[SiteId("a")]
    (block, _), = a.next_samples(2, m.now)
    old = a.held[block]
    newer = Gen(old.gen + 7)
    a.held[block] = Held(block, newer, old.spans, old.valid_until, started=True)  # lost, then granted again
    a.next_samples(2, m.now)
    sent = len(m.delivered)
    m.effects(SiteId("a"), a.end_round(1, m.now))
    m.run()
    claims = [c for _, msg in m.delivered[sent:] if isinstance(msg, Trained) for c in msg.claims
              if c.lease.block_id == block]
    assert [c.lease.generation for c in claims] == [newer]


def test_samples_taken_but_not_trained_go_back_on_the_lease_and_are_not_claimed() -> None:
    from peer.core.samples import SampleRange

    m = Mesh("abc")
    m.set_view("abc")
    _settle(m)
    a = m.clients[SiteId("a")]
    (block, taken), = a.next_samples(5, m.now)
    # A time-boxed round reached samples 0..2 only: 2..5 go back, ahead of the lease's other samples.
    a.untake([SampleRange(block, 2, 5)])
    m.effects(SiteId("a"), a.end_round(1, m.now))
    m.run()
    c = a.offer(1)
    assert c is not None and [(r.block_id, r.start, r.end) for r in c.ranges] == [(block, 0, 2)]
    (again, spans), = a.next_samples(3, m.now)
    assert again == block and [(x.start, x.end) for x in spans] == [(2, 5)], "trained next, from the same lease"


def test_at_the_epochs_tail_a_holder_gives_back_what_it_did_not_take_to_an_idle_site() -> None:
    """One block, started by `a`; the other sites find nothing free or stealable. Its owner asks `a`
    at its next renewal; `a` takes no more from it and, at its round's end, claims what it trained
    without keeping the lease, so the rest goes to a site that asked."""
    m = Mesh("abc", universe={100: 8})
    m.set_view("abc")
    _settle(m)
    holder = next(s for s, c in m.clients.items() if c.held)
    h = m.clients[holder]
    for site, client in m.clients.items():
        client.trained_at(1.0 if site == holder else 4.0)  # the idle sites are faster
    (block, _), = h.next_samples(2, m.now)
    # The idle sites ask, steal and find nothing; they ask the owners in turn, so it takes a turn
    # round the three for the block's owner to hear one of them with its pace set.
    for _ in range(3 * (int(CFG.retry_after / 0.1) + 2)):
        m.tick(0.1)
    m.tick(CFG.renew_every)
    assert h.held[block].wanted, "the owner asked for the rest back at renewal"
    m.effects(holder, h.end_round(1, m.now))
    m.run()
    assert block not in h.held
    c = h.offer(1)
    assert c is not None and [(r.start, r.end) for r in c.ranges] == [(0, 2)], "what it trained is claimed"
    for _ in range(3 * (int(CFG.retry_after / 0.1) + 2)):  # a turn round the owners again
        m.tick(0.1)
    others = [s for s, cl in m.clients.items() if s != holder and block in cl.held]
    assert len(others) == 1 and m.clients[others[0]].held[block].spans == spans((2, 8)), others

