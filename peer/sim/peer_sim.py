"""Whole-peer simulation of outer rounds: the real round, consensus and lease cores of N sites.

Every site is a `PeerNode`: the real consensus core (peer/core/consensus.py on a `MemoryStore` that
survives its crashes), the real lease cores fed from its log (peer/core/lease_log.py), the real
leader core (`RoundLeader`, peer/core/rounds.py) and the real round core (`RoundCore`, peer/core/). What
the node's executor (peer/coordinator.py) does with I/O is done here in simulated time:

- `Train`: a fake trainer "trains" the ranges in simulated time (a site-specific speed) and returns
  a deterministic Δ root of (site, round, ranges). Each seed picks its rounds' compute budget
  (`PeerSimConfig.budgets`): in a time-boxed seed the trainer's pace varies by ±50% from round to
  round and it trains whole steps until the one that ends past the budget (as the real trainer),
  so sites contribute unequal work and some taken samples go back on their leases;
- `Fetch` / `Apply`: θ is a stand-in that is a real function of the contributions: blake2b of θ_{r-1},
  the round and the contributors' (site, tokens, root). A contributor whose process is down serves
  no Δ (Unavailable); `CatchUp` copies θ from a live peer that holds the newest committed round;
- membership: a site's crash is reported to every live core (member_dead, MemberDown) after a
  detection delay, a (re)start as member_alive after one; each site keeps its own view (`live`), so
  the two sides of a partition disagree.
- `ops leave`: as `Node.leave` (rounds and leases first, then the voter seat, then LEFT).

Faults per seed, at seeded times: a late join, a contributor killed mid-round (kill -9: its pending
training and Δ are lost) and restarted, another killed mid-exchange (while the leader fetches its Δ), the leader killed mid-round (a leader change reopens the
round) and restarted, a site killed as the leader opens a round and restarted before membership
declares it dead (the open reaches no process; membership's news of the new process must bring it
again), a site SIGSTOPped past its lease ttl, message loss, duplication and
reordering, skewed clocks; then, one at a time at quiet moments in a seeded order, the phases: a
partition (a minority cut off past a lease, then healed), a one-way cut (the same, one direction
only: the minority hears but is not heard, or the reverse), `ops leave` down to one site that commits
alone and back (`leave`), SIGTERM to every site at once and all back (`leave_all`, with `leave`),
every site killed at once and restarted from its disk (`restart`). Only by name (`--faults all,faulty`):
a faulty site, a member or a certificate of the run that never joined, sends protocol-valid but false
messages, under the run's keys (peer/sim/faulty.py).

Checked after every event: no sample in two commits of a data epoch (I4); no contributor credited
with a sample its trainer did not reach in that round; every commit's θ hash is
the function of its contributions and θ_{r-1} (I7 at the leader); every peer applies the committed
rounds in log order with the committed hash, each once, across its restarts (state transfers may
skip rounds, never reorder them); the same round at every log index; a minority cut off never
commits first; liveness: while the up sites on one side of any cut hold a majority of the voters, a
round commits within LIVENESS_S; a site back up while the leader waits for its report holds the
open within RESEND_S of the leader hearing so (unless the network lost that); every site told to
leave at once stops within LEAVE_ALL_S, with θ of the last committed round on some disk (or only
commits without contributors after it). At the end of every data epoch: every sample committed (I5); at
the end: the run finished its data epochs and every up site holds θ of the last round.

    ops simulate --protocol peer --members 5 --seeds 0:100 --faults all
    ops simulate --protocol peer --members 5 --seed 7 --trace
    ops simulate --protocol peer --members 5 --seeds 0:100 --faults all,faulty
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from peer.core import rounds as r
from peer.core.commitlog import Entry, RoundCommit
from peer.core.exclusion import ExclusionKind
from peer.core.consensus_checks import RefusalKind
from peer.core.consensus import Committed, ConsensusCore, DurableState, LeaderChanged, Rejected
from peer.core.consensus import Message as ConsensusMessage
from peer.core.consensus import Send as ConsensusSend
from peer.core import events as ev
from peer.core.lease_log import LeaseLog
from peer.core.peer_rounds import Effect, PeerRounds, Seen
from peer.core.seat_leave import SayLeft, SeatLeave
from peer.core.election import ElectionConfig, Role, SiteId, has_majority
from peer.core.lease_types import LeaseEvent
from peer.core.lease_types import Send as LeaseSend
from peer.core.leases import LeaseConfig
from peer.core.membership import Message as MembershipMessage
from peer.core.vouchers import VoucherKeys
from peer.logstore import MemoryStore
from peer.core.samples import SampleRange
from peer.sim.clock import NodeClock
from peer.sim.faults import parse_faults
from peer.sim.faulty import FaultySite, Stranger
from peer.sim.network import SimNetwork
from peer.sim.runner import NodeState, RunResult, Simulation, derive_rng
from peer.core.timeline import RoundClock

RAFT = ElectionConfig(election_timeout_min_s=1.0, election_timeout_max_s=2.0, heartbeat_interval_s=0.2,
                      max_clock_drift=0.01, max_batch=16)
"""Consensus timing: failover well within a round deadline and a lease ttl."""
DETECT_S = 1.5
"""Membership's delay between a crash (or a start) and the verdict the cores are told."""
LEAVE_WAIT_S = 4 * RAFT.election_timeout_max_s
"""How long a leaving voter waits for its removal to commit (as `Node.leave`): room for an election."""
LEFT_S = 0.2
"""Membership's delay between a graceful leave and the LEFT verdict (gossip, no suspicion)."""
UP_S = 0.5
"""Membership's delay between a fast restart (back before it was declared dead) and the news of the
new process (its new address, or its refutation of a suspicion), which the cores get as member_alive."""
RESEND_S = 0.5
"""A site that came back up while the leader waited for its report must hold the open round's open
within this long of the leader hearing so (a message's latency is at most 70 ms here)."""
LEAVE_ALL_WAIT_S = 40.0
"""The leave wait of the `leave` phase's SIGTERM to every site at once: far longer than the rest of
the leave (as a real run's 120 s round deadline is), so a wait that runs out stands out."""
LEAVE_ALL_S = 20.0
"""Every site stops within this long of a SIGTERM to all of them at once (its round's work and
its seat's leave); a leave wait for a round nobody opens would take LEAVE_ALL_WAIT_S."""
LIVENESS_S = 30.0
"""While the live, connected sites hold a majority of the voters, some round commits within this long
of the last commit or the last fault action (the longest stall seen over 1,000 seeds is in
docs/decisions/site-round-core.md)."""
CONVERGE_S = 30.0
"""After the last round commits, every site that is up holds θ of it within this long (convergence)."""
COUNTERS = ("opens_lost_to_restart", "opens_resent", "faulty_sent", "faulty_refused")
"""RunResult.stats a run adds, totalled by `ops simulate`: round opens the leader sent to a site down
for a fast restart, and opens re-sent to a site that came back up (World's counters of the same names);
the faulty site's lies sent, and refused by honest peers (`faulty`: FaultySite.sent, .refused)."""
GRACE_S = 0.2
"""Messages sent before a cut still arrive (the network decides a message's fate when it is sent):
a minority may finish what a majority acked up to this long after the cut."""
EXTRA_KINDS = ("leave", "restart")
"""Faults of this simulator beyond peer.sim.faults.KINDS: `leave` (`ops leave` site after site down
to one, which commits rounds alone, then they join again) and `restart` (every site killed at once
and restarted from its disk)."""
OPT_IN = ("faulty",)
"""Faults only named ones run, not `all`: `faulty` (peer/sim/faulty.py, a site that lies; it needs
the run's keys). `all` stays a sweep of honest sites, where any implausible refusal is a bug."""
TOKENS_PER_SAMPLE = 8
"""Tokens the fake trainer claims per sample trained (a leader with keys bounds claims by it)."""
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
class PeerSimConfig:
    sites: int = 5
    blocks: int = 24
    block_samples: int = 16
    epochs: int = 2
    rounds: r.RoundsConfig = field(default_factory=lambda: r.RoundsConfig(
        inner_steps=2, samples_per_step=8, deadline_s=4.0, data_epochs=2, idle_wait_s=0.5, gather_s=0.5))
    lease: LeaseConfig = field(default_factory=LeaseConfig.local_test)
    faults: tuple[str, ...] = ("drop", "duplicate", "reorder", "skew", "crash", "pause", "partition", "one_way",
                               *EXTRA_KINDS)
    """Of `peer.sim.faults.KINDS` plus `EXTRA_KINDS`, these act here (bridges do not)."""
    budgets: tuple[float, ...] = (0.0, 0.3)
    """Each seed runs its rounds with one of these compute budgets (RoundOpen.budget_s), picked by
    the seed: 0 trains all H steps; 0.3 s is one step at the slowest site (20 samples/s) and both
    at the fastest (80/s), so unequal sites contribute unequal work."""
    speeds: tuple[float, ...] = ()
    """Each site's trainer pace (samples per second), s0 first; empty: drawn per seed from 20, 40
    and 80 (scripts/bench_tail fixes them to measure the data epoch's tail)."""
    overlaps: tuple[bool, ...] = (False, True)
    """Each seed runs serial or overlapped rounds (RoundsConfig.overlap), picked by the seed."""
    max_time: float = 600.0
    fetch_s: float = 0.3
    apply_s: float = 0.2

    def __post_init__(self) -> None:
        if self.sites < 3:
            raise ValueError(f"--members {self.sites}: the peer simulation needs at least 3 sites (a majority "
                             "must survive a killed leader)")
        if self.rounds.data_epochs != self.epochs:
            raise ValueError("rounds.data_epochs must equal epochs")
        if self.speeds and (len(self.speeds) != self.sites or min(self.speeds) <= 0):
            raise ValueError(f"speeds {self.speeds}: one positive pace per site ({self.sites})")


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


