"""The membership core against a site of the run that lies (issue 38, probe 4), with a manual clock.

A hostile site holds a valid certificate, so its messages name it truthfully, but the rumours they
relay are whatever it likes. Whatever it sends: no exception, no incarnation above the limit, a
refused rumour changes nothing (a twin core that got the message without it ends in the same
state), and the accused can still refute and comes back ALIVE. Honest cases stay believed: a member
far ahead speaking for itself, a site first heard of, a restarted peer's previous life.

    .venv/bin/python -m pytest tests/unit/test_membership_hostile.py -q
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer.core.membership import (
    Ack,
    Effect,
    MemberMeta,
    Membership,
    MembershipConfig,
    MemberState,
    MemberUpdate,
    Message,
    Nack,
    Ping,
    PingReq,
    PushPull,
    RefusalKind,
    Rejected,
    Send,
)
from peer.core.membership_guard import (
    CATCH_UP_LIMIT,
    INCARNATION_LIMIT,
    MAX_INCARNATION_JUMP,
    MAX_RELAYS,
    RELAYS_PER_SENDER,
    TABLE_LIMIT,
)

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
CFG = MembershipConfig.lan()
LIMIT = INCARNATION_LIMIT
WIRE_BOUND = 2**62  # peer/transport/wire.py MAX_COUNTER


def meta(site: str, address: str | None = None) -> MemberMeta:
    return MemberMeta(site, address or f"{site}:1")


def rumour(site: str, state: MemberState, inc: int, frm: str = "b", m: MemberMeta | None = None) -> MemberUpdate:
    return MemberUpdate(site, state, inc, m or meta(site), frm)


def member(cfg: MembershipConfig = CFG, others: tuple[str, ...] = ("b", "c", "d", "e")) -> Membership:
    """Peer a, joined, knowing `others` ALIVE at incarnation 0."""
    m = Membership(meta("a"), cfg, random.Random(1), 0.0)
    m.join(["seed:1"], 0.0)
    m.receive(PushPull(others[0], f"{others[0]}:1", tuple(rumour(o, ALIVE, 0, o) for o in others),
                       reply=True), 0.0)
    return m


def view(m: Membership, site: str) -> tuple[MemberState, int] | None:
    v = m.member(site)
    return None if v is None else (v.state, v.incarnation)


def state(m: Membership) -> tuple[Any, ...]:
    """Everything a rumour could change."""
    return (m.incarnation, m.health_multiplier, m.members(), m._queue.pending(),
            sorted((s, x.incarnation, x.deadline, x.confirmations) for s, x in m._suspicions.items()),
            sorted(m._relays), len(m._tombstones), list(m._probe_order))


def refusals(effects: list[Effect]) -> list[Rejected]:
    return [e for e in effects if isinstance(e, Rejected)]


def carry(kind: str, sender: str, updates: tuple[MemberUpdate, ...], seq: int = 900) -> Message:
    """`updates` in a message of `kind` sent by `sender` to peer a."""
    if kind == "Ping":
        return Ping(seq, sender, f"{sender}:1", "a", updates)
    if kind == "Ack":
        return Ack(seq, sender, updates)
    if kind == "PingReq":
        return PingReq(seq, sender, f"{sender}:1", "e", "e:1", updates)
    return PushPull(sender, f"{sender}:1", updates)


# -- (a) one hostile rumour at a time ---------------------------------------------------------------

# (name, rumour, sender, refusal kind or None if believed, what a then holds for the subject)
CASES: list[tuple[str, MemberUpdate, str, RefusalKind | None, tuple[MemberState, int] | None]] = [
    ("the probe: c LEFT at the wire bound", rumour("c", LEFT, WIRE_BOUND), "b", RefusalKind.OVER_LIMIT, (ALIVE, 0)),
    ("LEFT at the limit: c could not refute", rumour("c", LEFT, LIMIT), "b", RefusalKind.OVER_LIMIT, (ALIVE, 0)),
    ("DEAD at the limit", rumour("c", DEAD, LIMIT), "b", RefusalKind.OVER_LIMIT, (ALIVE, 0)),
    ("ALIVE above the limit, even from c", rumour("c", ALIVE, LIMIT + 1, "c"), "c", RefusalKind.OVER_LIMIT,
     (ALIVE, 0)),
    ("ALIVE at 2^64", rumour("c", ALIVE, 2**64), "b", RefusalKind.OVER_LIMIT, (ALIVE, 0)),
    ("DEAD far ahead", rumour("c", DEAD, MAX_INCARNATION_JUMP + 1), "b", RefusalKind.JUMP, (ALIVE, 0)),
    ("SUSPECT far ahead", rumour("c", SUSPECT, 10**6), "b", RefusalKind.JUMP, (ALIVE, 0)),
    ("LEFT far ahead, relayed", rumour("c", LEFT, 5000, "c"), "b", RefusalKind.JUMP, (ALIVE, 0)),
    ("ALIVE far ahead at b's address", rumour("c", ALIVE, 5000, m=meta("c", "b:1")), "b", RefusalKind.JUMP,
     (ALIVE, 0)),
    ("metadata of another site", rumour("c", ALIVE, 1, m=meta("b")), "b", RefusalKind.MALFORMED, (ALIVE, 0)),
    ("no site", MemberUpdate("", ALIVE, 1, None, "b"), "b", RefusalKind.MALFORMED, None),
    ("negative incarnation", rumour("c", DEAD, -1), "b", RefusalKind.MALFORMED, (ALIVE, 0)),
    ("about us at the limit", rumour("a", SUSPECT, LIMIT), "b", RefusalKind.OVER_LIMIT, (ALIVE, 0)),
    ("about us beyond catch-up", rumour("a", DEAD, CATCH_UP_LIMIT + 1), "b", RefusalKind.JUMP, (ALIVE, 0)),
    ("a site first heard of, beyond catch-up", rumour("z", ALIVE, CATCH_UP_LIMIT + 1), "b", RefusalKind.JUMP,
     None),
    # Honest, believed:
    ("DEAD at the jump bound", rumour("c", DEAD, MAX_INCARNATION_JUMP), "b", None, (DEAD, MAX_INCARNATION_JUMP)),
    ("LEFT relayed at + 1 (unverifiable, refuted below)", rumour("c", LEFT, 1, "c"), "b", None, (LEFT, 1)),
    ("c itself after a long absence", rumour("c", ALIVE, 5000, "c"), "c", None, (ALIVE, 5000)),
    ("c's own LEFT far ahead", rumour("c", LEFT, 5000, "c"), "c", None, (LEFT, 5000)),
    ("c itself up to the limit", rumour("c", ALIVE, LIMIT, "c"), "c", None, (ALIVE, LIMIT)),
    ("a site first heard of", rumour("z", ALIVE, 5000), "b", None, (ALIVE, 5000)),
    ("our previous life (a restart)", rumour("a", DEAD, 5000), "b", None, (ALIVE, 5001)),
]


@pytest.mark.parametrize("kind", ["Ping", "Ack", "PingReq", "PushPull"])
@pytest.mark.parametrize("name,u,sender,refused,held", CASES, ids=[c[0] for c in CASES])
def test_one_rumour(name: str, u: MemberUpdate, sender: str, refused: RefusalKind | None,
                    held: tuple[MemberState, int] | None, kind: str) -> None:
    m, twin = member(), member()
    effects = m.receive(carry(kind, sender, (u,)), 1.0)
    twin_effects = twin.receive(carry(kind, sender, ()), 1.0)
    if kind == "PushPull" and held is not None and held[0] is DEAD and u.site != "a":
        held = (SUSPECT, held[1])  # a newer DEAD in a table is verified by our own detector
    assert view(m, u.site) == held
    assert m.incarnation <= LIMIT and all(v.incarnation <= LIMIT for v in m.members())
    if refused is None:
        assert not refusals(effects)
        return
    # Refused: reported once, and nothing else differs from the twin that never saw it.
    (r,) = refusals(effects)
    assert (r.kind, r.from_site, r.what) == (refused, sender, kind)
    assert [e for e in effects if not isinstance(e, Rejected)] == twin_effects
    assert state(m) == state(twin)


@pytest.mark.parametrize("name,u,sender,refused,held", CASES, ids=[c[0] for c in CASES])
def test_the_accused_still_refutes(name: str, u: MemberUpdate, sender: str, refused: RefusalKind | None,
                                   held: tuple[MemberState, int] | None) -> None:
    """After any of the rumours, the subject's own ALIVE one above what a holds brings it back."""
    m = member()
    m.receive(carry("Ping", sender, (u,)), 1.0)
    if u.site == "a" or not u.site or held is None:
        assert m.member("a") is not None and m.incarnation <= LIMIT  # nothing against us stands
        for v in m.members():
            assert v.site == "a" or v.state is ALIVE
        return
    inc = min(held[1] + 1, LIMIT)
    m.receive(Ping(901, u.site, f"{u.site}:1", "a", (rumour(u.site, ALIVE, inc, u.site),)), 2.0)
    assert view(m, u.site) == (ALIVE, inc)


