"""A simulated site: the real protocol of one peer, and the executor of its effects in simulated
time (what the node's executor, peer/node.py with peer/coordinator.py, does with I/O).

A `PeerNode` runs the peer's `PeerCore` (peer/core/peer_core.py), the same object the node runs:
the real consensus core (on a `MemoryStore` that survives its crashes), the real lease cores fed
from its log, the real leader and round cores behind `PeerRounds`, and a leave's `SeatLeave`, with
the routing between them. Their effects are run here:

- `Train`: a fake trainer "trains" the ranges in simulated time (a site-specific speed) and returns
  a deterministic Δ root of (site, round, ranges). In a time-boxed round the trainer's pace varies
  by ±50% from round to round and it trains whole steps until the one that ends past the budget (as
  the real trainer), so sites contribute unequal work and some taken samples go back on their leases;
- `Fetch` / `Apply`: θ is a stand-in that is a real function of the contributions: blake2b of θ_{r-1},
  the round and the contributors' (site, tokens, root). A contributor whose process is down serves
  no Δ (Unavailable); `CatchUp` copies θ from a live peer that holds the newest committed round;
- membership: the world tells each site its verdicts (`member_alive`, `member_down` ...); each site
  keeps its own view (`live`), so the two sides of a partition disagree;
- `ops leave`: `LeaveRequested`, then on `LeaveReady` the seat (`give_up_seat`), as the node does.

What a node asks of the world it runs in (the truth it reports to, membership's news, the faulty
site) is `Host`, which peer/sim/peer_world.py's `World` implements.

    ops simulate --protocol peer --members 5 --seed 7 --trace
"""

from __future__ import annotations

import hashlib
import math
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from peer.core import events as ev
from peer.core import rounds as r
from peer.core.commitlog import RoundCommit
from peer.core.exclusion import ExclusionKind
from peer.core.consensus import ConsensusCore
from peer.core.consensus_effects import Rejected
from peer.core.consensus import Message as ConsensusMessage
from peer.core.consensus_effects import Send as ConsensusSend
from peer.core.consensus_checks import RefusalKind
from peer.core.election import SiteId
from peer.core.lease_log import LeaseLog
from peer.core.lease_types import LeaseEvent
from peer.core.lease_types import Send as LeaseSend
from peer.core.membership import Message as MembershipMessage
from peer.core.membership_types import MemberState
from peer.core.peer_core import Commits, Effect, PeerCore, View
from peer.core.peer_rounds import PeerRounds
from peer.core.samples import SampleRange
from peer.core.seat_leave import SayLeft, Stop
from peer.core.timeline import RoundClock
from peer.core.vouchers import VoucherKeys
from peer.logstore import MemoryStore
from peer.sim.faulty import FaultySite
from peer.sim.peer_config import LEAVE_WAIT_S, RAFT, TOKENS_PER_SAMPLE, PeerSimConfig
from peer.sim.runner import Simulation, derive_rng

THETA0 = hashlib.blake2b(b"theta_0", digest_size=16).digest()
_CONSENSUS = typing.get_args(ConsensusMessage)
_ROUND = typing.get_args(r.Message)
_MEMBERSHIP = typing.get_args(MembershipMessage)


def theta(previous: bytes, round_: int, contributors: Sequence[tuple[str, int, bytes]]) -> bytes:
    """The stand-in θ_round: a function of θ_{round-1} and what every contributor sent."""
    h = hashlib.blake2b(previous + round_.to_bytes(8, "big"), digest_size=16)
    for site, tokens, root in sorted(contributors):
        h.update(site.encode() + b"\0" + tokens.to_bytes(8, "big") + root)
    return h.digest()


def delta_root(site: str, round_: int, ranges: Sequence[SampleRange]) -> bytes:
    text = f"{site}/{round_}/" + ",".join(f"{x.block_id}:{x.start}-{x.end}" for x in ranges)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass(frozen=True)
class SimSend:
    to: str
    msg: object


@dataclass
class Durable:
    """What a site's disk keeps across a kill: the log store and θ's pointer."""

    store: MemoryStore
    index: int = 0
    round: int = 0
    weights_hash: bytes = THETA0
    boot: int = -1