class PeerNode:
    """One site's cores and the simulated executor of their effects."""

    def __init__(self, site: SiteId, world: PeerSim, now: float) -> None:
        self.site, self.world = site, world
        disk = world.disks[site]
        disk.boot += 1
        self.disk = disk
        self.raft = ConsensusCore.start(site, site, RAFT, disk.store.load(), now,
                                        derive_rng(world.seed, f"raft/{site}/{disk.boot}"), applied_index=disk.index)
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
        self.applied: list[tuple[int, bytes]] = []
        self._outcome: tuple[int, bytes] | None = None
        """The round and θ hash the last fetch here computed: applying it fetches nothing again."""
        self.seat: SeatLeave | None = None
        """The voter seat's half of a graceful leave, once the rounds' half is done (as `Node.leave`)."""
        self._opened: dict[int, bytes] = {}
        """Round -> the base θ hash its open named (the θ a report of it must be measured from)."""
        self._reported: set[tuple[int, bytes]] = set()
        """(round, Δ root) of the reports this process made."""
        self.up_at: dict[str, float] = {}
        """Site -> the true time this process was last told it is alive (member_alive)."""
        self.open_at: dict[int, float] = {}
        """Round -> the true time this process (as leader) broadcast its open."""
        self.started: list[Any] = []
        log = self.raft.log
        replay = [log.entry(i) for i in range(log.snapshot.last_index + 1, disk.index + 1)]
        self.started += self.rounds.replay([e for e in replay if e is not None], now)
        self.live = set(world.live) | {site}
        """The sites this site's membership reports alive (the two sides of a partition disagree)."""
        self.leavers = set(world.leavers)
        """The sites this site's membership reports leaving (their `LEAVING` label)."""
        for other in world.live:
            if other != site:
                self.raft.member_alive(SiteId(other), other)

    # ----- runner.Node ---------------------------------------------------------------------------
    def tick(self, now: float) -> list[Any]:
        out: list[Any] = []
        while self.pending and self.pending[0][0] <= now:
            _, _, item = self.pending.pop(0)
            # A fake fetch or apply is decided when it completes: a contributor killed meanwhile serves nothing.
            out += self._feed(self._due(item) if isinstance(item, _Due) else item, now)
        out += self._consensus(self.raft.tick(now), now)
        self._tick_due = float("inf")
        self._seat(now)
        return out + self._run_all(self.rounds.tick(now, self._seen()), now)

    def receive(self, msg: object, now: float) -> list[Any]:
        out: list[Any] = []
        if isinstance(msg, _CONSENSUS):
            out += self._consensus(self.raft.receive(msg, now), now)  # type: ignore[arg-type]
        elif isinstance(msg, _ROUND):
            if isinstance(msg, r.RoundOpen):
                self._opened.setdefault(msg.round, msg.base_weights_hash)
            out += self._run_all(self.rounds.round_message(msg, now, self._seen()), now)  # type: ignore[arg-type]
        elif isinstance(msg, _MEMBERSHIP) and self.world.faulty is not None:  # only the faulty site pings here
            out += self.world.faulty.heard(self.site, self.disk.boot, msg, now)  # type: ignore[arg-type]
        else:
            out += self._run_all(self.rounds.lease_message(msg, now, self._seen()), now)  # type: ignore[arg-type]
        return out

    def next_deadline(self) -> float:
        times = [self.raft.next_deadline(), self.rounds.next_deadline(self._seen()), self._tick_due]
        if self.seat is not None:
            times.append(self.seat.next_deadline())
        if self.pending:
            times.append(self.pending[0][0])
        return min(times)

    # ----- membership, as the membership layer reports it ------------------------------------------
    def member_alive(self, site: str, now: float) -> list[Any]:
        self.live.add(site)
        self._tick_due = now
        self.raft.member_alive(SiteId(site), site)
        self.leavers.discard(site)  # a new process of it
        self.up_at[site] = self.world.sim.now
        return self._run_all(self.rounds.member_up(site, now, self._seen()), now)

    def member_leaving(self, site: str, now: float) -> list[Any]:
        """Membership's news that `site` started a graceful leave (its `LEAVING` label)."""
        self.leavers.add(site)
        self._tick_due = now
        return []

    def member_down(self, site: str, now: float) -> list[Any]:
        self.raft.member_dead(SiteId(site))
        return self._gone(site, now)

    def member_left(self, site: str, now: float) -> list[Any]:
        self.raft.member_left(SiteId(site))
        return self._gone(site, now)

    def _gone(self, site: str, now: float) -> list[Any]:
        """What a dead and a left member have in common once consensus was told which it is."""
        self.live.discard(site)
        self._tick_due = now
        return self._run_all(self.rounds.member_down(site, now, self._seen()), now)

    # ----- `ops leave`, as Node.leave runs it ------------------------------------------------------
    def leave(self, now: float, wait_s: float | None = None) -> list[Any]:
        """Rounds and leases first (I8), then the voter seat (on LeaveReady), then the process stops.
        Membership tells the others at once that this site leaves (its `LEAVING` label)."""
        self.world.say_leaving(self.site)
        return self._feed(ev.LeaveRequested(self.world.rounds.deadline_s if wait_s is None else wait_s), now)

    def _leave_consensus(self, now: float) -> list[Any]:
        voter = self.raft.is_voter()
        decision = self.raft.leave(now)
        self.world.notes.append(f"{self.site}: leaving: {decision.reason}")
        out = self._consensus(decision.effects, now)
        self.seat = SeatLeave(decision.accepted, voter, self.raft.role is Role.LEADER, now, LEAVE_WAIT_S, LEAVE_WAIT_S)
        self._seat(now)
        return out

    def _seat(self, now: float) -> None:
        if self.seat is None:
            return
        for effect in self.seat.update(now, self.raft.removed()):
            if isinstance(effect, SayLeft):
                self.world.say_left(self.site)
            else:
                self.world.notes.append(f"{self.site}: left: {effect.reason}")
                self.world.left(self.site)

    # ----- the executor --------------------------------------------------------------------------
    def _seen(self) -> Seen:
        status = self.raft.status()
        return Seen(status.role is Role.LEADER, status.epoch, status.committed_round, self.disk.round,
                    self.disk.weights_hash, frozenset(self.live), frozenset(self.leavers & self.live), status.leader)

    def _feed(self, event: ev.Event, now: float) -> list[Any]:
        return self._run_all(self.rounds.handle(event, now, self._seen()), now)

    def _run_all(self, effects: Sequence[Effect], now: float) -> list[Any]:
        """Runs `effects` in order; what running one makes the core say (a proposal that commits at
        once) runs after the rest, as the node's executor does."""
        out: list[Any] = []
        queue = list(effects)
        while queue:
            out += self._run(queue.pop(0), now, queue)
        return out

    def _later(self, at: float, event: ev.Event | _Due) -> None:
        self._seq += 1
        self.pending.append((at, self._seq, event))
        self.pending.sort(key=lambda p: (p[0], p[1]))

    def _run(self, effect: Effect, now: float, queue: list[Effect]) -> list[Any]:
        w = self.world
        if isinstance(effect, ev.Note):
            w.notes.append(f"{self.site}: {effect.text}")
        elif isinstance(effect, LeaseSend | LeaseEvent):
            return [effect]
        elif isinstance(effect, r.Broadcast):
            self.open_at.setdefault(effect.msg.round, w.sim.now)
            w.opens_lost_to_restart += sum(1 for s in self.live if s in w.bouncing)
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
        elif isinstance(effect, ev.Propose):
            decision = self.raft.propose_round(effect.commit, now)
            self.rounds.proposed(decision.accepted)
            return self._consensus(decision.effects, now, queue)
        elif isinstance(effect, ev.Apply):
            self._later(now + w.cfg.apply_s, _Due(effect))
        elif isinstance(effect, ev.CatchUp):
            self._later(now + w.cfg.apply_s, _Due(effect))
        elif isinstance(effect, ev.RoundApplied):
            w.applied_by(self.site, effect.round, self.disk.weights_hash)
        elif isinstance(effect, ev.LeaveReady):
            return self._leave_consensus(now)
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

    def _consensus(self, effects: Sequence[Any], now: float, queue: list[Effect] | None = None) -> list[Any]:
        out: list[Any] = []
        entries: list[Entry] = []
        for e in effects:
            if self.disk.store.persist(e):
                continue
            if isinstance(e, ConsensusSend):
                out.append(SimSend(e.address, e.msg))
            elif isinstance(e, Committed):
                entries.append(e.entry)
                self.world.see_entry(self.site, e.entry.index)
            elif isinstance(e, LeaderChanged):
                self.rounds.leader_changed(e.leader, e.epoch)
            elif isinstance(e, Rejected) and e.kind is RefusalKind.IMPLAUSIBLE:
                self.world.implausible(self.site, e)
        if entries:
            for entry in entries:
                if isinstance(entry.body, RoundCommit):
                    self.world.see_commit(entry.index, entry.body)
            effects = self.rounds.entries(entries, now, self._seen())
            if queue is not None:
                queue += effects  # inside _run_all: after the effects being run
            else:
                out += self._run_all(effects, now)
        return out

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


