"""Which membership rumours a peer believes: counter bounds, jumps, bounded tables, forgotten members.

Mutual TLS proves who sent a message (the guard checks each message's `from_site` against the
certificate), not that the rumours it relays are true: SWIM is not Byzantine fault tolerant, and a
relayed rumour carries no signature of its subject. But a site of the run (a bug, a wrong config, a
stolen key) must not be able to break membership with one message. Issue 38 did it with a rumour
"c LEFT at incarnation 2^62" relayed in one Ping: c's refutation at 2^62 + 1 was refused at decode
(peer/transport/wire.py bounds counters to 2^62), so c stayed out forever. The checks, after
memberlist's state.go (only the subject raises its incarnation, to refute; a LEFT is the subject's
own dead message):

* **Bound**: no ALIVE above `INCARNATION_LIMIT` and no accusation (SUSPECT, DEAD, LEFT) above
  `INCARNATION_LIMIT - 1` is believed, and this peer's own incarnation never passes the limit, so
  every accusation a peer holds can still be refuted by its subject at + 1.
* **Jumps**: a rumour about c from a sender other than c may not take c more than
  `MAX_INCARNATION_JUMP` above the incarnation this peer holds for c. c itself (the message's sender
  is c, checked by mutual TLS) is believed up to the bound: only c mints its incarnations, and its
  own Acks and push-pulls reach every member that probes or reconnects to it. Where this peer has
  no base (it never heard of c, or c is this peer restarted with no memory of its previous life,
  which only the others' views hold) a rumour is believed up to `CATCH_UP_LIMIT`, half the bound.
* **LEFT**: believed at once from c itself; relayed, it passes the same jump rule as any rumour.
  The wire has no signed rumours, so a relayed LEFT cannot be proven to be c's: a forged one is an
  accusation like SUSPECT or DEAD that c refutes at its next probe (docs/decisions/
  security-membership-counters.md).
* **Tables**: at most `TABLE_LIMIT` members and `MAX_RELAYS` indirect probes in flight
  (`RELAYS_PER_SENDER` per requester); DEAD and LEFT members are forgotten after
  `MembershipConfig.forget_after_s`, leaving a bounded `Tombstones` entry so late rumours of them do
  not bring them back, while the member itself (or a newer incarnation) still does.

A refusal is a `Rejected` effect with a `RefusalKind`; the refused rumour changes nothing.

    .venv/bin/python -m pytest tests/unit/test_membership_hostile.py -q
"""

from __future__ import annotations

from peer.core.membership_types import MemberState, MemberUpdate, RefusalKind

INCARNATION_LIMIT = 2**61
"""The highest incarnation believed or held: half the wire's counter bound (peer/transport/wire.py
MAX_COUNTER = 2^62, like consensus's EPOCH_LIMIT), so a refutation `+ 1` always encodes. Honest
growth is one per refutation, metadata change or leave: out of reach for any run."""

CATCH_UP_LIMIT = 2**60
"""The highest incarnation believed about a subject this peer has no base for (never heard of it,
or itself after a restart). Above it incarnations only grow by jumps of at most
MAX_INCARNATION_JUMP, so reaching INCARNATION_LIMIT takes 2^60 / 1000 (10^15) believed rumours."""

MAX_INCARNATION_JUMP = 1_000
"""How far above the incarnation this peer holds for c a rumour relayed by another site may take c.
c raises its incarnation once per refuted suspicion, metadata change or leave; a thousand of those
are hours of refuting at every probe period, which only a peer away for that long misses, and it
then hears c itself (its probe's Ack, its reconnect push-pull) within the convergence bound."""

TABLE_LIMIT = 4_096
"""Members the core holds, itself included, and tombstones it keeps. A peer of a real run holds at
most 256 (peer/transport/wire.py MAX_MEMBERS, which the node checks before a message reaches the
core); this is the core's own bound for any use of it, the benchmark's groups of 1000 included."""

RELAYS_PER_SENDER = 8
"""Indirect probes one requester may have in flight here. An honest one has one probe at a time and
a relay lives one probe period, so it holds one or two; eight covers the PingReqs a pause queued."""

MAX_RELAYS = 1_024
"""Indirect probes in flight here in all: a helper gets about `indirect_checks` PingReqs a period
whatever the group's size, so this is only reached by a flood."""


