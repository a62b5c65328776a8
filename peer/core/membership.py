"""Membership core: SWIM failure detection and gossip with the Lifeguard refinements, as a pure
state machine.

Follows "SWIM: Scalable Weakly-consistent Infection-style Process Group Membership Protocol"
(Das, Gupta, Motivala, 2002) and Lifeguard (Dadgar et al., 2018), in the shape of HashiCorp
memberlist (state.go): every period a member probes the next member of a shuffled round-robin list
with a Ping; without an Ack within the probe timeout it asks `indirect_checks` members to probe for
it (PingReq; they answer with the relayed Ack or a Nack); without any Ack by the end of the period
the target becomes SUSPECT. A suspicion expires into DEAD unless the member refutes it by gossiping
ALIVE at a higher incarnation; its timeout shrinks with independent confirmations
(`peer.core.suspicion`). Rumours are piggybacked on every message with a retransmit limit ~ log N
(`peer.core.broadcast`); push-pull exchanges of the whole table repair what gossip missed and join new
members; a member whose own probes go unanswered slows down (`peer.core.awareness`). Every rumour
passes `peer.core.membership_guard` first (counter bounds, jumps, bounded tables): a refused one
changes nothing and comes back as a `Rejected` effect.

The class never sleeps, never reads a clock and never touches the network: the caller passes `now`
(a monotonic clock) into every method and carries out the returned effects (`Send`, and
`StateChanged` notifications); `next_deadline()` says when to call `tick` next.

Try it: ops simulate --members 20 --seeds 0:20 --faults all
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from peer.core.awareness import Awareness
from peer.core.broadcast import BroadcastQueue
from peer.core.membership_config import MembershipConfig
from peer.core.membership_guard import (
    MAX_RELAYS,
    RELAYS_PER_SENDER,
    TABLE_LIMIT,
    check_rumour,
    next_incarnation,
)
from peer.core.membership_types import (
    LEAVING,
    STATE_RANK,
    Ack,
    Effect,
    MemberMeta,
    MemberState,
    MemberUpdate,
    MemberView,
    Message,
    Nack,
    Ping,
    PingReq,
    PushPull,
    RefusalKind,
    Rejected,
    Send,
    StateChanged,
)
from peer.core.member_table import PROBED, Member, MemberTable
from peer.core.suspicion import Suspicion

__all__ = [
    "Ack", "Effect", "LEAVING", "MemberMeta", "MemberState", "MemberUpdate", "MemberView", "Membership",
    "MembershipConfig", "Message", "Nack", "Ping", "PingReq", "PushPull", "RefusalKind", "Rejected",
    "STATE_RANK", "Send", "StateChanged",
]

_INF = float("inf")
ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


@dataclass
class _Probe:
    target: str
    seq: int
    timeout_at: float  # direct Ack deadline; inf once the indirect probes are out
    deadline: float  # end of the period: still no Ack means SUSPECT
    sent: float  # when the Ping went: a direct Ack measures the round trip
    expected_nacks: int = 0
    nacks: int = 0


@dataclass
class _Relay:
    """An indirect probe run for another member: our Ping's seq maps to the requester's."""

    seq: int
    reply_to: str
    nack_at: float  # inf once the Nack went out (a late Ack is still relayed until `expires`)
    expires: float
    requester: str = ""  # its sender: bounds the relays one site may have in flight here


class Membership(MemberTable):
    """One member's view of the group. See the module docstring; all times are the caller's `now`."""

    def __init__(self, meta: MemberMeta, config: MembershipConfig, rng: random.Random, now: float,
                 incarnation: int = 0) -> None:
        super().__init__(meta, config, rng, now, incarnation)
        self._queue: BroadcastQueue[MemberUpdate] = BroadcastQueue()
        self._suspicions: dict[str, Suspicion] = {}
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._seq = 0
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._seeds: tuple[str, ...] = ()
        self._joined = False
        self._left = False
        self._reconnect_cursor = ""
        # Stagger the periodic timers so members started together do not act in lockstep.
        self._next_probe = now + rng.uniform(0, config.probe_interval_s)
        self._next_gossip = now
        self._next_push_pull = now + rng.uniform(0.5, 1.0) * config.push_pull_interval_s
        self._next_reconnect = now + rng.uniform(0.5, 1.0) * config.reconnect_interval_s
        self._next_join = _INF
        # An intermediary's Nack must reach the prober before its indirect window (the rest of
        # the period after the probe timeout) closes, or Lifeguard would count it as missing.
        self._nack_after_s = 0.8 * min(config.probe_timeout_s,
                                       config.probe_interval_s - config.probe_timeout_s)

    # -- public API --------------------------------------------------------------------------------

    @property
    def joined(self) -> bool:
        """At least one seed answered our join (or we were given no seeds)."""
        return self._joined

    @property
    def left(self) -> bool:
        return self._left

    @property
    def health_multiplier(self) -> int:
        """Lifeguard local health factor (1 = healthy) applied to our periods and timeouts."""
        return self._awareness.multiplier

    def join(self, seeds: Sequence[str], now: float) -> list[Effect]:
        """Send our table to every seed address (PushPull join=True); until one answers, `tick`
        retries. With no seeds (or only our own address) we are a group of one, joined at once.
        Calling it again later (an operator's `ops join`) merges another group into ours."""
        self._seeds = tuple(a for a in seeds if a != self.address)
        if not self._seeds:
            self._joined = True
            return []
        if not self._joined:
            self._next_join = now + self.config.join_retry_interval_s
        return self._send_join()

    def leave(self, now: float) -> list[Effect]:
        """Leave gracefully: LEFT at incarnation + 1, sent directly to every live member. Afterwards
        we only answer Pings and PushPulls (telling the late ones we left) and never refute."""
        if self._left:
            return []
        self._left = True
        self._me.incarnation = next_incarnation(self._me.incarnation)
        self._me.state = LEFT
        self._me.since = now
        rumour = self._rumour(self._me)
        effects: list[Effect] = [StateChanged(self.site, ALIVE, LEFT, self._me.incarnation,
                                              "left gracefully")]
        for m in self._members.values():
            if m.state in PROBED:
                effects.append(Send(m.address, Ping(self._next_seq(), self.site, self.address,
                                                    m.site, (rumour,))))
        return effects

    def set_meta(self, meta: MemberMeta, now: float) -> list[Effect]:
        """Publish new metadata (e.g. a measured tokens/s): bump our incarnation so it wins."""
        if meta.site != self.site:
            raise ValueError(f"set_meta: site {meta.site!r} is not ours ({self.site!r})")
        if self._left:
            return []
        self._me.meta = meta
        self._me.incarnation = next_incarnation(self._me.incarnation)
        self._queue.push(self.site, self._rumour(self._me))
        self._next_gossip = min(self._next_gossip, now)
        return []

    def next_deadline(self) -> float:
        """The earliest time at which `tick` has something to do (inf: nothing until a message)."""
        if self._left:
            return _INF
        deadlines = [self._next_probe, self._next_push_pull, self._next_join]
        if self._probe is not None:
            deadlines += (self._probe.timeout_at, self._probe.deadline)
        deadlines += (min(r.nack_at, r.expires) for r in self._relays.values())
        deadlines += (s.deadline for s in self._suspicions.values())
        if len(self._queue):
            deadlines.append(self._next_gossip)
        if self._dead or self._seeds:
            deadlines.append(self._next_reconnect)
        return min(deadlines)

    def tick(self, now: float) -> list[Effect]:
        """Run every timer that is due at `now`."""
        if self._left:
            return []
        self._me.last_heard = now  # we always hear from ourselves
        effects: list[Effect] = []
        if not self._joined and now >= self._next_join:
            self._next_join = now + self.config.join_retry_interval_s
            effects += self._send_join()
        effects += self._tick_probe(now)
        effects += self._tick_relays(now)
        effects += self._tick_suspicions(now)
        effects += self._tick_gossip(now)
        effects += self._tick_anti_entropy(now)
        return effects

    def receive(self, msg: Message, now: float) -> list[Effect]:
        """Handle one message from the network."""
        if self._left:
            return self._receive_after_leave(msg)
        if isinstance(msg, Ping) and msg.target_site != self.site:
            return []  # meant for an earlier process on this address: not our conversation
        if isinstance(msg, PingReq) and (full := self._relays_full(msg)) is not None:
            return [full]
        sender = self._members.get(msg.from_site)
        if sender is not None:
            sender.last_heard = now
        if isinstance(msg, PushPull):
            return self._on_push_pull(msg, now)
        effects = self._apply_all(msg, now)
        if isinstance(msg, Ping):
            effects.append(Send(msg.from_address, Ack(msg.seq, self.site,
                                                      self._updates_for((msg.from_site,), True))))
        elif isinstance(msg, Ack):
            effects += self._on_ack(msg, now)
        elif isinstance(msg, PingReq):
            seq = self._next_seq()
            self._relays[seq] = _Relay(msg.seq, msg.from_address, now + self._nack_after_s,
                                       now + self.config.probe_interval_s, msg.from_site)
            effects.append(Send(msg.target_address, Ping(seq, self.site, self.address, msg.target_site,
                                                         self._updates_for((msg.target_site,)))))
        elif isinstance(msg, Nack):
            if self._probe is not None and self._probe.seq == msg.seq:
                self._probe.nacks += 1
        return effects

    # -- probing -----------------------------------------------------------------------------------

    def _tick_probe(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        p = self._probe
        h = self._awareness.multiplier
        if p is not None and now >= p.timeout_at:
            effects += self._send_indirect(p)
            # Handled late (a pause, a clock jump)? Give the indirect probes their full share of the
            # period anyway: our own stall is no evidence against the target.
            p.deadline = max(p.deadline, now + (self.config.probe_interval_s
                                                - self.config.probe_timeout_s) * h)
        if p is not None and now >= p.deadline:
            effects += self._probe_failed(p, now)
        if now >= self._next_probe:
            if self._probe is not None:  # indirect probes still running: start after them
                self._next_probe = self._probe.deadline
            else:
                effects += self._start_probe(now)
        return effects

    def _start_probe(self, now: float) -> list[Effect]:
        h = self._awareness.multiplier
        period = self.config.probe_interval_s * h
        self._next_probe = now + period
        target = self._next_target()
        if target is None:
            return []
        seq = self._next_seq()
        self._probe = _Probe(target.site, seq, now + self.config.probe_timeout_s * h, now + period, now)
        return [Send(target.address, Ping(seq, self.site, self.address, target.site,
                                          self._updates_for((target.site,))))]

    def _send_indirect(self, p: _Probe) -> list[Effect]:
        p.timeout_at = _INF
        target = self._members[p.target]
        helpers = self._random_members(self.config.indirect_checks, {p.target}, lambda m: m.state == ALIVE)
        p.expected_nacks = len(helpers)
        return [Send(h.address, PingReq(p.seq, self.site, self.address, target.site, target.address,
                                        self._updates_for((target.site, h.site))))
                for h in helpers]

    def _probe_failed(self, p: _Probe, now: float) -> list[Effect]:
        self._probe = None
        # Lifeguard: missing Nacks mean our own link or process is the likelier culprit.
        self._awareness.apply(p.expected_nacks - p.nacks if p.expected_nacks else 1)
        m = self._members[p.target]
        reason = (f"probe failed: no ack directly or via {p.expected_nacks} members "
                  f"({p.nacks} nacks)")
        if m.state == ALIVE:
            return self._suspect(m, m.incarnation, self.site, now, reason)
        if m.state == SUSPECT:
            s = self._suspicions.get(m.site)
            if s is not None and s.confirm(self.site):  # our failed probe is an independent vote
                self._queue.push(m.site, MemberUpdate(m.site, SUSPECT, m.incarnation, m.meta,
                                                      self.site))
        return []

    def _on_ack(self, msg: Ack, now: float) -> list[Effect]:
        p = self._probe
        if p is not None and p.seq == msg.seq:
            self._probe = None
            self._awareness.apply(-1)
            member = self._members.get(p.target)
            if member is not None and p.timeout_at != _INF:  # direct: an indirect Ack's trip has a detour
                member.rtt_s = now - p.sent
            return []
        relay = self._relays.pop(msg.seq, None)
        if relay is None:
            return []  # the answer to a gossip Ping, or too late
        return [Send(relay.reply_to, Ack(relay.seq, self.site, self._updates_for(())))]

    def _tick_relays(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for seq, relay in list(self._relays.items()):
            if now >= relay.expires:
                del self._relays[seq]
            elif now >= relay.nack_at:
                relay.nack_at = _INF
                effects.append(Send(relay.reply_to, Nack(relay.seq, self.site)))
        return effects

    # -- suspicion ---------------------------------------------------------------------------------

    def _suspect(self, m: Member, incarnation: int, from_site: str, now: float,
                 reason: str) -> list[Effect]:
        n, h = self._live, self._awareness.multiplier
        k = min(self.config.indirect_checks, max(0, n - 2))  # members able to confirm besides us
        self._suspicions[m.site] = Suspicion(m.site, incarnation, from_site, now,
                                             self.config.suspicion_min_s(n) * h,
                                             self.config.suspicion_max_s(n) * h, k)
        update = MemberUpdate(m.site, SUSPECT, incarnation, m.meta, from_site)
        self._queue.push(m.site, update)
        return self._set_state(m, SUSPECT, incarnation, now, reason)

    def _tick_suspicions(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for s in [s for s in self._suspicions.values() if now >= s.deadline]:
            del self._suspicions[s.site]
            m = self._members[s.site]
            reason = (f"suspicion timed out after {now - s.start:.1f}s "
                      f"with {s.confirmations} confirmations")
            self._queue.push(m.site, MemberUpdate(m.site, DEAD, m.incarnation, m.meta, self.site))
            effects += self._set_state(m, DEAD, m.incarnation, now, reason)
        return effects

    # -- dissemination -----------------------------------------------------------------------------

    def _tick_gossip(self, now: float) -> list[Effect]:
        if now < self._next_gossip or not len(self._queue):
            return []
        self._next_gossip = now + self.config.gossip_interval_s
        horizon = now - self.config.gossip_to_dead_s

        def eligible(m: Member) -> bool:
            # Gossip to the recently dead too: a paused member learns it was declared dead.
            return m.state in PROBED or (m.state == DEAD and m.since >= horizon)

        effects: list[Effect] = []
        for m in self._random_members(self.config.gossip_nodes, set(), eligible):
            effects.append(Send(m.address, Ping(self._next_seq(), self.site, self.address, m.site,
                                                self._updates_for((m.site,)))))
            if not len(self._queue):
                break
        return effects

    def _tick_anti_entropy(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        if now >= self._next_push_pull:
            self._next_push_pull = now + self.config.push_pull_interval_s
            self._forget(now)
            for m in self._random_members(1, set(), lambda m: m.state == ALIVE):
                effects.append(Send(m.address, self._table()))
        if (self._dead or self._seeds) and now >= self._next_reconnect:
            self._next_reconnect = now + self.config.reconnect_interval_s
            targets = self._reconnect_targets()
            if targets:
                # Round robin, so every target is retried within len(targets) intervals.
                address = next((a for a in targets if a > self._reconnect_cursor), targets[0])
                self._reconnect_cursor = address
                effects.append(Send(address, self._table()))
        return effects

    def _reconnect_targets(self) -> list[str]:
        """Addresses of DEAD members, and of seeds that no live member of ours listens on: a group
        that formed apart from ours (members that joined through other seeds while ours were down)
        merges when either side reaches the other."""
        live = {m.address for m in self._members.values() if m.state in PROBED}
        dead = {m.address for m in self._members.values() if m.state == DEAD and m.address}
        return sorted(dead | (set(self._seeds) - live))

    def _updates_for(self, about: Iterable[str], with_self: bool = False) -> tuple[MemberUpdate, ...]:
        """Rumours to piggyback on a message: what we hold against the members the message concerns
        (so an accused member hears it at once and refutes), our own ALIVE on Acks (so a refutation
        reaches whoever probes us), then the least-sent queued rumours."""
        out: list[MemberUpdate] = []
        for site in about:
            m = self._members.get(site)
            if m is not None and m.state != ALIVE:
                out.append(self._rumour(m))
        if with_self:
            out.append(self._rumour(self._me))
        limit = self.config.retransmit_limit(self._live)
        taken = self._queue.take(self.config.max_piggyback - len(out), limit)
        return tuple(out + [u for u in taken if u not in out])

    def _rumour(self, m: Member) -> MemberUpdate:
        s = self._suspicions.get(m.site) if m.state == SUSPECT else None
        # Name the suspecter, not us: others count distinct suspecters as confirmations.
        return MemberUpdate(m.site, m.state, m.incarnation, m.meta,
                            s.first_from if s is not None else self.site)

    def _table(self, join: bool = False, reply: bool = False) -> PushPull:
        rows = [self._me, *self._members.values()]
        return PushPull(self.site, self.address, tuple(self._rumour(m) for m in rows), join, reply)

    def _send_join(self) -> list[Effect]:
        msg = self._table(join=True)
        return [Send(address, msg) for address in self._seeds]

    def _on_push_pull(self, msg: PushPull, now: float) -> list[Effect]:
        # The answer to our own join is bulk news: take it in without re-gossiping every row
        # (that would be an O(N^2) storm per join); the seed gossips the joiner itself.
        bulk = msg.reply and not self._joined
        effects: list[Effect] = []
        for u in msg.members:
            if not self._skip(u, msg.from_site, "PushPull", effects):
                effects += self._apply(u, now, from_push_pull=True,
                                       regossip=not bulk or u.site == msg.from_site)
        if msg.reply:
            self._joined = True
            self._next_join = _INF
        else:
            effects.append(Send(msg.from_address, self._table(reply=True)))
        return effects

    def _receive_after_leave(self, msg: Message) -> list[Effect]:
        if isinstance(msg, Ping) and msg.target_site == self.site:
            return [Send(msg.from_address, Ack(msg.seq, self.site, (self._rumour(self._me),)))]
        if isinstance(msg, PushPull) and not msg.reply:
            return [Send(msg.from_address, self._table(reply=True))]
        return []

    # -- applying rumours --------------------------------------------------------------------------

    def _apply_all(self, msg: Ping | Ack | PingReq | Nack, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for u in msg.updates if not isinstance(msg, Nack) else ():
            if not self._skip(u, msg.from_site, type(msg).__name__, effects):
                effects += self._apply(u, now)
        return effects

    def _skip(self, u: MemberUpdate, sender: str, what: str, effects: list[Effect]) -> bool:
        """Whether rumour `u` from `sender` must not be merged: refused (a `Rejected` joins
        `effects`; peer/core/membership_guard.py) or old news of a member we forgot."""
        m = self._members.get(u.site)
        held = m.incarnation if m is not None else self._tombstones.incarnation(u.site)
        refusal = check_rumour(u, sender, self.site, self._me.incarnation, held)
        if (refusal is None and m is None and u.site != self.site and u.meta is not None
                and u.state != SUSPECT and len(self._members) + 1 >= TABLE_LIMIT):
            refusal = RefusalKind.FULL, (f"rumour {u.site} {u.state.name}@{u.incarnation}: this peer "
                                         f"holds its limit of {TABLE_LIMIT} members")
        if refusal is not None:
            effects.append(Rejected(sender, what, refusal[1], refusal[0]))
            return True
        return self._tombstones.old_news(u, sender)

    def _apply(self, u: MemberUpdate, now: float, from_push_pull: bool = False,
               regossip: bool = True) -> list[Effect]:
        """Merge one rumour (SWIM 4.2 precedence: higher incarnation, else stronger state)."""
        if u.site == self.site:
            return self._about_self(u)
        m = self._members.get(u.site)
        if m is None:
            if u.state == SUSPECT or u.meta is None:
                return []  # nothing to verify or contact; we learn of it when it is vouched for
            m = self._add(u, now)
            if regossip:
                self._queue.push(u.site, u)
            return [StateChanged(u.site, None, u.state, u.incarnation, f"heard from {u.from_site}")]
        if u.incarnation < m.incarnation:
            return []
        newer = u.incarnation > m.incarnation
        state = u.state
        if state == DEAD and from_push_pull:
            if not newer:
                return []  # our own failure detector decides (avoids flapping after a partition)
            state = SUSPECT  # a life of it we missed ended: verify it ourselves (memberlist)
        if not newer:
            if state == SUSPECT and m.state == SUSPECT:
                s = self._suspicions.get(u.site)
                if s is not None and s.confirm(u.from_site) and regossip:
                    self._queue.push(u.site, u)  # let others count this confirmation too
                return []
            if STATE_RANK[state] <= STATE_RANK[m.state]:
                return []
        moved = newer and u.meta is not None and u.meta.address != m.address
        if u.meta is not None and newer:
            m.meta = u.meta
        reason = f"{state.name.lower()}@{u.incarnation} from {u.from_site}"
        if state == SUSPECT:
            if not regossip:
                return []
            return self._suspect(m, u.incarnation, u.from_site, now, reason)
        self._suspicions.pop(u.site, None)
        if regossip:
            self._queue.push(u.site, MemberUpdate(u.site, state, u.incarnation, m.meta, u.from_site))
        changed = self._set_state(m, state, u.incarnation, now, reason)
        if not changed and moved and state == ALIVE:
            # Still ALIVE, but a new process at another address (restarted on another port or
            # node): whoever dials it must learn the address, and what was sent to the old one is lost.
            return [StateChanged(m.site, ALIVE, ALIVE, u.incarnation, f"{reason}: restarted at {m.address}")]
        return changed

    def _about_self(self, u: MemberUpdate) -> list[Effect]:
        me = self._me
        if u.state == ALIVE:
            stale = u.incarnation < me.incarnation or (u.incarnation == me.incarnation
                                                       and u.meta in (None, me.meta))
            if stale:
                return []
        elif u.incarnation < me.incarnation:
            return []  # an old accusation; our Acks carry our current ALIVE to whoever holds it
        else:
            self._awareness.apply(1)  # Lifeguard: being suspected hints that we are slow
        # Refute (or outbid a previous life of ours): only we ever raise our incarnation.
        me.incarnation = next_incarnation(u.incarnation)
        self._queue.push(self.site, self._rumour(me))
        return []

    def _forget(self, now: float) -> None:
        """Drop the members DEAD or LEFT for forget_after_s, leaving tombstones (bounded tables)."""
        horizon = now - self.config.forget_after_s
        probed = self._probe.target if self._probe is not None else None
        for m in [m for m in self._members.values()
                  if m.state in (DEAD, LEFT) and m.since <= horizon and m.site != probed]:
            self._queue.discard(m.site)
            self._suspicions.pop(m.site, None)
            self._drop(m, now)
        self._tombstones.expire(now)

    def _relays_full(self, msg: PingReq) -> Rejected | None:
        """A refusal for a PingReq beyond the indirect probes one sender, or all, may have here."""
        if len(self._relays) < RELAYS_PER_SENDER:
            return None
        mine = sum(1 for r in self._relays.values() if r.requester == msg.from_site)
        if mine < RELAYS_PER_SENDER and len(self._relays) < MAX_RELAYS:
            return None
        return Rejected(msg.from_site, "PingReq", f"indirect probe of {msg.target_site}: {mine} of this "
                        f"sender's and {len(self._relays)} in all in flight (at most {RELAYS_PER_SENDER} "
                        f"and {MAX_RELAYS})", RefusalKind.FULL)

    # -- helpers -----------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