class _Network(SimNetwork):
    """The seeded network, remembering when it lost messages to each address (drop or cut)."""

    def __init__(self, rng: random.Random, latency_s: tuple[float, float]) -> None:
        super().__init__(rng, latency_s)
        self.lost_at: dict[str, list[float]] = {}

    def send(self, src: str, dst: str, now: float) -> list[float]:
        times = super().send(src, dst, now)
        if not times:
            self.lost_at.setdefault(dst, []).append(now)
        return times

    def lost(self, dst: str, start: float, end: float) -> bool:
        """Some message to `dst` sent from `start` to `end` was lost."""
        return any(start <= t <= end for t in self.lost_at.get(dst, ()))


@dataclass(frozen=True)
class _Due:
    """A fake fetch, apply or state transfer, resolved into its completion event when it is due."""

    effect: ev.Fetch | ev.Apply | ev.CatchUp


class PeerSim:
    """One seeded run: the world the nodes share (what membership and the disks say), the truth
    (the committed log in order) and the invariants."""

    def __init__(self, seed: int, cfg: PeerSimConfig, trace: Callable[[str], None] | None = None,
                 keys: Mapping[str, VoucherKeys] | None = None) -> None:
        self.seed, self.cfg = seed, cfg
        self.keys = dict(keys or {})
        """Site -> its voucher keys (a certificate of a run CA): every owner signs, every leader checks
        vouchers and tokens, as a node under TLS. Empty: an insecure run."""
        self.rng = derive_rng(seed, "peer")
        self.universe = {1000 + i: cfg.block_samples - (i % 3 == 2) for i in range(cfg.blocks)}
        net = _Network(derive_rng(seed, "network"), latency_s=(0.001, 0.02))
        if "drop" in cfg.faults:
            net.drop_rate = 0.01
        if "duplicate" in cfg.faults:
            net.duplicate_rate = 0.01
        if "reorder" in cfg.faults:
            net.reorder_rate, net.reorder_window_s = 0.02, 0.05
        self.sim = Simulation(seed, net, trace)
        self.names = [SiteId(f"s{i}") for i in range(cfg.sites)]
        self.disks = {n: Durable(MemoryStore()) for n in self.names}
        self.speeds = {n: self.rng.choice([20.0, 40.0, 80.0]) for n in self.names}  # drawn even if fixed: the seed's other draws stay
        if cfg.speeds:
            self.speeds = dict(zip(self.names, cfg.speeds))
        # Its own random stream: picking the budget leaves every other draw of the seed as it was.
        self.rounds = replace(cfg.rounds, budget_s=derive_rng(seed, "budget").choice(cfg.budgets),
                              overlap=derive_rng(seed, "overlap").choice(cfg.overlaps))
        """The rounds every peer of this seed runs (cfg.rounds with the seed's budget and overlap)."""
        self.folds = 0
        """Fold effects: θ_r handed to a round trained ahead of it (overlapped seeds)."""
        self.live: set[str] = set()
        """The sites membership reports alive (what the cores were told)."""
        self.commits: dict[int, RoundCommit] = {}
        """The committed log's RoundCommits, by round, as the first peer to commit each saw it."""
        self.by_index: dict[int, int] = {}
        self.order: list[int] = []
        self.applied: dict[str, list[int]] = {n: [] for n in self.names}
        self.violations: list[str] = []
        self.epoch_samples: set[tuple[int, int]] = set()
        self.reached: dict[tuple[str, int], set[tuple[int, int]]] = {}
        """(site, round) -> the samples its fake trainer reached in that round: all a commit may credit it with."""
        self.epochs_done = 0
        self.faults: list[tuple[float, str]] = []
        self.excluded = 0
        self.notes: list[str] = []
        """Every decision the sites' round cores took, with its reason (in event order)."""
        self.gone: set[str] = set()
        """Sites that left gracefully (`ops leave`) and have not joined again."""
        self.leaving: str | None = None
        self.leavers: set[str] = set()
        """Sites whose graceful leave has started (membership gossips their `LEAVING` label) and
        that have not started again."""
        self.leave_all_s: list[float] = []
        """Seconds from a SIGTERM to every site at once until the last of them stopped."""
        self.phase: str | None = None
        """The fault phase under way (partition, leave, restart): the other faults wait for its end."""
        self.phases_done: list[str] = []
        self.cut: tuple[frozenset[str], float] | None = None
        """The minority cut off by a partition, and since when."""
        self.first_seen: dict[int, str] = {}
        self.last_commit = 0.0
        self.disrupted = 0.0
        """When a fault last acted (a kill, start, pause, cut, leave, verdict ...): liveness counts from it."""
        self.longest_stall = 0.0
        """The longest wait for a commit since the previous one or the last fault action."""
        self.network = net
        self.bouncing: set[str] = set()
        """Sites killed and about to restart before membership declares them dead (`_bounce`)."""
        self.bounced_until = 0.0
        """No fault phase starts before this: the round open at a fast restart runs to its deadline."""
        self.opens_lost_to_restart = 0
        """Round opens the leader sent to a site of its live list that was down for a fast restart."""
        self.opens_resent = 0
        """Opens a leader sent again to a site that came back up (RoundLeader.member_up)."""
        self.faulty = (FaultySite(self, derive_rng(seed, "faulty"), self.keys, TOKENS_PER_SAMPLE)
                       if "faulty" in cfg.faults else None)
        """The site that lies (`faulty`): never itself checked, its lies must all be refused."""

    # ----- what the nodes ask -----------------------------------------------------------------------
    def peer(self, name: str) -> PeerNode | None:
        node = self.sim.node(name)
        return node if isinstance(node, PeerNode) else None

    def checked(self, site: str) -> bool:
        """Whether `site`'s invariants are checked: every site but the faulty one."""
        return self.faulty is None or site != self.faulty.name

    def implausible(self, site: str, e: Rejected) -> None:
        """`site`'s consensus refused a message as implausible: no honest one is, the faulty site's lies are."""
        if self.faulty is None or not self.faulty.refused_at(site, e.from_site, self.sim.delivering):
            self.violations.append(f"{site}: {e.reason}")

    def serving(self, site: str) -> bool:
        return self.sim.state(site) is NodeState.UP

    def newest_state(self, site: str) -> tuple[int, int, bytes] | None:
        """θ of the newest committed round from any live peer that applied it (a state transfer)."""
        if not self.order:
            return None
        newest = self.order[-1]
        for n in sorted(self.names):
            d = self.disks[n]
            if n != site and self.serving(n) and d.round == newest:
                return d.index, d.round, d.weights_hash
        return None

    def see_entry(self, site: str, index: int) -> None:
        """`site` committed log index `index`: a minority cut off by a partition must never be the first."""
        if index in self.first_seen:
            return
        self.first_seen[index] = site
        if self.cut is not None and site in self.cut[0] and self.sim.now > self.cut[1] + GRACE_S:
            self.violations.append(f"{site} committed log index {index} first, cut off in a minority "
                                   f"({', '.join(sorted(self.cut[0]))}) since t={self.cut[1]:.2f} (a minority "
                                   "never commits)")

    def see_commit(self, index: int, commit: RoundCommit) -> None:
        """A peer's log committed `commit` at `index`: the first sighting is the truth, later ones must
        agree; the truth's invariants are checked at once."""
        rnd = commit.round
        if index in self.by_index:
            if self.by_index[index] != rnd or self.commits[rnd] != commit:
                self.violations.append(f"log index {index} holds round {rnd} at one peer and another entry "
                                       "elsewhere (commit log safety)")
            return
        self.by_index[index] = rnd
        if rnd in self.commits:
            self.violations.append(f"round {rnd} committed twice (at index {index} and earlier)")
            return
        if self.order and rnd != self.order[-1] + 1:
            self.violations.append(f"round {rnd} committed after round {self.order[-1]} (rounds must be consecutive)")
        previous = self.commits[self.order[-1]].weights_hash if self.order else THETA0
        want = theta(previous, rnd, [(c.site, c.tokens, c.pseudo_gradient_root) for c in commit.contributors])
        if commit.weights_hash != want:
            self.violations.append(f"round {rnd}: committed θ hash is not the outer step of its contributions "
                                   "and θ_{r-1} (I7)")
        self.commits[rnd] = commit
        self.order.append(rnd)
        if self.faulty is not None:
            self.violations += self.faulty.committed(rnd, commit.contributors)
        self.longest_stall = max(self.longest_stall, self.sim.now - max(self.last_commit, self.disrupted))
        self.last_commit = self.sim.now
        for c in commit.contributors:
            reached = self.reached.get((c.site, rnd), set())
            untrained = sum(1 for x in c.ranges for i in range(x.start, x.end) if (x.block_id, i) not in reached)
            if untrained:
                self.violations.append(f"round {rnd}: {c.site} is credited with {untrained} samples its trainer "
                                       "never reached in that round (a time-boxed round claims only what it trained)")
            for x in c.ranges:
                for i in range(x.start, x.end):
                    if (x.block_id, i) in self.epoch_samples:
                        self.violations.append(f"round {rnd}: sample {i} of block {x.block_id} committed twice in "
                                               f"data epoch {self.epochs_done} (by {c.site}) (I4)")
                    self.epoch_samples.add((x.block_id, i))
        total = sum(self.universe.values())
        if len(self.epoch_samples) >= total:
            everything = {(b, i) for b, n in self.universe.items() for i in range(n)}
            if self.epoch_samples != everything:
                self.violations.append(f"data epoch {self.epochs_done} ended without every sample (I5)")
            self.epochs_done += 1
            self.epoch_samples = set()
            if self.epochs_done >= self.cfg.epochs:
                self._finish(self.sim.now + CONVERGE_S)

    def waited_out(self, leader: PeerNode, round_: int, site: str) -> None:
        """`leader` excluded `site` from `round_` at the deadline: if the site came back up while the
        round was open and its current process never got the open, although the leader heard it was
        up RESEND_S before and the network lost nothing sent to it since (the open sent again, or a
        later reopen of the round, may be dropped like any message: the deadline bounds that), the
        leader stalled on a site that could not know of the round (docs/decisions/rounds-open-resend.md)."""
        up, opened, node = leader.up_at.get(site), leader.open_at.get(round_), self.sim.node(site)
        if up is None or opened is None or up < opened or not isinstance(node, PeerNode):
            return
        if self.sim.now - up < RESEND_S or round_ in node._opened or self.network.lost(site, up, self.sim.now):
            return
        self.violations.append(f"round {round_}: {site} came back up at t={up:.2f} while the round was open "
                               f"(opened t={opened:.2f}) and never heard of it; {leader.site} waited out the "
                               "deadline for its report (liveness)")

    def applied_by(self, site: str, round_: int, weights_hash: bytes) -> None:
        """`site` applied `round_` (in order, or by a state transfer that skips, never reorders)."""
        seq = self.applied[site]
        if not self.checked(site):
            return
        if seq and round_ <= seq[-1]:
            self.violations.append(f"{site} applied round {round_} after round {seq[-1]} (a round applied twice "
                                   "or out of log order)")
        commit = self.commits.get(round_)
        if commit is None or commit.weights_hash != weights_hash:
            self.violations.append(f"{site} applied round {round_} with θ {weights_hash.hex()[:8]}, not the "
                                   "committed one (I7)")
        seq.append(round_)

    def _finish(self, until: float) -> None:
        """The data is done: stop once every up site holds θ of the last round (at_end checks it) and
        no fault phase is under way (sites it killed are back: every site down would pass vacuously)."""
        if self.phase is not None:
            until = max(until, self.sim.now + CONVERGE_S)  # convergence is timed from the phase's end
        if (self._caught_up() and self.phase is None) or self.sim.now >= until:
            self.sim.stop()
        else:
            self.sim.schedule(self.sim.now + 0.5, lambda: self._finish(until), "run complete (converging)")

    # ----- the run -----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.cfg
        founders = self.names[:-1]
        skew = "skew" in cfg.faults
        for n in self.names:
            clock = NodeClock(self.rng.uniform(0, 100), 1 + self.rng.uniform(-0.001, 0.001)) if skew else NodeClock()
            if n in founders:
                fresh = DurableState.fresh({f: f for f in founders})
                self.disks[n].store.save_hard_state(fresh.hard)
                self.disks[n].store.write_log(1, tuple(fresh.entries))
                self.live.add(n)
            self.sim.add_node(n, partial(self._start, n), at=0.0 if n in founders else 1e9, clock=clock)
        rng, at = self.rng, self.sim.schedule
        at(rng.uniform(3, 12), lambda: self._join(self.names[-1]), "late join")
        if "crash" in cfg.faults:
            at(rng.uniform(4, 12), lambda: self._kill_contributor(20), "kill a contributor mid-round")
            at(rng.uniform(8, 20), self._kill_leader, "kill the leader mid-round")
            # Its own random stream: the other faults of a seed stay where they were.
            own = derive_rng(self.seed, "kill mid-exchange")
            at(own.uniform(6, 30), lambda: self._kill_mid_exchange(own, 400), "kill a contributor mid-exchange")
            fast = derive_rng(self.seed, "fast restart")
            at(fast.uniform(5, 40), lambda: self._bounce(fast, 400), "kill and restart a site as a round opens")
        if "pause" in cfg.faults:
            at(rng.uniform(5, 25), lambda: self._pause(cfg.lease.ttl * rng.uniform(1.5, 3)), "SIGSTOP past the lease")
        if self.faulty is not None:
            if not self.faulty.member:
                self.sim.add_node(self.faulty.name, lambda now: (Stranger(), []))
            self.faulty.start(derive_rng(self.seed, "faulty start").uniform(2, 6))
        phases: list[str] = [k for k in ("partition", "one_way", "leave", "restart") if k in cfg.faults]
        phases += ["leave_all"] if "leave" in cfg.faults else []
        rng.shuffle(phases)
        if phases:
            at(rng.uniform(5, 15), lambda: self._next_phase(phases), "next fault phase")
        res = self.sim.run(cfg.max_time, _Checker(self))
        lies = (sum(self.faulty.sent.values()), sum(self.faulty.refused.values())) if self.faulty else (0, 0)
        res.stats.update(dict(zip(COUNTERS, (self.opens_lost_to_restart, self.opens_resent, *lies), strict=True)))
        return res

    def _start(self, name: SiteId, now: float) -> tuple[PeerNode, list[Any]]:
        node = PeerNode(name, self, now)
        return node, node.started

    def _note(self, what: str) -> None:
        self.faults.append((self.sim.now, what))

    def _up(self) -> list[SiteId]:
        return [n for n in self.names if self.sim.state(n) is NodeState.UP]

    def _tell(self, method: str, site: str) -> None:
        """Membership's verdict on `site`, told to every running core."""
        self._tell_some(method, site, [n for n in self._up() if n != site])

    def _tell_some(self, method: str, site: str, to: Sequence[str], world: bool = True) -> None:
        """Membership's verdict on `site` reaches `to` (`world`: it is the verdict of the majority side,
        the one the leader's live list and a restarting site see)."""
        self.disrupted = self.sim.now
        if world:
            if method == "member_alive":
                self.live.add(site)
            else:
                self.live.discard(site)
        for n in to:
            self.sim.act(n, lambda node, now: getattr(node, method)(site, now))

    def _join(self, name: SiteId) -> None:
        if self.sim.state(name) is not NodeState.DOWN or name in self.gone:
            return
        self._note(f"start {name}")
        self.disrupted = self.sim.now
        self.leavers.discard(name)
        self.sim.restart(name)
        self.sim.schedule(self.sim.now + DETECT_S, lambda: self._tell("member_alive", name), f"{name} alive")

    def _kill(self, name: SiteId, why: str) -> None:
        self._note(f"kill {name} ({why})")
        self.disrupted = self.sim.now
        self.sim.crash(name)
        self.sim.schedule(self.sim.now + DETECT_S, lambda: self._tell("member_down", name), f"{name} dead")
        self.sim.schedule(self.sim.now + self.rng.uniform(4, 10), lambda: self._join(name), f"restart {name}")

    def _pause(self, seconds: float) -> None:
        """SIGSTOP of a site that is not the leader for longer than a lease: its messages wait, its
        leases are reclaimed meanwhile, membership declares it dead, then alive again on SIGCONT."""
        leader = self._leader()
        others = [n for n in self._up() if n != leader]
        if len(self._up()) <= len(self.names) // 2 + 1 or not others or self.phase is not None:
            self.sim.schedule(self.sim.now + 1.0, lambda: self._pause(seconds), "SIGSTOP (retry)")
            return
        name = self.rng.choice(others)
        self._note(f"pause {name} for {seconds:.1f}s")
        self.disrupted = self.sim.now
        self.sim.pause(name)
        self.sim.schedule(self.sim.now + DETECT_S, lambda: self._tell("member_down", name), f"{name} dead")
        self.sim.schedule(self.sim.now + seconds, lambda: self._resume(name), f"resume {name}")

    def _resume(self, name: SiteId) -> None:
        if self.sim.state(name) is not NodeState.PAUSED:
            return  # killed while stopped: its restart (if any) told membership; a late "alive" would undo a leave
        self.disrupted = self.sim.now
        self.sim.resume(name)

        def alive() -> None:
            self._tell("member_alive", name)
            # Verdicts given while it was stopped did not reach it; its gossip catches up now.
            for n in self.names:
                if n != name:
                    method = "member_alive" if n in self.live else "member_left" if n in self.gone else "member_down"
                    self._tell_some(method, n, [name] if self.sim.state(name) is NodeState.UP else [], world=False)

        self.sim.schedule(self.sim.now + DETECT_S, alive, f"{name} alive")

    def _leader(self) -> SiteId | None:
        for n in self._up():
            node = self.sim.node(n)
            if isinstance(node, PeerNode) and node.raft.role is Role.LEADER:
                return n
        return None

    def _kill_contributor(self, tries: int) -> None:
        """kill -9 of a site that is training or waiting for its claims (after `tries` tries at finding
        one, of any site but the leader)."""
        leader = self._leader()
        busy = [n for n in self._up() if n != leader and (node := self.sim.node(n)) is not None
                and isinstance(node, PeerNode) and node.core.site.busy is not None]
        others = [n for n in self._up() if n != leader]
        if (len(self._up()) <= len(self.names) // 2 + 1 or not others or (not busy and tries > 0)
                or self.phase is not None):
            self.sim.schedule(self.sim.now + 0.3, lambda: self._kill_contributor(tries - 1), "kill a contributor")
            return
        self._kill(self.rng.choice(busy or others), "contributor mid-round" if busy else "a site")

    def _kill_mid_exchange(self, rng: random.Random, tries: int) -> None:
        """kill -9 of a contributor while the leader fetches its pseudo-gradient (its report admitted,
        the round not yet proposed): the fetch fails and the leader decides without it."""
        leader = self._leader()
        node = self.sim.node(leader) if leader else None
        fetching = node.core.decision.fetching if isinstance(node, PeerNode) else None
        victims = sorted(c.site for c in fetching.admitted if c.site != leader) if fetching else []
        if not victims or len(self._up()) <= len(self.names) // 2 + 1 or self.phase is not None:
            if tries > 0:
                self.sim.schedule(self.sim.now + 0.05, lambda: self._kill_mid_exchange(rng, tries - 1),
                                  "kill a contributor mid-exchange (retry)")
            return
        self._kill(SiteId(rng.choice(victims)), "a contributor, mid-exchange")

    def _bounce(self, rng: random.Random, tries: int) -> None:
        """kill -9 of a site as the leader is about to open a round (it applies the last one), restarted before membership declares it dead: the open reaches no process, the site
        stays on the leader's live list, and only the news of its new process (UP_S after the restart)
        can tell the leader to send the open again."""
        leader = self._leader()
        node = self.sim.node(leader) if leader else None
        soon = (isinstance(node, PeerNode) and node.rounds.leader._open is None
                and not node.core.decision.deciding and not node.core.applier.idle)  # applying: opens next
        victims = sorted(n for n in self._up() if n != leader and n in self.live)
        if not soon or not victims or len(self._up()) <= len(self.names) // 2 + 1 or self.phase is not None:
            if tries > 0:
                self.sim.schedule(self.sim.now + 0.05, lambda: self._bounce(rng, tries - 1),
                                  "kill and restart a site as a round opens (retry)")
            return
        name = SiteId(rng.choice(victims))
        self._note(f"kill {name} as a round opens; it restarts before membership declares it dead")
        self.disrupted = self.sim.now
        self.sim.crash(name)
        self.bouncing.add(name)

        def back() -> None:
            self.bouncing.discard(name)
            self.disrupted = self.sim.now
            if self.sim.state(name) is NodeState.DOWN and name not in self.gone:
                self._note(f"start {name} (fast restart)")
                self.sim.restart(name)
                self.sim.schedule(self.sim.now + UP_S, lambda: self._tell("member_alive", name), f"{name} is back")
                self.bounced_until = self.sim.now + UP_S + self.rounds.deadline_s

        self.sim.schedule(self.sim.now + rng.uniform(0.3, 1.0), back, f"restart {name}")

    def _kill_leader(self) -> None:
        leader = self._leader()
        node = self.sim.node(leader) if leader else None
        in_round = isinstance(node, PeerNode) and (node.rounds.leader._open is not None or node.core.decision.deciding)
        if leader is None or not in_round or len(self._up()) <= len(self.names) // 2 + 1 or self.phase is not None:
            self.sim.schedule(self.sim.now + 0.5, self._kill_leader, "kill the leader (retry)")
            return
        self._kill(leader, "the leader, mid-round")

    # ----- the fault phases: one at a time, each at a quiet moment -------------------------------
    def _quiet(self) -> bool:
        """Every site that has not left is up (not killed, paused or yet to join), and nothing is cut."""
        if (self.phase is not None or self.cut is not None or self.leaving is not None or self.bouncing
                or self.sim.now < self.bounced_until):
            return False
        here = {n for n in self.names if n not in self.gone}
        leader = self._leader()
        return (all(self.sim.state(n) is NodeState.UP for n in here) and self.live == here
                and leader is not None and set(self._voters(leader)) == here)

    def _next_phase(self, phases: list[str]) -> None:
        if not phases:
            return
        if not self._quiet():
            self.sim.schedule(self.sim.now + 0.5, lambda: self._next_phase(phases), "next fault phase (wait)")
            return
        kind = phases.pop(0)
        self.phase = kind

        def done() -> None:
            self.phase = None
            self.phases_done.append(kind)
            self.sim.schedule(self.sim.now + self.rng.uniform(1, 4), lambda: self._next_phase(phases),
                              "next fault phase")

        run: dict[str, Callable[[Callable[[], None]], None]] = {
            "partition": self._partition, "one_way": partial(self._partition, one_way=True),
            "leave": self._leave_down, "leave_all": self._leave_all, "restart": self._stop_all}
        run[kind](done)

    def _partition(self, done: Callable[[], None], one_way: bool = False) -> None:
        """Cut a minority (one or two sites, the leader among them half the time) off for longer than a
        lease, then heal. Each side's membership declares the other side dead, and alive after the heal.
        `one_way`: only one direction is cut, chosen per seed (the minority hears the majority but is
        not heard, or the reverse): pings go unanswered either way, so membership's verdicts are those
        of a partition, while consensus and round messages still flow the other way."""
        rng, now = self.rng, self.sim.now
        up, leader = self._up(), self._leader()
        k = rng.choice([1, 2]) if len(up) >= 5 else 1
        pool = [n for n in up if n != leader]
        if leader is not None and rng.random() < 0.5:
            minority = [leader, *rng.sample(pool, k - 1)]
        else:
            minority = rng.sample(pool, k)
        cut = frozenset(minority)
        majority = [n for n in self.names if n not in cut]
        deaf = one_way and rng.random() < 0.5  # the minority cannot hear (else: cannot be heard)
        if not one_way:
            self.sim.network.partition([sorted(cut), majority])
        elif deaf:
            self.sim.network.one_way(majority, sorted(cut))
        else:
            self.sim.network.one_way(sorted(cut), majority)
        self.cut = (cut, now)
        self.disrupted = now
        how = "|" if not one_way else ("<- (hears nothing from)" if deaf else "-> (is not heard by)")
        self._note(f"{'one-way cut' if one_way else 'partition'} {','.join(sorted(cut))} {how} {','.join(majority)}"
                   + (f" (leader {leader} cut off)" if leader in cut else ""))

        def verdicts(method: str) -> None:
            inside = [n for n in self._up() if n in cut]
            outside = [n for n in self._up() if n not in cut]
            for n in sorted(cut):
                self._tell_some(method, n, outside)
            for n in outside:
                self._tell_some(method, n, inside, world=method == "member_alive")

        def heal() -> None:
            self.sim.network.heal()
            self.cut = None
            self.disrupted = self.sim.now
            self._note("heal the one-way cut" if one_way else "heal the partition")
            def alive_again() -> None:
                verdicts("member_alive")
                done()

            self.sim.schedule(self.sim.now + DETECT_S, alive_again, "alive again")

        self.sim.schedule(now + DETECT_S, lambda: verdicts("member_down"), "dead across the cut")
        self.sim.schedule(now + rng.uniform(6, 15), heal, "heal")

    def _leave_down(self, done: Callable[[], None]) -> None:
        """`ops leave` site after site until one is left; it commits rounds alone; then they join again."""
        up = self._up()
        survivor = self.rng.choice(up)
        order: list[str] = [n for n in up if n != survivor]
        self.rng.shuffle(order)
        self._note(f"ops leave {', '.join(order)} in turn ({survivor} stays)")
        self._leave_step(order, survivor, done)

    def _caught_up(self) -> bool:
        newest = self.order[-1] if self.order else 0
        return all(self.disks[n].round == newest for n in self._up())

    def _voters(self, site: str) -> list[str]:
        node = self.sim.node(site)
        if not isinstance(node, PeerNode):
            return []
        return [s for s, _ in node.raft.log.voters_at(node.raft.commit_index)]

    def _leave_step(self, order: list[str], survivor: SiteId, done: Callable[[], None]) -> None:
        if (self.leaving is not None or any(n in self.gone for n in self._voters(survivor))
                or not self._caught_up()):
            # The operator waits for the last leave to finish and its voter removal to commit (leaving
            # faster can take the live voters below a majority of the voter set), and for every site
            # left to hold θ of the newest round (else it may exist only on sites that left: see
            # docs/decisions/site-round-core.md, "stranded θ").
            self.sim.schedule(self.sim.now + 0.5, lambda: self._leave_step(order, survivor, done), "ops leave (wait)")
            return
        if not order:
            self._note(f"{survivor} runs alone")
            self._alone(survivor, len(self.order), self.sim.now + LIVENESS_S, done)
            return
        name = order.pop(0)
        self.leaving = name
        self.disrupted = self.sim.now
        self._note(f"ops leave {name}")
        self.sim.act(name, lambda node, now: node.leave(now))
        self.sim.schedule(self.sim.now + self.rng.uniform(0.5, 2), lambda: self._leave_step(order, survivor, done),
                          "ops leave (next)")

    def say_leaving(self, site: str) -> None:
        """`site` started a graceful leave: membership gossips its `LEAVING` label (LEFT_S)."""
        self.leavers.add(site)
        self.sim.schedule(self.sim.now + LEFT_S,
                          lambda: self._tell_some("member_leaving", site, [n for n in self._up() if n != site],
                                                  world=False), f"{site} is leaving")

    def say_left(self, site: str) -> None:
        """Membership's LEFT verdict on `site` (its gossip, before or as it stops)."""
        self.sim.schedule(self.sim.now + LEFT_S, lambda: self._tell("member_left", site), f"{site} left")

    def left(self, site: str) -> None:
        """`site`'s `ops leave` is done: the process stops (it said LEFT already)."""
        def gone() -> None:
            self.sim.crash(site)
            self.gone.add(site)
            self.leaving = None
            self.disrupted = self.sim.now
            self._note(f"{site} left")

        self.sim.schedule(self.sim.now, gone, f"{site} stops")

    def _alone(self, survivor: SiteId, rounds: int, until: float, done: Callable[[], None]) -> None:
        """Wait for the lone site to commit two rounds (or the data to end), then every leaver joins again."""
        if len(self.order) < rounds + 2 and self.epochs_done < self.cfg.epochs and self.sim.now < until:
            self.sim.schedule(self.sim.now + 0.5, lambda: self._alone(survivor, rounds, until, done), "alone")
            return
        back = sorted(self.gone)
        self.rng.shuffle(back)
        last = self.sim.now
        for name in back:
            last += self.rng.uniform(0.5, 3)
            self.sim.schedule(last, partial(self._rejoin, SiteId(name)), f"rejoin {name}")
        self.sim.schedule(last + DETECT_S, done, "every leaver is back")

    def _leave_all(self, done: Callable[[], None]) -> None:
        """SIGTERM to every site at once (`ops/local_mesh.py stop`): each leaves gracefully, no leader
        that stays opens a round after, and each must stop anyway, well within its leave wait, with θ
        of the last committed round on some disk (the run pauses, not lost). Then all start again."""
        up, t0 = self._up(), self.sim.now
        self._note(f"SIGTERM every site ({', '.join(up)}): ops leave of all at once")
        self.disrupted = t0
        for n in up:  # one signal after the other, as a shell loop sends them, some before the others' gossip
            self.sim.schedule(t0 + self.rng.uniform(0, 2 * LEFT_S), partial(self.sim.act, n, lambda node, now: node.leave(
                now, LEAVE_ALL_WAIT_S)), f"SIGTERM {n}")

        def stopped() -> None:
            took = self.sim.now - t0
            running = [n for n in up if self.sim.state(n) is not NodeState.DOWN]
            if running and took <= LEAVE_ALL_S:
                self.sim.schedule(self.sim.now + 0.25, stopped, "every site stopped (wait)")
                return
            if running:
                self.violations.append(f"every site was told to leave at t={t0:.2f}; {', '.join(running)} still "
                                       f"running {took:.1f} s later (> {LEAVE_ALL_S:g} s): a leave waits for a "
                                       "round nobody will open (liveness)")
                return
            self.leave_all_s.append(took)
            self._note(f"every site left in {took:.1f}s")
            # A commit without contributors needs nobody's Δ: θ of it follows from the disk before it.
            newest = max(self.disks[n].round for n in self.names)
            needed = [rnd for rnd in self.order if rnd > newest and self.commits[rnd].contributors]
            if needed:
                self.violations.append(f"every site left and none holds θ of committed round {needed[-1]} (newest "
                                       f"on a disk: {newest}), which needs the pseudo-gradients of sites that left: "
                                       "lost, not paused")
            self._alone(SiteId(up[0]), 0, self.sim.now, done)  # every leaver starts again

        self.sim.schedule(t0 + 0.25, stopped, "every site stopped")

    def _rejoin(self, name: SiteId) -> None:
        self.gone.discard(name)
        self._join(name)

    def _stop_all(self, done: Callable[[], None]) -> None:
        """kill -9 of every site at once; each restarts from its disk a few seconds later."""
        up = self._up()
        self._note("kill -9 every site")
        self.disrupted = self.sim.now
        for n in up:
            self.sim.crash(n)
        self.live.clear()
        back = self.sim.now + self.rng.uniform(2, 6)
        for n in up:
            self.sim.schedule(back + self.rng.uniform(0, 1), partial(self._join, n), f"restart {n}")
        self.sim.schedule(back + 1 + DETECT_S, done, "every site is back")

    def majority_live(self) -> bool:
        """The up sites on one side of any cut hold a majority of the voter set (as the most advanced
        up site's log says)."""
        up = self._up()
        nodes = [node for n in up if isinstance(node := self.sim.node(n), PeerNode)]
        if not nodes:
            return False
        ref = max(nodes, key=lambda node: node.raft.commit_index)
        voters = [s for s, _ in ref.raft.log.voters()]
        sides = [set(up)] if self.cut is None else [set(up) - self.cut[0], set(up) & self.cut[0]]
        return any(has_majority(map(SiteId, side), voters) for side in sides)