def test_our_incarnation_answers_every_believed_accusation_within_the_limit() -> None:
    m = member()
    m.receive(Ping(1, "b", "b:1", "a", (rumour("a", SUSPECT, CATCH_UP_LIMIT),)), 1.0)
    assert m.incarnation == CATCH_UP_LIMIT + 1  # a restart's catch-up, wherever the others are
    for step in range(1, 40):  # then only by steps: the limit is 10^15 believed rumours away
        top = m.incarnation + MAX_INCARNATION_JUMP
        effects = m.receive(Ping(step * 2, "b", "b:1", "a", (rumour("a", DEAD, top + 1),)), 1.0)
        assert refusals(effects)[0].kind is RefusalKind.JUMP
        m.receive(Ping(step * 2 + 1, "b", "b:1", "a", (rumour("a", DEAD, top),)), 1.0)
        assert m.incarnation == top + 1 <= LIMIT
    m2 = Membership(meta("a"), CFG, random.Random(1), 0.0, incarnation=LIMIT - 1)
    m2.receive(Ping(1, "c", "c:1", "a", (rumour("a", SUSPECT, LIMIT - 1),)), 1.0)  # highest accusation
    assert m2.incarnation == LIMIT
    m2.leave(2.0)
    assert m2.incarnation == LIMIT  # never bumped past the limit
    m3 = Membership(meta("a"), CFG, random.Random(1), 0.0, incarnation=LIMIT - 1)
    m3.receive(Ping(1, "c", "c:1", "a", (rumour("a", ALIVE, LIMIT, m=meta("a", "x:9")),)), 1.0)
    m3.set_meta(meta("a", "a:2"), 2.0)
    assert m3.incarnation == LIMIT
    with pytest.raises(ValueError):
        Membership(meta("a"), CFG, random.Random(1), 0.0, incarnation=LIMIT + 1)