@dataclass(frozen=True)
class _Due:
    """A fake fetch, apply or state transfer, resolved into its completion event when it is due."""

    effect: ev.Fetch | ev.Apply | ev.CatchUp


class Host(Protocol):
    """What a `PeerNode` asks of the world it runs in: the seed's setup, membership's view, the
    truth it reports to (each report is checked at once) and the counters it adds to."""

    @property
    def seed(self) -> int: ...
    @property
    def cfg(self) -> PeerSimConfig: ...
    @property
    def rounds(self) -> r.RoundsConfig: ...
    @property
    def keys(self) -> Mapping[str, VoucherKeys]: ...
    @property
    def universe(self) -> Mapping[int, int]: ...
    @property
    def speeds(self) -> Mapping[SiteId, float]: ...
    @property
    def disks(self) -> Mapping[SiteId, Durable]: ...
    @property
    def live(self) -> Collection[str]: ...
    @property
    def leavers(self) -> Collection[str]: ...
    @property
    def bouncing(self) -> Collection[str]: ...
    @property
    def sim(self) -> Simulation: ...
    @property
    def faulty(self) -> FaultySite | None: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def violations(self) -> list[str]: ...
    @property
    def reached(self) -> dict[tuple[str, int], set[tuple[int, int]]]: ...
    folds: int
    opens_lost_to_restart: int
    opens_resent: int

    def checked(self, site: str) -> bool: ...
    def serving(self, site: str) -> bool: ...
    def newest_state(self, site: str) -> tuple[int, int, bytes] | None: ...
    def implausible(self, site: str, e: Rejected) -> None: ...
    def see_entry(self, site: str, index: int) -> None: ...
    def see_commit(self, index: int, commit: RoundCommit) -> None: ...
    def waited_out(self, leader: PeerNode, round_: int, site: str) -> None: ...
    def applied_by(self, site: str, round_: int, weights_hash: bytes) -> None: ...
    def say_leaving(self, site: str) -> None: ...
    def say_left(self, site: str) -> None: ...
    def left(self, site: str) -> None: ...