class _Checker:
    def __init__(self, world: PeerSim) -> None:
        self.world = world
        self._seen = 0
        self._stalled = False

    def after_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> list[str]:
        w = self.world
        w.excluded += sum(1 for e in effects if isinstance(e, ev.Excluded))
        if w.epochs_done < w.cfg.epochs and not self._stalled:
            # Whether a majority is live changes only with a fault action (which resets the clock):
            # asked only once the wait is past the bound, it costs nothing on the other events.
            stall = sim.now - max(w.last_commit, w.disrupted)
            if stall > LIVENESS_S and w.majority_live():
                self._stalled = True
                w.violations.append(f"no round committed for {stall:.1f} s while the live sites hold a "
                                    f"majority of the voters (last commit t={w.last_commit:.1f}) (liveness)")
        if len(w.violations) > self._seen:
            new = w.violations[self._seen:]
            self._seen = len(w.violations)
            return [f"t={sim.now:.2f}: {v}" for v in new]
        return []

    def at_end(self, sim: Simulation) -> list[str]:
        w = self.world
        if w.epochs_done < w.cfg.epochs:
            return [f"t={sim.now:.1f}: only {w.epochs_done} of {w.cfg.epochs} data epochs committed, "
                    f"{len(w.order)} rounds (liveness)"]
        behind = {n: w.disks[n].round for n in w._up() if w.disks[n].round != w.order[-1] and w.checked(n)}
        if behind:
            return [f"t={sim.now:.1f}: {behind} still behind round {w.order[-1]} {CONVERGE_S:g} s after the run's "
                    "last commit (convergence)"]
        return []