# -- the probe on a small mesh: refused, and a believable lie is refuted -------------------------------


class Mesh:
    """Peers a, b, c with instant delivery and a manual clock; messages to other addresses vanish."""

    def __init__(self, sites: str = "abc") -> None:
        self.now = 0.0
        self.cores = {f"{s}:1": Membership(meta(s), CFG, random.Random(i), 0.0) for i, s in enumerate(sites)}
        self.queue: deque[Send] = deque()
        self.refused: list[Rejected] = []
        for address, core in self.cores.items():
            self.handle(core.join([a for a in self.cores if a != address], 0.0))
        self.run(10.0)
        assert all(view(c, s) == (ALIVE, 0) for c in self.cores.values() for s in sites)

    def handle(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.queue.append(e)
            elif isinstance(e, Rejected):
                self.refused.append(e)

    def deliver(self, to: str, msg: Message) -> None:
        if to in self.cores:
            self.handle(self.cores[to].receive(msg, self.now))

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            while self.queue:
                e = self.queue.popleft()
                self.deliver(e.to, e.msg)
            due = min(c.next_deadline() for c in self.cores.values())
            if due > end:
                break
            self.now = max(self.now, due)
            for core in self.cores.values():
                if core.next_deadline() <= self.now:
                    self.handle(core.tick(self.now))
        self.now = end

    def views(self, site: str) -> set[tuple[MemberState, int] | None]:
        return {view(c, site) for a, c in self.cores.items() if a != f"{site}:1"}


def test_the_probe_left_at_the_wire_bound_changes_nothing_anywhere() -> None:
    mesh = Mesh()
    for to in ("a:1", "c:1"):
        mesh.deliver(to, Ping(10**6, "b", "b:1", to[0], (rumour("c", LEFT, WIRE_BOUND, "c"),)))
    assert [(r.from_site, r.kind) for r in mesh.refused] == [("b", RefusalKind.OVER_LIMIT)] * 2
    mesh.run(10.0)
    assert mesh.views("c") == {(ALIVE, 0)} and mesh.cores["c:1"].incarnation == 0


def test_a_believable_lie_is_refuted_again_and_again() -> None:
    """b says c left, each time as far ahead as it may: c refutes every time, within the limit."""
    mesh = Mesh()
    a, c = mesh.cores["a:1"], mesh.cores["c:1"]
    for round_ in range(25):
        held = view(a, "c")
        assert held is not None
        lie = held[1] + MAX_INCARNATION_JUMP
        mesh.deliver("a:1", Ping(10**6 + round_, "b", "b:1", "a", (rumour("c", LEFT, lie, "c"),)))
        assert view(a, "c") == (LEFT, lie)
        mesh.run(3 * CFG.probe_interval_s)
        assert mesh.views("c") == {(ALIVE, lie + 1)} and c.incarnation == lie + 1 <= LIMIT
    assert not mesh.refused


# -- bounded tables -------------------------------------------------------------------------------------


def test_indirect_probes_in_flight_are_bounded_per_sender_and_expire() -> None:
    m = member()
    flood = [m.receive(PingReq(i, "b", "b:1", "c", "c:1"), 1.0) for i in range(RELAYS_PER_SENDER + 3)]
    assert all(not refusals(e) for e in flood[:RELAYS_PER_SENDER])
    assert all(refusals(e)[0].kind is RefusalKind.FULL and len(e) == 1 for e in flood[RELAYS_PER_SENDER:])
    assert len(m._relays) == RELAYS_PER_SENDER
    assert not refusals(m.receive(PingReq(99, "d", "d:1", "c", "c:1"), 1.0))  # another site is served
    m.tick(1.0 + CFG.probe_interval_s)
    assert not refusals(m.receive(PingReq(100, "b", "b:1", "c", "c:1"), 1.0 + CFG.probe_interval_s))
    assert RELAYS_PER_SENDER <= MAX_RELAYS


def test_the_member_table_is_bounded() -> None:
    m = member()
    rows = tuple(rumour(f"s{i:04d}", ALIVE, 0) for i in range(TABLE_LIMIT + 10))
    effects = m.receive(PushPull("b", "b:1", rows), 1.0)
    assert len(m.members()) == TABLE_LIMIT
    assert {r.kind for r in refusals(effects)} == {RefusalKind.FULL}
    assert view(m, "b") == (ALIVE, 0)  # what it holds is still updated
    assert not refusals(m.receive(Ping(1, "b", "b:1", "a", (rumour("c", DEAD, 3),)), 1.0))


def live_until(m: Membership, start: float, end: float) -> float:
    """Tick to `end`, every live member answering our probes at once (dead ones stay silent)."""
    now = start
    while (due := m.next_deadline()) <= end:
        now = max(now, due)
        for e in m.tick(now):
            if isinstance(e, Send) and isinstance(e.msg, Ping):
                target = m.member(e.msg.target_site)
                if target is not None and target.state is ALIVE:
                    m.receive(Ack(e.msg.seq, e.msg.target_site), now)
    return end


def test_dead_and_left_members_are_forgotten_and_can_come_back() -> None:
    cfg = dataclasses.replace(CFG, forget_after_s=100.0)
    m = member(cfg)
    m.receive(Ping(1, "b", "b:1", "a", (rumour("c", DEAD, 2), rumour("d", LEFT, 1, "d"))), 0.0)
    now = live_until(m, 0.0, 99.0)
    assert view(m, "c") == (DEAD, 2) and view(m, "d") == (LEFT, 1)
    now = live_until(m, now, 100.0 + 2 * cfg.push_pull_interval_s)
    assert view(m, "c") is None and view(m, "d") is None
    assert {"c", "d"}.isdisjoint(m._probe_order)
    assert all(u.site not in ("c", "d") for u in m._queue.pending())
    # Late news of them is old news: not refused, not taken back.
    effects = m.receive(PushPull("e", "e:1", (rumour("c", DEAD, 2), rumour("d", LEFT, 1, "d"),
                                             rumour("c", ALIVE, 2), rumour("d", SUSPECT, 5))), now)
    assert not refusals(effects) and view(m, "c") is None and view(m, "d") is None
    # c itself, restarted at incarnation 0, and d at a newer life relayed: back.
    m.receive(Ping(2, "c", "c:1", "a", (rumour("c", ALIVE, 0, "c"),)), now)
    m.receive(Ping(3, "e", "e:1", "a", (rumour("d", ALIVE, 2, "d"),)), now)
    assert view(m, "c") == (ALIVE, 0) and view(m, "d") == (ALIVE, 2)


def test_tombstones_are_bounded_in_time() -> None:
    cfg = dataclasses.replace(CFG, forget_after_s=100.0)
    m = member(cfg)
    m.receive(Ping(1, "b", "b:1", "a", (rumour("c", DEAD, 2),)), 0.0)
    now = live_until(m, 0.0, 100.0 + 2 * cfg.push_pull_interval_s)
    assert "c" in m._tombstones
    live_until(m, now, 200.0 + 4 * cfg.push_pull_interval_s)
    assert len(m._tombstones) == 0


# -- (b) any sequence of valid-typed messages ------------------------------------------------------------

SITES = ["a", "b", "c", "d", "e"]
SENDERS = ["b", "c", "d"]
counters = st.one_of(
    st.integers(0, 3000),
    st.integers(0, 2**64),
    st.sampled_from([LIMIT - 1, LIMIT, LIMIT + 1, CATCH_UP_LIMIT, CATCH_UP_LIMIT + 1, WIRE_BOUND,
                     WIRE_BOUND + 1]),
)
updates = st.builds(MemberUpdate, st.sampled_from(SITES), st.sampled_from(list(MemberState)), counters,
                    st.one_of(st.none(), st.sampled_from(SITES).map(meta)), st.sampled_from(SITES))
rumours = st.lists(updates, max_size=8).map(tuple)
seqs = st.integers(0, 2**64)
senders = st.sampled_from(SENDERS)
messages = st.one_of(
    st.builds(lambda s, frm, t, us: Ping(s, frm, f"{frm}:1", t, us), seqs, senders, st.sampled_from(SITES), rumours),
    st.builds(Ack, seqs, senders, rumours),
    st.builds(lambda s, frm, t, us: PingReq(s, frm, f"{frm}:1", t, f"{t}:1", us), seqs, senders,
              st.sampled_from(SITES), rumours),
    st.builds(Nack, seqs, senders),
    st.builds(lambda frm, us, j, r: PushPull(frm, f"{frm}:1", us, j, r), senders, rumours, st.booleans(),
              st.booleans()),
)
steps = st.lists(st.one_of(messages, st.floats(0.0, 40.0)), max_size=40)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_no_sequence_raises_or_passes_the_limit(script: list[Message | float]) -> None:
    m = member(dataclasses.replace(CFG, forget_after_s=31.0))
    now = 0.0
    for step in script:
        if isinstance(step, float):
            now += step
            m.tick(now)
        else:
            m.receive(step, now)
        assert 0 <= m.incarnation <= LIMIT
        assert all(0 <= v.incarnation <= LIMIT for v in m.members())
        assert all(s.incarnation <= LIMIT for s in m._suspicions.values())
        assert all(u.incarnation <= LIMIT for u in m._queue.pending())
        assert len(m.members()) <= TABLE_LIMIT and len(m._relays) <= MAX_RELAYS
    # And we can always still answer: leaving or publishing never passes the limit either.
    m.set_meta(meta("a", "a:2"), now)
    m.leave(now)
    assert m.incarnation <= LIMIT