class PeerNode:
    """One site's cores and the simulated executor of their effects."""

    def __init__(self, site: SiteId, world: Host, now: float) -> None:
        self.site, self.world = site, world
        disk = world.disks[site]
        disk.boot += 1
        self.disk = disk
        self.consensus = ConsensusCore.start(site, site, RAFT, disk.store.load(), now,
                                        derive_rng(world.seed, f"raft/{site}/{disk.boot}"), applied_index=disk.index)
        self.protocol = PeerCore(self.consensus, trains=True, leader_wait_s=LEAVE_WAIT_S, follower_wait_s=LEAVE_WAIT_S)
        """The peer's protocol, the one the node runs (peer/core/peer_core.py); this class executes its effects."""
        keys = world.keys.get(site)
        leases = LeaseLog(site, world.universe, world.cfg.lease, disk.boot, keys=keys,
                          tokens_per_sample=TOKENS_PER_SAMPLE if keys else 0)
        self.rounds = PeerRounds(site, site, world.rounds, leases, world.cfg.lease.ttl, RoundClock(site, now),
                                 disk.round, disk.weights_hash)
        self.core = self.rounds.core
        self.speed = world.speeds[site]
        self._jitter = derive_rng(world.seed, f"trainer/{site}/{disk.boot}")
        self.pending: list[tuple[float, int, ev.Event | _Due]] = []
        """The fake trainer's and exchange's completions due (lost with the process)."""
        self._seq = 0
        self._tick_due = now
        """A membership verdict or a leave arrived: tick now (the leader reads the live sites only
        there). Otherwise this peer ticks only at the deadlines its cores report, so a deadline a
        core forgets to report stalls the run here and the liveness check says so."""
        self._outcome: tuple[int, bytes] | None = None
        """The round and θ hash the last fetch here computed: applying it fetches nothing again."""
        self._opened: dict[int, bytes] = {}
        """Round -> the base θ hash its open named (the θ a report of it must be measured from)."""
        self._reported: set[tuple[int, bytes]] = set()
        """(round, Δ root) of the reports this process made."""
        self.up_at: dict[str, float] = {}
        """Site -> the true time this process was last told it is alive (member_alive)."""
        self.open_at: dict[int, float] = {}
        """Round -> the true time this process (as leader) broadcast its open."""
        self.live = set(world.live) | {site}
        """The sites this site's membership reports alive (the two sides of a partition disagree)."""
        self.leavers = set(world.leavers)
        """The sites this site's membership reports leaving (their `LEAVING` label)."""
        for other in world.live:  # what membership knows at the start: consensus only (not attached yet)
            if other != site:
                self.protocol.member_changed(other, MemberState.ALIVE, other, now, self._view())
        self.started = self._run_all(self.protocol.attach(self.rounds, now, self._view()), now)

    # ----- runner.Node ---------------------------------------------------------------------------
    def tick(self, now: float) -> list[Any]:
        out: list[Any] = []
        while self.pending and self.pending[0][0] <= now:
            _, _, item = self.pending.pop(0)
            # A fake fetch or apply is decided when it completes: a contributor killed meanwhile serves nothing.
            out += self._feed(self._due(item) if isinstance(item, _Due) else item, now)
        self._tick_due = float("inf")
        return out + self._run_all(self.protocol.tick(now, self._view()), now)

    def receive(self, msg: object, now: float) -> list[Any]:
        out: list[Any] = []
        if isinstance(msg, _CONSENSUS):
            out += self._run_all(self.protocol.consensus_message(msg, now, self._view()), now)  # type: ignore[arg-type]
        elif isinstance(msg, _ROUND):
            if isinstance(msg, r.RoundOpen):
                self._opened.setdefault(msg.round, msg.base_weights_hash)
            out += self._run_all(self.protocol.round_message(msg, now, self._view()), now)  # type: ignore[arg-type]
        elif isinstance(msg, _MEMBERSHIP) and self.world.faulty is not None:  # only the faulty site pings here
            out += self.world.faulty.heard(self.site, self.disk.boot, msg, now)  # type: ignore[arg-type]
        else:
            out += self._run_all(self.protocol.lease_message(msg, now, self._view()), now)  # type: ignore[arg-type]
        return out

    def next_deadline(self) -> float:
        times = [self.protocol.next_deadline(self._view()), self._tick_due]
        if self.pending:
            times.append(self.pending[0][0])
        return min(times)

    # ----- membership, as the membership layer reports it ------------------------------------------
    def member_alive(self, site: str, now: float) -> list[Any]:
        self.live.add(site)
        self._tick_due = now
        self.leavers.discard(site)  # a new process of it
        self.up_at[site] = self.world.sim.now
        return self._run_all(self.protocol.member_changed(site, MemberState.ALIVE, site, now, self._view()), now)

    def member_leaving(self, site: str, now: float) -> list[Any]:
        """Membership's news that `site` started a graceful leave (its `LEAVING` label)."""
        self.leavers.add(site)
        self._tick_due = now
        return []

    def member_down(self, site: str, now: float) -> list[Any]:
        return self._gone(site, MemberState.DEAD, now)

    def member_left(self, site: str, now: float) -> list[Any]:
        return self._gone(site, MemberState.LEFT, now)

    def _gone(self, site: str, state: MemberState, now: float) -> list[Any]:
        self.live.discard(site)
        self._tick_due = now
        return self._run_all(self.protocol.member_changed(site, state, site, now, self._view()), now)

    # ----- `ops leave` --------------------------------------------------------------------------------
    def leave(self, now: float, wait_s: float | None = None) -> list[Any]:
        """Rounds and leases first (I8), then the voter seat (on LeaveReady), then the process stops.
        Membership tells the others at once that this site leaves (its `LEAVING` label)."""
        self.world.say_leaving(self.site)
        return self._feed(ev.LeaveRequested(self.world.rounds.deadline_s if wait_s is None else wait_s), now)

    # ----- the executor --------------------------------------------------------------------------
    def _view(self) -> View:
        return View(frozenset(self.live), frozenset(self.leavers), self.disk.round, self.disk.weights_hash)

    def _feed(self, event: ev.Event, now: float) -> list[Any]:
        return self._run_all(self.protocol.handle(event, now, self._view()), now)

    def _run_all(self, effects: Sequence[Effect], now: float) -> list[Any]:
        out: list[Any] = []
        for effect in effects:
            out += self._run(effect, now)
        return out

    def _later(self, at: float, event: ev.Event | _Due) -> None:
        self._seq += 1
        self.pending.append((at, self._seq, event))
        self.pending.sort(key=lambda p: (p[0], p[1]))

    def _run(self, effect: Effect, now: float) -> list[Any]:
        w = self.world
        if self.disk.store.persist(effect):
            return []
        if isinstance(effect, ConsensusSend):
            return [SimSend(effect.address, effect.msg)]
        if isinstance(effect, Commits):
            for entry in effect.entries:
                w.see_entry(self.site, entry.index)
            for entry in effect.entries:
                if isinstance(entry.body, RoundCommit):
                    w.see_commit(entry.index, entry.body)
        elif isinstance(effect, Rejected) and effect.kind is RefusalKind.IMPLAUSIBLE:
            w.implausible(self.site, effect)
        elif isinstance(effect, Rejected) and effect.from_site == self.site and effect.what == "leadership":
            w.notes.append(f"{self.site}: stepped down: {effect.reason}")
        elif isinstance(effect, SayLeft):
            w.say_left(self.site)
        elif isinstance(effect, Stop):
            w.notes.append(f"{self.site}: left: {effect.reason}")
            w.left(self.site)
        elif isinstance(effect, ev.Note):
            w.notes.append(f"{self.site}: {effect.text}")
        elif isinstance(effect, LeaseSend | LeaseEvent):
            return [effect]
        elif isinstance(effect, r.Broadcast):
            self.open_at.setdefault(effect.msg.round, w.sim.now)
            w.opens_lost_to_restart += sum(1 for s in self.live if s in w.bouncing)
            return [SimSend(s, effect.msg) for s in sorted(self.live)]
        elif isinstance(effect, r.EpochComplete):
            w.notes.append(f"{self.site}: run's data complete at round {effect.msg.round}")
            return [SimSend(s, effect.msg) for s in sorted(self.live)]
        elif isinstance(effect, r.SendOpen):
            w.notes.append(f"{self.site}: {effect.why}")
            w.opens_resent += 1
            return [SimSend(effect.site, effect.msg)] if effect.site in self.live else []
        elif isinstance(effect, ev.Excluded):
            if effect.kind is ExclusionKind.NO_REPORT:
                w.waited_out(self, effect.round, effect.site)
            if w.faulty is not None:
                w.faulty.excluded(effect.round, effect.site)
        elif isinstance(effect, ev.SendReport):
            c = effect.contribution
            first = c.tokens and (c.round, c.pseudo_gradient_root) not in self._reported
            if first and w.checked(self.site) and (self.disk.round, self.disk.weights_hash) != (
                    c.round - 1, self._opened.get(c.round)):
                # A Δ is measured from θ_{r-1}, overlapped or not: a report from elsewhere would be
                # averaged into the wrong θ (the leader checks only the header's round). A report sent
                # again to a new leader was made earlier, when it was checked.
                w.violations.append(f"{self.site} reported round {c.round} at θ of round {self.disk.round}, not at "
                                    f"the open's base θ_{c.round - 1}")
            self._reported.add((c.round, c.pseudo_gradient_root))
            if effect.leader is None:
                return []
            msg = c
            if w.faulty is not None and self.site == w.faulty.name:
                msg = w.faulty.report(self, msg)  # its modified build lies in some reports
            return [SimSend(effect.leader, msg)]
        if isinstance(effect, ev.Train):
            # A real trainer's pace varies from round to round: in a time-boxed round it then reaches
            # fewer samples than the site took for it (which go back on their leases), or all of them.
            speed = self.speed * (self._jitter.uniform(0.5, 1.5) if effect.budget_s else 1.0)
            ranges = self._reached(effect, speed)
            w.reached.setdefault((self.site, effect.round), set()).update(
                (x.block_id, i) for x in ranges for i in range(x.start, x.end))
            samples = sum(x.num_samples for x in ranges)
            seconds = samples / speed
            done = ev.TrainDone(effect.round, ranges, samples * TOKENS_PER_SAMPLE,
                                delta_root(self.site, effect.round, ranges), seconds,
                                math.ceil(samples / w.rounds.samples_per_step))
            self._later(now + 0.5 + seconds, done)
        elif isinstance(effect, ev.Fold):
            w.folds += 1  # the fake trainer's Δ does not depend on where it trained from
        elif isinstance(effect, ev.Fetch):
            self._later(now + w.cfg.fetch_s, _Due(effect))
        elif isinstance(effect, ev.CancelFetch):
            self.pending = [p for p in self.pending if not (isinstance(p[2], _Due) and isinstance(p[2].effect, ev.Fetch)
                                                             and p[2].effect.attempt == effect.attempt)]
        elif isinstance(effect, ev.Apply):
            self._later(now + w.cfg.apply_s, _Due(effect))
        elif isinstance(effect, ev.CancelApply):
            self.pending = [p for p in self.pending if not (isinstance(p[2], _Due) and isinstance(p[2].effect, ev.Apply)
                                                             and p[2].effect.commit.round == effect.round)]
        elif isinstance(effect, ev.CatchUp):
            self._later(now + w.cfg.apply_s, _Due(effect))
        elif isinstance(effect, ev.RoundApplied):
            w.applied_by(self.site, effect.round, self.disk.weights_hash)
        elif isinstance(effect, ev.LeaveReady):
            return self._run_all(self.protocol.give_up_seat(now, self._view()), now)
        return []

    def _reached(self, train: ev.Train, speed: float) -> tuple[SampleRange, ...]:
        """The samples the fake trainer trains at `speed`: all of them, or in a time-boxed round (as
        the real trainer) whole steps until the step that ends past the budget, at least one."""
        if not train.budget_s:
            return train.ranges
        per_step = self.world.rounds.samples_per_step
        left = math.ceil(train.budget_s * speed / per_step) * per_step
        out = []
        for x in train.ranges:
            if left <= 0:
                break
            n = min(left, x.num_samples)
            out.append(SampleRange(x.block_id, x.start, x.start + n))
            left -= n
        return tuple(out)

    # ----- the fake exchange and disk --------------------------------------------------------------
    def _due(self, item: _Due) -> ev.Event:
        """The completion event of a fake long effect, decided when it completes."""
        w = self.world
        if isinstance(item.effect, ev.Fetch):
            f = item.effect
            for c in f.admitted:
                if c.site != self.site and not w.serving(c.site):
                    return ev.OutcomeFailed(f.round, f.attempt, c.site, f"{c.site}'s pseudo-gradient cannot be "
                                                                        "fetched (its process is down)")
            h = theta(self.disk.weights_hash, f.round, [(c.site, c.tokens, c.pseudo_gradient_root)
                                                        for c in f.admitted])
            self._outcome = (f.round, h)
            return ev.OutcomeReady(f.round, f.attempt, h)
        if isinstance(item.effect, ev.Apply):
            a = item.effect
            cached = self._outcome == (a.commit.round, a.commit.weights_hash)  # as Training.outcome's cache
            for who in a.commit.contributors:
                if not cached and who.site != self.site and not w.serving(who.site):
                    return ev.ApplyFailed(a.commit.round, "unavailable", f"round {a.commit.round}: {who.site}'s "
                                          "pseudo-gradient is served by nobody")
            h = theta(self.disk.weights_hash, a.commit.round, [(c.site, c.tokens, c.pseudo_gradient_root)
                                                               for c in a.commit.contributors])
            if h != a.commit.weights_hash:
                return ev.ApplyFailed(a.commit.round, "diverged", f"round {a.commit.round}: θ hash {h.hex()[:8]} "
                                      f"!= committed {a.commit.weights_hash.hex()[:8]} (I7)")
            self.disk.index, self.disk.round, self.disk.weights_hash = a.index, a.commit.round, h
            return ev.Persisted(a.index, a.commit.round, h)
        got = w.newest_state(self.site)
        if got is None:
            return ev.CatchUpFailed("no live peer holds the newest committed round")
        self.disk.index, self.disk.round, self.disk.weights_hash = got
        return ev.Persisted(*got, transfer=True)