def next_incarnation(incarnation: int) -> int:
    """This peer's next own incarnation: one more, never past the bound (a bump at the bound is
    lost, which takes 10^15 believed hostile rumours to reach; see CATCH_UP_LIMIT)."""
    return min(INCARNATION_LIMIT, incarnation + 1)


def check_rumour(u: MemberUpdate, sender: str, me: str, own: int,
                 held: int | None) -> tuple[RefusalKind, str] | None:
    """None if rumour `u`, in a message sent by `sender`, may be merged by peer `me` (at incarnation
    `own`, holding `held` for u.site, None if it never heard of it or forgot it), else why not."""
    about = f"{u.site or '(no site)'} {u.state.name}@{u.incarnation}"
    if not u.site or u.incarnation < 0:
        return RefusalKind.MALFORMED, f"rumour {about}: no site or a negative incarnation"
    if u.meta is not None and u.meta.site != u.site:
        return RefusalKind.MALFORMED, f"rumour {about} carries the metadata of {u.meta.site!r}"
    # An accusation is answered at + 1 by its subject, which must stay within the bound too.
    ceiling = INCARNATION_LIMIT if u.state is MemberState.ALIVE else INCARNATION_LIMIT - 1
    if u.incarnation > ceiling:
        return RefusalKind.OVER_LIMIT, (f"rumour {about}: above the incarnation limit (2^61, and "
                                        f"2^61 - 1 for an accusation): {u.site} could not refute it")
    if sender == u.site:
        return None  # the subject's own word: only it mints its incarnations
    if u.site == me:
        allowed, base = max(own + MAX_INCARNATION_JUMP, CATCH_UP_LIMIT), f"ours ({own})"
    elif held is None:
        allowed, base = CATCH_UP_LIMIT, "nothing (first heard of)"
    else:
        allowed, base = held + MAX_INCARNATION_JUMP, f"the {held} held"
    if u.incarnation > allowed:
        verb = "leave" if u.state is MemberState.LEFT else "rumour"
        return RefusalKind.JUMP, (f"{verb} {about} relayed by {sender}: more than {MAX_INCARNATION_JUMP} "
                                  f"above {base}; only {u.site} itself is believed that far")
    return None


class Tombstones:
    """Members this peer forgot (DEAD or LEFT for `forget_after_s`): site -> the incarnation it was
    forgotten at, kept `keep_s` and at most `limit` of them (the oldest go first). A rumour of a
    tombstoned member at or below that incarnation is old news; a newer one, or any ALIVE from the
    member itself, brings it back."""

    def __init__(self, keep_s: float, limit: int = TABLE_LIMIT) -> None:
        self._keep_s = keep_s
        self._limit = limit
        self._graves: dict[str, tuple[int, float]] = {}  # insertion order = forgetting order

    def __len__(self) -> int:
        return len(self._graves)

    def __contains__(self, site: object) -> bool:
        return site in self._graves

    def add(self, site: str, incarnation: int, now: float) -> None:
        self._graves.pop(site, None)
        self._graves[site] = (incarnation, now)
        while len(self._graves) > self._limit:
            del self._graves[next(iter(self._graves))]

    def incarnation(self, site: str) -> int | None:
        grave = self._graves.get(site)
        return None if grave is None else grave[0]

    def discard(self, site: str) -> None:
        self._graves.pop(site, None)

    def expire(self, now: float) -> None:
        while self._graves:
            site, (_, at) = next(iter(self._graves.items()))
            if now - at < self._keep_s:
                return
            del self._graves[site]

    def old_news(self, u: MemberUpdate, sender: str) -> bool:
        """Whether `u` is about a member forgotten at an incarnation it does not pass (then it is
        ignored); a comeback (newer, or ALIVE from the member itself) removes the tombstone."""
        grave = self._graves.get(u.site)
        if grave is None:
            return False
        # Only what the table would take in (not a SUSPECT, not without metadata) is a comeback.
        addable = u.meta is not None and u.state is not MemberState.SUSPECT
        if addable and (u.incarnation > grave[0] or (u.state is MemberState.ALIVE and sender == u.site)):
            del self._graves[u.site]
            return False
        return True
