"""The member table of the SWIM core: everyone a member knows, in which state, and the order it probes them in.

The table behind `Membership` (peer/core/membership.py), as memberlist keeps it in state.go (`nodes`,
`nodeMap`, the shuffled probe order) and util.go (`kRandomNodes`): one entry per member with its state
and incarnation, counts of the live and the dead (the n of every log(n) formula and the reconnect
targets), a shuffled round-robin probe order (SWIM 4.3) and random picks for gossip and indirect probes.
Forgotten members leave a tombstone (peer/core/membership_guard.py). The protocol that changes the
table lives in membership.py; every random choice comes from the member's one seeded `rng`.

    .venv/bin/python -m pytest tests/unit/test_membership.py -q
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from peer.core.membership_config import MembershipConfig
from peer.core.membership_guard import INCARNATION_LIMIT, Tombstones
from peer.core.membership_types import Effect, MemberMeta, MemberState, MemberView, MemberUpdate, StateChanged

PROBED = (MemberState.ALIVE, MemberState.SUSPECT)
"""The states a member is probed (and counted live) in."""


@dataclass
class Member:
    site: str
    meta: MemberMeta | None  # None only for a member heard of as DEAD/LEFT without metadata
    state: MemberState
    incarnation: int
    since: float  # when `state` was entered: bounds gossip to the dead
    last_heard: float  # last message from it, or last state change
    rtt_s: float | None = None  # the last direct probe's round trip (ops status); None before one

    @property
    def address(self) -> str:
        return self.meta.address if self.meta is not None else ""


class MemberTable:
    """This member and everyone it knows; the base of `Membership`, which runs the protocol on it."""

    def __init__(self, meta: MemberMeta, config: MembershipConfig, rng: random.Random, now: float,
                 incarnation: int = 0) -> None:
        if not 0 <= incarnation <= INCARNATION_LIMIT:
            raise ValueError(f"incarnation {incarnation} is outside [0, 2^61]")
        self.config = config
        self._rng = rng
        self._me = Member(meta.site, meta, MemberState.ALIVE, incarnation, now, now)
        # Everyone but us, at most TABLE_LIMIT; DEAD and LEFT ones until forget_after_s, then a tombstone.
        self._members: dict[str, Member] = {}
        self._tombstones = Tombstones(config.forget_after_s)
        self._live = 1  # ALIVE + SUSPECT members, us included: the n of all log(n) formulas
        self._dead = 0  # DEAD members (reconnect targets)
        self._probe_order: list[str] = []  # shuffled round robin (SWIM 4.3), reshuffled per cycle
        self._probe_index = 0

    @property
    def site(self) -> str:
        return self._me.site

    @property
    def address(self) -> str:
        return self._me.address

    @property
    def incarnation(self) -> int:
        return self._me.incarnation

    def member(self, site: str) -> MemberView | None:
        """Our view of one member (None if unknown); O(1), for callers polling one member."""
        m = self._me if site == self.site else self._members.get(site)
        return None if m is None else MemberView(m.site, m.address, m.state, m.incarnation,
                                                 m.last_heard, m.meta, m.rtt_s)

    def members(self) -> list[MemberView]:
        """Every member we know of, us included, sorted by site."""
        rows = [self._me, *self._members.values()]
        return [MemberView(m.site, m.address, m.state, m.incarnation, m.last_heard, m.meta, m.rtt_s)
                for m in sorted(rows, key=lambda m: m.site)]

    def _add(self, u: MemberUpdate, now: float) -> Member:
        m = Member(u.site, u.meta, u.state, u.incarnation, now, now)
        self._members[u.site] = m
        self._count(m.state, +1)
        i = self._rng.randint(0, len(self._probe_order))
        self._probe_order.insert(i, u.site)
        if i < self._probe_index:
            self._probe_index += 1
        return m

    def _set_state(self, m: Member, state: MemberState, incarnation: int, now: float,
                   reason: str) -> list[Effect]:
        old = m.state
        m.incarnation = incarnation
        m.last_heard = now
        if state == old:
            return []
        self._count(old, -1)
        self._count(state, +1)
        m.state = state
        m.since = now
        return [StateChanged(m.site, old, state, incarnation, reason)]

    def _count(self, state: MemberState, delta: int) -> None:
        if state in PROBED:
            self._live += delta
        elif state is MemberState.DEAD:
            self._dead += delta

    def _next_target(self) -> Member | None:
        for _ in range(len(self._probe_order) + 1):
            if self._probe_index >= len(self._probe_order):
                self._rng.shuffle(self._probe_order)
                self._probe_index = 0
                if not self._probe_order:
                    return None
            m = self._members[self._probe_order[self._probe_index]]
            self._probe_index += 1
            if m.state in PROBED:
                return m
        return None

    def _random_members(self, count: int, exclude: set[str],
                        ok: Callable[[Member], bool]) -> list[Member]:
        """Up to `count` distinct random members satisfying `ok`, not in `exclude`. Rejection
        sampling first (O(count) in a mostly healthy group of thousands), then a full scan."""
        chosen: dict[str, Member] = {}
        order = self._probe_order
        for _ in range(4 * count + 8 if order else 0):
            m = self._members[order[self._rng.randrange(len(order))]]
            if m.site not in exclude and m.site not in chosen and ok(m):
                chosen[m.site] = m
                if len(chosen) == count:
                    return list(chosen.values())
        rest = [m for s in order if s not in exclude and s not in chosen
                and ok(m := self._members[s])]
        self._rng.shuffle(rest)
        return list(chosen.values()) + rest[: count - len(chosen)]

    def _drop(self, m: Member, now: float) -> None:
        """Forget member `m`, leaving a tombstone so late rumours of it do not bring it back."""
        del self._members[m.site]
        self._count(m.state, -1)
        i = self._probe_order.index(m.site)
        del self._probe_order[i]
        if i < self._probe_index:
            self._probe_index -= 1
        self._tombstones.add(m.site, m.incarnation, now)