def simulate(seed: int, cfg: PeerSimConfig | None = None, trace: Callable[[str], None] | None = None,
             keys: Mapping[str, VoucherKeys] | None = None) -> tuple[PeerSim, RunResult]:
    world = PeerSim(seed, cfg or PeerSimConfig(), trace, keys)
    return world, world.run()


def parse_kinds(spec: str) -> tuple[str, ...]:
    """`ops simulate --faults` words plus `leave` and `restart` (`all` includes them) and `faulty`
    (only by name)."""
    words = [w.strip() for w in spec.split(",") if w.strip()]
    extra = tuple(k for k in EXTRA_KINDS if k in words or "all" in words)
    extra += tuple(k for k in OPT_IN if k in words)
    ours = (*EXTRA_KINDS, *OPT_IN)
    return parse_faults(",".join(w for w in words if w not in ours) or "none") + extra


def site_names(members: int) -> list[str]:
    """Every site a run of `members` may name: its sites and one that never joins (the faulty one)."""
    return [f"s{i}" for i in range(members + 1)]


def run_seed(args: argparse.Namespace, seed: int, trace: Callable[[str], None] | None = None,
             keys: Mapping[str, VoucherKeys] | None = None) -> RunResult:
    """One seed for `ops simulate --protocol peer` (`--members` sites, `--faults`; `keys` for
    `site_names(members)`, which `faulty` needs)."""
    _, res = simulate(seed, PeerSimConfig(sites=args.members, faults=parse_kinds(args.faults)), trace, keys)
    return res


def replay_flags(args: argparse.Namespace) -> list[str]:
    return ["--members", str(args.members), "--faults", args.faults]
