"""Unit tests of the membership core with a manual clock: probing, indirect probes, suspicion,
refutation, rumour precedence, dissemination, joining, leaving, local health."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Generic, TypeVar

import pytest

from peer.core.membership import (
    Ack,
    Effect,
    MemberMeta,
    Membership,
    MembershipConfig,
    MemberState,
    MemberUpdate,
    Nack,
    Ping,
    PingReq,
    PushPull,
    Send,
    StateChanged,
)

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
CFG = MembershipConfig.lan()
M = TypeVar("M")


def meta(site: str) -> MemberMeta:
    return MemberMeta(site, f"{site}:1")


def rumour(site: str, state: MemberState, inc: int, frm: str = "x", with_meta: bool = True) -> MemberUpdate:
    return MemberUpdate(site, state, inc, meta(site) if with_meta else None, frm)


def member(site: str = "a", others: tuple[str, ...] = ("b", "c", "d", "e"), now: float = 0.0,
           cfg: MembershipConfig = CFG, seed: int = 1) -> Membership:
    """A joined member that knows `others` ALIVE at incarnation 0 (learned from a seed's reply)."""
    m = Membership(meta(site), cfg, random.Random(seed), now)
    m.join(["seed:1"], now)
    table = tuple(rumour(o, ALIVE, 0) for o in others)
    assert m.receive(PushPull(others[0], f"{others[0]}:1", table, reply=True), now)
    assert m.joined
    return m


def view(m: Membership, site: str) -> tuple[MemberState, int] | None:
    return next(((v.state, v.incarnation) for v in m.members() if v.site == site), None)


@dataclass(frozen=True)
class Out(Generic[M]):
    """A Send whose message type is known (keeps the tests type-checked)."""

    to: str
    msg: M


def sends(effects: list[Effect], kind: type[M]) -> list[Out[M]]:
    return [Out(e.to, e.msg) for e in effects if isinstance(e, Send) and isinstance(e.msg, kind)]


def changes(effects: list[Effect]) -> list[StateChanged]:
    return [e for e in effects if isinstance(e, StateChanged)]


def probe(m: Membership, now: float) -> tuple[float, Out[Ping]]:
    """Advance to the member's next probe and return the Ping it sends."""
    for _ in range(50):
        now = max(now, m.next_deadline())
        before = m._probe
        effects = m.tick(now)
        after = m._probe
        if after is not None and after is not before:
            (ping,) = [s for s in sends(effects, Ping) if s.msg.seq == after.seq]
            return now, ping
    raise AssertionError("no probe sent")


# -- rumour precedence (SWIM 4.2, proto comment on MemberUpdate) ------------------------------------

PRECEDENCE = [
    # (state held, inc held, rumour state, rumour inc, expected state, expected inc)
    (ALIVE, 3, ALIVE, 4, ALIVE, 4),
    (ALIVE, 3, ALIVE, 3, ALIVE, 3),
    (ALIVE, 3, ALIVE, 2, ALIVE, 3),
    (ALIVE, 3, SUSPECT, 3, SUSPECT, 3),
    (ALIVE, 3, SUSPECT, 2, ALIVE, 3),
    (ALIVE, 3, SUSPECT, 5, SUSPECT, 5),
    (SUSPECT, 3, ALIVE, 3, SUSPECT, 3),
    (SUSPECT, 3, ALIVE, 4, ALIVE, 4),
    (SUSPECT, 3, DEAD, 3, DEAD, 3),
    (DEAD, 3, ALIVE, 3, DEAD, 3),
    (DEAD, 3, SUSPECT, 3, DEAD, 3),
    (DEAD, 3, ALIVE, 4, ALIVE, 4),  # a restarted member rejoins with a higher incarnation
    (DEAD, 3, LEFT, 3, LEFT, 3),  # LEFT outranks DEAD at equal incarnation
    (LEFT, 3, DEAD, 3, LEFT, 3),  # ... so a departed member is never shown dead
    (LEFT, 3, SUSPECT, 3, LEFT, 3),
    (LEFT, 3, ALIVE, 4, ALIVE, 4),  # came back after leaving
    (ALIVE, 3, LEFT, 3, LEFT, 3),
    (ALIVE, 3, DEAD, 2, ALIVE, 3),
]


@pytest.mark.parametrize("held,held_inc,state,inc,want,want_inc", PRECEDENCE)
def test_rumour_precedence(held: MemberState, held_inc: int, state: MemberState, inc: int,
                           want: MemberState, want_inc: int) -> None:
    m = member()
    # Reach the held state: ALIVE at the incarnation, then the held state on top of it.
    m.receive(Ping(1, "c", "c:1", "a", (rumour("b", ALIVE, held_inc),
                                        rumour("b", held, held_inc, frm="c"))), 0.0)
    assert view(m, "b") == (held, held_inc)
    m.receive(Ping(2, "d", "d:1", "a", (rumour("b", state, inc, frm="d"),)), 1.0)
    assert view(m, "b") == (want, want_inc)


def test_push_pull_dead_at_known_incarnation_is_left_to_our_own_detector() -> None:
    m = member()
    m.receive(PushPull("c", "c:1", (rumour("b", DEAD, 0),)), 0.0)
    assert view(m, "b") == (ALIVE, 0)  # no flapping after a partition heals
    m.receive(PushPull("c", "c:1", (rumour("b", DEAD, 2),)), 0.0)
    assert view(m, "b") == (SUSPECT, 2)  # a life we missed: verify it ourselves


def test_unknown_suspect_is_ignored_and_unknown_alive_is_added() -> None:
    m = member()
    effects = m.receive(Ping(1, "c", "c:1", "a", (rumour("z", SUSPECT, 0), rumour("y", ALIVE, 0))), 0.0)
    assert view(m, "z") is None
    assert view(m, "y") == (ALIVE, 0)
    assert [(c.site, c.old, c.new) for c in changes(effects)] == [("y", None, ALIVE)]


# -- probing -----------------------------------------------------------------------------------------

def test_direct_ack_ends_the_probe_without_suspicion() -> None:
    m = member()
    now, ping = probe(m, 0.0)
    assert ping.to == f"{ping.msg.target_site}:1"
    assert m.receive(Ack(ping.msg.seq, ping.msg.target_site), now + 0.01) == []
    effects = m.tick(now + CFG.probe_interval_s - 1e-6)
    assert not sends(effects, PingReq) and not changes(effects)
    assert all(v.state is ALIVE for v in m.members())


def test_silent_target_gets_indirect_probes_then_suspected() -> None:
    m = member()
    now, ping = probe(m, 0.0)
    target = ping.msg.target_site
    assert m.tick(now + CFG.probe_timeout_s - 1e-6) == []
    reqs = sends(m.tick(now + CFG.probe_timeout_s), PingReq)
    assert len(reqs) == CFG.indirect_checks
    assert {r.msg.target_site for r in reqs} == {target}
    assert target not in {r.to.split(":")[0] for r in reqs}
    assert all(r.msg.seq == ping.msg.seq for r in reqs)
    effects = m.tick(now + CFG.probe_interval_s)
    (change,) = changes(effects)
    assert (change.site, change.old, change.new) == (target, ALIVE, SUSPECT)
    assert "probe failed" in change.reason and "via 3 members (0 nacks)" in change.reason
    # Lifeguard: three missing nacks mean we are probably the sick one.
    assert m.health_multiplier == 1 + CFG.indirect_checks


def test_relayed_ack_saves_the_target_and_nacks_spare_our_health() -> None:
    m = member()
    now, ping = probe(m, 0.0)
    reqs = sends(m.tick(now + CFG.probe_timeout_s), PingReq)
    helper = reqs[0].to.split(":")[0]
    m.receive(Ack(ping.msg.seq, helper), now + 0.6)  # the helper relays the target's Ack
    assert not changes(m.tick(now + CFG.probe_interval_s))
    assert m.health_multiplier == 1
    m2 = member()
    now, ping = probe(m2, 0.0)
    for r in sends(m2.tick(now + CFG.probe_timeout_s), PingReq):
        m2.receive(Nack(r.msg.seq, r.to.split(":")[0]), now + 0.9)
    (change,) = changes(m2.tick(now + CFG.probe_interval_s))
    assert change.new is SUSPECT and "(3 nacks)" in change.reason
    assert m2.health_multiplier == 1  # every helper answered: our own links work


def test_late_timer_after_a_pause_still_gives_indirect_probes_their_window() -> None:
    m = member()
    now, _ = probe(m, 0.0)
    late = now + 10 * CFG.probe_interval_s  # we were stopped far past the whole period
    effects = m.tick(late)
    assert sends(effects, PingReq) and not changes(effects)


def test_round_robin_probes_everyone_within_two_cycles() -> None:
    others = tuple(f"m{i}" for i in range(9))
    m = member(others=others)
    now, seen = 0.0, []
    for _ in range(2 * len(others)):
        now, ping = probe(m, now)
        m.receive(Ack(ping.msg.seq, ping.msg.target_site), now)
        seen.append(ping.msg.target_site)
    assert sorted(seen[: len(others)]) == sorted(others)  # one full cycle visits each once
    assert sorted(seen[len(others):]) == sorted(others)


# -- intermediary ------------------------------------------------------------------------------------

def test_intermediary_relays_ack_or_nacks() -> None:
    m = member()
    effects = m.receive(PingReq(77, "c", "c:1", "b", "b:1"), 5.0)
    (ping,) = sends(effects, Ping)
    assert ping.to == "b:1" and ping.msg.target_site == "b"
    (ack,) = sends(m.receive(Ack(ping.msg.seq, "b"), 5.1), Ack)
    assert ack.to == "c:1" and ack.msg.seq == 77 and ack.msg.from_site == "a"
    m.receive(PingReq(78, "c", "c:1", "d", "d:1"), 6.0)
    nacks: list[Out[Nack]] = []
    t = 6.0
    while not nacks and t < 6.0 + CFG.probe_timeout_s + 1e-3:
        t = m.next_deadline()
        nacks = sends(m.tick(t), Nack)
    assert nacks and nacks[0].to == "c:1" and nacks[0].msg.seq == 78
    assert t - 6.0 < CFG.probe_interval_s - CFG.probe_timeout_s  # arrives inside the window


def test_ping_for_another_site_on_a_reused_address_is_ignored() -> None:
    m = member()
    assert m.receive(Ping(5, "b", "b:1", "someone-else", (rumour("c", DEAD, 0),)), 0.0) == []
    assert view(m, "c") == (ALIVE, 0)
    (ack,) = sends(m.receive(Ping(6, "b", "b:1", "a"), 0.0), Ack)
    assert ack.to == "b:1" and ack.msg.seq == 6
    assert MemberUpdate("a", ALIVE, 0, meta("a"), "a") in ack.msg.updates


# -- suspicion, refutation, death ----------------------------------------------------------------------

def test_suspicion_expires_into_dead_after_max_timeout_without_confirmations() -> None:
    m = member()
    m.receive(Ping(1, "c", "c:1", "a", (rumour("b", SUSPECT, 0, frm="c"),)), 10.0)
    n = 5
    assert not changes(m.tick(10.0 + CFG.suspicion_max_s(n) - 0.01))
    (change,) = changes(m.tick(10.0 + CFG.suspicion_max_s(n)))
    assert (change.site, change.new, change.incarnation) == ("b", DEAD, 0)
    assert "0 confirmations" in change.reason


def test_independent_confirmations_shrink_the_timeout() -> None:
    m = member(others=tuple(f"m{i}" for i in range(9)))
    n = 10
    for frm in ("m1", "m2", "m3", "m4"):
        m.receive(Ping(1, frm, f"{frm}:1", "a", (rumour("m0", SUSPECT, 0, frm=frm),)), 0.0)
    (change,) = changes(m.tick(CFG.suspicion_min_s(n)))
    assert change.new is DEAD and "3 confirmations" in change.reason


def test_refutation_bumps_incarnation_and_travels_on_acks() -> None:
    m = member()
    effects = m.receive(Ping(9, "b", "b:1", "a", (rumour("a", SUSPECT, 0, frm="b"),)), 1.0)
    assert m.incarnation == 1
    (ack,) = sends(effects, Ack)
    assert MemberUpdate("a", ALIVE, 1, meta("a"), "a") in ack.msg.updates
    assert m.health_multiplier == 2  # being suspected hints that we are slow (Lifeguard)
    # A stale accusation changes nothing.
    m.receive(Ping(10, "c", "c:1", "a", (rumour("a", DEAD, 0),)), 2.0)
    assert m.incarnation == 1


def test_prober_tells_a_suspect_it_is_suspected() -> None:
    m = member(others=("b",))
    m.receive(Ping(1, "b", "b:1", "a", (rumour("b", SUSPECT, 0, frm="x"),)), 0.0)
    now, ping = probe(m, 0.0)
    assert ping.msg.target_site == "b"
    assert rumour("b", SUSPECT, 0, frm="x") in ping.msg.updates


def test_restarted_member_outbids_its_previous_life() -> None:
    m = Membership(meta("a"), CFG, random.Random(3), 100.0)
    (join,) = sends(m.join(["b:1"], 100.0), PushPull)
    assert join.msg.join and join.to == "b:1"
    assert not m.joined
    reply = PushPull("b", "b:1", (rumour("b", ALIVE, 0), rumour("a", DEAD, 5)), reply=True)
    m.receive(reply, 100.1)
    assert m.joined and m.incarnation == 6
    (ack,) = sends(m.receive(Ping(1, "b", "b:1", "a"), 100.2), Ack)
    assert MemberUpdate("a", ALIVE, 6, meta("a"), "a") in ack.msg.updates


# -- join, leave, metadata -------------------------------------------------------------------------------

def test_join_is_retried_until_a_seed_answers() -> None:
    m = Membership(meta("a"), CFG, random.Random(3), 0.0)
    assert len(m.join(["b:1", "c:1", "a:1"], 0.0)) == 2  # our own address is not a seed
    retry = sends(m.tick(CFG.join_retry_interval_s), PushPull)
    assert {s.to for s in retry} == {"b:1", "c:1"} and all(s.msg.join for s in retry)
    m.receive(PushPull("b", "b:1", (rumour("b", ALIVE, 0),), reply=True), 1.5)
    later = m.tick(2 * CFG.join_retry_interval_s)
    assert not [s for s in sends(later, PushPull) if s.msg.join]
    again = sends(m.join(["d:1"], 3.0), PushPull)  # an operator merges another group in
    assert [s.to for s in again] == ["d:1"] and m.joined


def test_no_seeds_means_a_group_of_one() -> None:
    m = Membership(meta("a"), CFG, random.Random(3), 0.0)
    assert m.join([], 0.0) == [] and m.joined
    assert [(v.site, v.state) for v in m.members()] == [("a", ALIVE)]


def test_seed_answers_a_join_and_gossips_the_joiner() -> None:
    m = member()
    effects = m.receive(PushPull("z", "z:1", (rumour("z", ALIVE, 0),), join=True), 3.0)
    (reply,) = sends(effects, PushPull)
    assert reply.to == "z:1" and reply.msg.reply and not reply.msg.join
    assert {u.site for u in reply.msg.members} == {"a", "b", "c", "d", "e", "z"}
    assert [(c.site, c.new) for c in changes(effects)] == [("z", ALIVE)]
    gossip = sends(m.tick(3.0 + CFG.gossip_interval_s), Ping)
    assert gossip and all(any(u.site == "z" for u in g.msg.updates) for g in gossip)


def test_leave_tells_every_live_member_and_is_never_refuted() -> None:
    m = member()
    m.receive(Ping(1, "b", "b:1", "a", (rumour("c", SUSPECT, 0, frm="b"), rumour("d", DEAD, 0))), 0.0)
    effects = m.leave(5.0)
    pings = sends(effects, Ping)
    assert {p.to for p in pings} == {"b:1", "c:1", "e:1"}  # the dead one is skipped
    assert all(p.msg.updates == (MemberUpdate("a", LEFT, 1, meta("a"), "a"),) for p in pings)
    assert [(c.site, c.new) for c in changes(effects)] == [("a", LEFT)]
    assert m.tick(100.0) == [] and m.next_deadline() == float("inf")
    assert m.receive(Ping(2, "b", "b:1", "a", (rumour("a", SUSPECT, 1),)), 6.0)
    assert m.incarnation == 1 and view(m, "a") == (LEFT, 1)


def test_receiver_marks_left_and_a_late_dead_does_not_override() -> None:
    m = member()
    m.receive(Ping(1, "b", "b:1", "a", (MemberUpdate("b", LEFT, 1, meta("b"), "b"),)), 0.0)
    assert view(m, "b") == (LEFT, 1)
    m.receive(Ping(2, "c", "c:1", "a", (rumour("b", DEAD, 1), rumour("b", SUSPECT, 1))), 1.0)
    assert view(m, "b") == (LEFT, 1)


def test_set_meta_bumps_incarnation_and_spreads() -> None:
    a = member()
    new = MemberMeta("a", "a:1", tokens_per_s=1234.5)
    assert a.set_meta(new, 1.0) == []
    assert a.incarnation == 1
    gossip = sends(a.tick(1.0), Ping)
    update = next(u for u in gossip[0].msg.updates if u.site == "a")
    b = member("b", others=("a", "c", "d", "e"))
    b.receive(Ping(1, "a", "a:1", "b", (update,)), 1.1)
    assert next(v.meta for v in b.members() if v.site == "a") == new
    with pytest.raises(ValueError):
        a.set_meta(MemberMeta("zz", "a:1"), 2.0)


def test_members_sorted_with_self_and_last_heard() -> None:
    m = member("c", others=("e", "a", "d"))
    m.receive(Ping(1, "a", "a:1", "c"), 7.5)
    m.tick(8.0)
    rows = m.members()
    assert [r.site for r in rows] == ["a", "c", "d", "e"]
    assert rows[0].last_heard == 7.5 and rows[0].address == "a:1"
    assert rows[1].last_heard == 8.0 and rows[2].last_heard == 0.0


def test_next_deadline_never_stalls() -> None:
    m = member()
    now = 0.0
    for _ in range(500):
        d = m.next_deadline()
        assert d > now or d == now
        now = d
        m.tick(now)
        assert m.next_deadline() > now  # a tick at the deadline always makes progress
    assert now > 50 * CFG.probe_interval_s * 0.5


def test_health_recovers_with_successful_probes() -> None:
    m = member()
    now, _ = probe(m, 0.0)
    m.tick(now + CFG.probe_timeout_s)
    m.tick(now + CFG.probe_interval_s)  # fails that probe and starts the next one
    assert m.health_multiplier == 4
    for _ in range(3):
        running = m._probe
        assert running is not None
        m.receive(Ack(running.seq, running.target), now)
        now, _ = probe(m, now)
    assert m.health_multiplier == 1


def test_reconnect_round_robins_dead_members_and_unreached_seeds() -> None:
    cfg = dataclasses.replace(CFG, push_pull_interval_s=1e6)  # only reconnects push-pull here
    m = Membership(meta("a"), cfg, random.Random(5), 0.0)
    m.join(["b:1", "z:1"], 0.0)  # z is down at first: b answers, we are joined through b
    table = (rumour("b", ALIVE, 0), rumour("c", ALIVE, 0), rumour("d", ALIVE, 0))
    m.receive(PushPull("b", "b:1", table, reply=True), 0.1)
    m.receive(Ping(1, "b", "b:1", "a", (rumour("c", DEAD, 0),)), 0.2)
    targets: list[str] = []
    now = 0.2
    while len(targets) < 4:
        now = m.next_deadline()
        effects = m.tick(now)
        targets += [s.to for s in sends(effects, PushPull)
                    if not s.msg.join and s.to in ("c:1", "z:1")]
    # The dead member and the seed nobody of ours listens on, alternately, every interval.
    assert targets == ["c:1", "z:1", "c:1", "z:1"] or targets == ["z:1", "c:1", "z:1", "c:1"]
    m.receive(PushPull("z", "z:1", (rumour("z", ALIVE, 0),), reply=True), now)
    later: list[str] = []
    end = now + 2 * cfg.reconnect_interval_s  # before z could be suspected to death
    while m.next_deadline() <= end:
        now = m.next_deadline()
        later += [s.to for s in sends(m.tick(now), PushPull)]
    # z is a live member now: only the dead are retried (nobody acks here, so d may have died too).
    assert len(later) == 2 and "c:1" in later and "z:1" not in later


# (rumour about ALIVE b@0 at b:1: incarnation, address) -> the StateChanged it makes, if any
NEW_PROCESS = [
    ((1, "b:2"), [(ALIVE, ALIVE, 1)]),  # a new process at a new address: who dials b must learn it
    ((1, "b:1"), []),  # a refutation or new metadata: the same process, nothing changed for a dialler
    ((0, "b:2"), []),  # an older life's rumour never wins
]


@pytest.mark.parametrize("rumoured,want", NEW_PROCESS)
def test_a_member_restarted_at_a_new_address_is_reported_though_it_stayed_alive(
        rumoured: tuple[int, str], want: list[tuple[MemberState, MemberState, int]]) -> None:
    """A site restarted faster than its suspicion (on another port or node) stays ALIVE: only its
    new address says it is a new process, which lost whatever was sent to the old one."""
    m = member()
    inc, address = rumoured
    update = MemberUpdate("b", ALIVE, inc, MemberMeta("b", address), "c")
    got = changes(m.receive(Ping(1, "c", "c:1", "a", (update,)), 1.0))
    assert [(e.old, e.new, e.incarnation) for e in got] == want
    assert all("restarted at b:2" in e.reason for e in got)
    assert m.member("b") is not None and m.member("b").address == (address if inc else "b:1")  # type: ignore[union-attr]
