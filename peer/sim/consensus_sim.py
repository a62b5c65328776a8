"""Deterministic simulation of election + commit log under faults, with invariants after every event.

FoundationDB-style: one seed fixes everything (clocks, delays, faults, workload); any failure prints
the seed and `replay(seed, ...)` reproduces it. `Cluster` holds the cores, their "disks"
(`MemoryStore`) and the invariant checker, and is also the zero-delay harness of the unit tests;
`Sim` adds a network (delay, drop, duplicate, reorder, replay of old messages, partitions incl.
bridge and one-way), per-peer clocks (rate skew, jumps), pauses (SIGSTOP), crash/restart and churn
(join, graceful leave, death), then heals and checks liveness within `liveness_bound`.

Invariants (architecture.md I1-I3, docs/consensus.md):
  I1 at most one leader per epoch; a message with a stale epoch never changes the receiver's state;
  I2 no two different entries committed for one round or one index, on any two peers;
  I3 a committed entry is never lost: every new leader's log holds all of them;
  apply exactly once and in order (checked through a hash chain every peer computes);
  lease: at most one leader with a valid lease at any real time (when no clock jumps).

    .venv/bin/python -m peer.sim.consensus_sim --seeds 1000 --voters 3 5
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import random
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from peer.commitlog import Contributor, Entry, LogIndex, Round, RoundCommit, SampleRange, encode_entry
from peer.consensus import (
    Committed,
    ConsensusCore,
    Decision,
    DurableState,
    Effect,
    LeaderChanged,
    Message,
    Send,
    SnapshotInstalled,
    fencing_epoch,
)
from peer.election import ElectionConfig, Role, SiteId
from peer.logstore import MemoryStore

ALL_FAULTS = frozenset({"drop", "duplicate", "reorder", "replay", "partition", "bridge", "one_way", "pause",
                        "crash", "skew", "jump", "churn"})
SIM_CONFIG = ElectionConfig(election_timeout_min_s=0.3, election_timeout_max_s=0.6, heartbeat_interval_s=0.05,
                            max_clock_drift=0.01, max_batch=16)


class Violation(AssertionError):
    pass


@dataclass
class _App:
    """A peer's applied state: the hash chain of applied entries (stands in for θ and the ledger)."""

    index: int = 0
    chain: bytes = b""


def _chain(prev: bytes, entry: Entry) -> bytes:
    return hashlib.blake2b(prev + encode_entry(entry), digest_size=16).digest()


def _fingerprint(c: ConsensusCore) -> tuple[object, ...]:
    return (c.role, c.hard, c.leader, c.commit_index, c.applied_index, c.log.snapshot, list(c.log.entries),
            c.votes.copy(), c.election_deadline, dict(c.match_index), dict(c.next_index))


@dataclass
class Cluster:
    """Cores, their disks and the invariant checker. Transport-agnostic: callers deliver messages."""

    config: ElectionConfig
    seed: int
    founders: dict[SiteId, str]
    check_lease: bool = True
    cores: dict[SiteId, ConsensusCore | None] = field(default_factory=dict)
    disks: dict[SiteId, MemoryStore] = field(default_factory=dict)
    apps: dict[SiteId, _App] = field(default_factory=dict)
    leaders: dict[int, SiteId] = field(default_factory=dict)
    committed: dict[int, Entry] = field(default_factory=dict)
    rounds: dict[int, Entry] = field(default_factory=dict)
    chains: dict[int, bytes] = field(default_factory=dict)
    events: int = 0

    def __post_init__(self) -> None:
        for site in sorted(self.founders):
            self.add(site, 0.0, founder=True)

    def add(self, site: SiteId, now: float, founder: bool = False) -> None:
        disk = MemoryStore()
        fresh = DurableState.fresh(self.founders if founder else None)
        disk.save_hard_state(fresh.hard)
        disk.write_log(1, tuple(fresh.entries))
        self.disks[site], self.apps[site] = disk, _App()
        self.restart(site, now)

    def address(self, site: SiteId) -> str:
        return f"{site}:7000"

    def restart(self, site: SiteId, now: float) -> None:
        rng = random.Random(f"{self.seed}/{site}/{self.events}")
        self.cores[site] = ConsensusCore.start(site, self.address(site), self.config, self.disks[site].load(), now,
                                               rng, self.apps[site].index)

    def crash(self, site: SiteId) -> None:
        self.cores[site] = None

    def live(self) -> list[SiteId]:
        return [s for s, c in sorted(self.cores.items()) if c is not None]

    def core(self, site: SiteId) -> ConsensusCore:
        c = self.cores[site]
        assert c is not None, f"{site} is down"
        return c

    # ----- driving -----

    def tick(self, site: SiteId, now: float) -> list[Send]:
        return self.execute(site, self.core(site).tick(now))

    def deliver(self, site: SiteId, msg: Message, now: float) -> list[Send]:
        core = self.core(site)
        stale = fencing_epoch(msg) < core.hard.epoch
        before = _fingerprint(core) if stale else None
        effects = core.receive(msg, now)
        if stale and _fingerprint(core) != before:
            raise Violation(f"stale {type(msg).__name__} (epoch {fencing_epoch(msg)}) from {msg.header.from_site} "
                            f"changed {site} at epoch {core.hard.epoch}")
        return self.execute(site, effects)

    def execute(self, site: SiteId, effects: Iterable[Effect]) -> list[Send]:
        """Run effects in order like the node: persist first, collect sends, apply commits."""
        self.events += 1
        sends: list[Send] = []
        disk, app = self.disks[site], self.apps[site]
        for e in effects:
            if disk.persist(e):
                continue
            if isinstance(e, Send):
                sends.append(e)
            elif isinstance(e, Committed):
                self._apply(site, app, e.entry)
            elif isinstance(e, SnapshotInstalled):
                app.index, app.chain = e.snapshot.last_index, e.snapshot.app_state
                self._check_chain(site, app.index, app.chain)
            elif isinstance(e, LeaderChanged) and e.leader == site:
                self._on_leader(site, e.epoch)
        return sends

    # ----- invariants -----

    def _apply(self, site: SiteId, app: _App, entry: Entry) -> None:
        if entry.index != app.index + 1:
            raise Violation(f"{site} applied index {entry.index} after {app.index} (exactly once, in order)")
        known = self.committed.setdefault(entry.index, entry)
        if known != entry:
            raise Violation(f"index {entry.index} committed as {known} and as {entry} (on {site})")
        if isinstance(entry.body, RoundCommit):
            first = self.rounds.setdefault(entry.body.round, entry)
            if first != entry:
                raise Violation(f"round {entry.body.round} committed twice: {first} / {entry} (on {site})")
        app.index, app.chain = entry.index, _chain(app.chain, entry)
        self._check_chain(site, app.index, app.chain)

    def _check_chain(self, site: SiteId, index: int, chain: bytes) -> None:
        if self.chains.setdefault(index, chain) != chain:
            raise Violation(f"{site} applied state at index {index} differs from another peer's")

    def _on_leader(self, site: SiteId, epoch: int) -> None:
        other = self.leaders.setdefault(epoch, site)
        if other != site:
            raise Violation(f"two leaders in epoch {epoch}: {other} and {site}")
        log = self.core(site).log
        for index, entry in self.committed.items():
            if index > log.snapshot.last_index and log.entry(index) != entry:
                raise Violation(f"leader {site} of epoch {epoch} lacks committed index {index}: {log.entry(index)}")

    def check_leases(self, local_now: dict[SiteId, float]) -> None:
        """At most one leader whose lease is valid at this instant (each judged by its own clock)."""
        if not self.check_lease:
            return
        holders = [s for s in self.live() if self.core(s).role is Role.LEADER
                   and local_now[s] < self.core(s)._lease_expiry()]
        if len(holders) > 1:
            raise Violation(f"overlapping leases: {holders} at epochs {[self.core(s).hard.epoch for s in holders]}")

    def compact_all(self, every: int) -> None:
        """Each peer folds its applied log into a snapshot every `every` entries (as after a checkpoint)."""
        for site in self.live():
            core, app = self.core(site), self.apps[site]
            if app.index - core.log.snapshot.last_index >= every:
                self.execute(site, core.compact(app.index, app.chain))


class Lockstep:
    """A cluster on one shared clock with a fixed one-way delay and no random faults: the harness of
    the unit tests (time travel, targeted crash/pause/partition) and of scripts/bench_consensus."""

    def __init__(self, sites: int | Iterable[str], config: ElectionConfig = SIM_CONFIG, delay: float = 0.001,
                 seed: int = 0) -> None:
        names = [f"s{i:02d}" for i in range(sites)] if isinstance(sites, int) else list(sites)
        self.cluster = Cluster(config, seed, {SiteId(s): f"{s}:7000" for s in names})
        self.delay, self.t, self.n = delay, 0.0, 0
        self.queue: list[tuple[float, int, SiteId, Message]] = []
        self.blocked: set[tuple[SiteId, SiteId]] = set()
        self.paused: set[SiteId] = set()
        self.sent = 0

    def post(self, src: SiteId, sends: list[Send]) -> None:
        for s in sends:
            self.sent += 1
            if (src, s.to) not in self.blocked:
                self.n += 1
                heapq.heappush(self.queue, (self.t + self.delay, self.n, s.to, s.msg))

    def _due(self) -> tuple[float, SiteId | None]:
        best: tuple[float, SiteId | None] = (self.queue[0][0], None) if self.queue else (math.inf, None)
        for site in self.cluster.live():
            if site not in self.paused:
                d = self.cluster.core(site).next_deadline()
                if d < best[0]:
                    best = (d, site)
        return best

    def step(self, until: float) -> bool:
        """Process the next event at or before `until`; False when there is none."""
        t, site = self._due()
        if t > until:
            self.t = until
            return False
        self.t = max(self.t, t)
        if site is not None:
            self.post(site, self.cluster.tick(site, self.t))
            return True
        _, _, to, msg = heapq.heappop(self.queue)
        if self.cluster.cores.get(to) is None or to in self.paused:
            return True  # lost: the process is down or stopped (its socket buffer is not modelled)
        self.post(to, self.cluster.deliver(to, msg, self.t))
        return True

    def run_for(self, dt: float) -> None:
        end = self.t + dt
        while self.step(end):
            pass

    def run_until(self, pred: Callable[[], bool], timeout: float) -> bool:
        end = self.t + timeout
        while not pred():
            if not self.step(end):
                return pred()
        return True

    def leaders(self) -> list[SiteId]:
        """Live, running peers that are leader and hold a valid lease now."""
        return [s for s in self.cluster.live() if s not in self.paused
                and self.cluster.core(s).role is Role.LEADER and self.t < self.cluster.core(s)._lease_expiry()]

    def leader(self) -> SiteId | None:
        held = self.leaders()
        return held[0] if len(held) == 1 else None

    def propose(self, site: SiteId, contributors: tuple[Contributor, ...] = ()) -> Decision:
        core = self.cluster.core(site)
        rnd = Round(core.log.last_round_entry()[0] + 1)
        d = core.propose_round(RoundCommit(rnd, contributors, f"w{rnd}".encode()), self.t)
        self.post(site, self.cluster.execute(site, d.effects))
        return d

    def do(self, site: SiteId, effects: list[Effect]) -> None:
        self.post(site, self.cluster.execute(site, effects))


@dataclass
class SimResult:
    seed: int
    voters: int
    faults: frozenset[str]
    violation: str | None = None
    events: int = 0
    committed_rounds: int = 0
    leader_after_heal_s: float | None = None
    commit_after_heal_s: float | None = None
    live_ok: bool = True


def liveness_bound(config: ElectionConfig, max_delay_s: float) -> float:
    """After faults stop: restarted peers refuse votes for E_min, then one election timeout (< E_max),
    a pre-vote and a vote round trip (4 delays), an EpochStart commit (2), a proposal wait (one
    heartbeat), a round commit (2) and the commit index reaching followers (1). Split votes retry after
    another E_max; the bound allows two retries."""
    e = config
    return e.election_timeout_min_s + 3 * e.election_timeout_max_s + 2 * e.heartbeat_interval_s + 12 * max_delay_s


class Sim:
    """One seeded run: `fault_s` of faults, then healing and a liveness check."""

    MAX_DELAY = 0.01  # seconds; normal one-way delay is uniform in [1 ms, MAX_DELAY]

    def __init__(self, seed: int, voters: int, faults: Iterable[str] = ALL_FAULTS, fault_s: float = 6.0,
                 config: ElectionConfig = SIM_CONFIG) -> None:
        self.rng = random.Random(seed)
        self.seed, self.faults, self.fault_s, self.config = seed, frozenset(faults), fault_s, config
        unknown = self.faults - ALL_FAULTS
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        sites = [SiteId(f"s{i:02d}") for i in range(voters)]
        self.cluster = Cluster(config, seed, {s: f"{s}:7000" for s in sites}, check_lease="jump" not in self.faults)
        self.result = SimResult(seed, voters, self.faults)
        self.t = 0.0
        self.queue: list[tuple[float, int, str, object]] = []
        self.n = 0
        skew = 0.005 if "skew" in self.faults else 0.0  # half the configured drift bound
        self.rate = {s: 1 + self.rng.uniform(-skew, skew) for s in sites}
        self.offset = {s: self.rng.uniform(0, 100) for s in sites}
        self.wake_at: dict[SiteId, float] = {}
        self.paused: dict[SiteId, list[Message]] = {}
        self.gone: set[SiteId] = set()  # left gracefully: never restarts
        self.leaving: set[SiteId] = set()
        self.blocked: set[tuple[SiteId, SiteId]] = set()
        self.history: list[tuple[SiteId, Message]] = []
        self.p_drop = self.rng.uniform(0.02, 0.2) if "drop" in self.faults else 0.0
        self.p_dup = 0.05 if "duplicate" in self.faults else 0.0
        self.jitter = 0.05 if "reorder" in self.faults else 0.0
        self.healed = False
        self.heal_t = math.inf
        self.proposed_after_heal: set[int] = set()
        self.next_site = len(sites)

    # ----- scheduling -----

    def push(self, t: float, kind: str, data: object) -> None:
        self.n += 1
        heapq.heappush(self.queue, (t, self.n, kind, data))

    def local(self, site: SiteId) -> float:
        return self.offset[site] + self.rate[site] * self.t

    def reschedule(self, site: SiteId) -> None:
        c = self.cluster.cores.get(site)
        if c is None or site in self.paused:
            return
        d = c.next_deadline()
        if d == math.inf:
            return
        # 1 ns late, so that rounding never wakes the peer just before its own deadline.
        t = max(self.t, (d - self.offset[site]) / self.rate[site] + 1e-9)
        if self.wake_at.get(site) != t:
            self.wake_at[site] = t
            self.push(t, "wake", (site, t))

    def send(self, src: SiteId, sends: list[Send]) -> None:
        for s in sends:
            if (src, s.to) in self.blocked or self.rng.random() < self.p_drop:
                continue
            copies = 2 if self.rng.random() < self.p_dup else 1
            for _ in range(copies):
                delay = self.rng.uniform(0.001, self.MAX_DELAY) + self.rng.uniform(0, self.jitter)
                self.push(self.t + delay, "deliver", (s.to, s.msg))
            if "replay" in self.faults and not self.healed:
                self.history.append((s.to, s.msg))
        self.reschedule(src)

    # ----- run -----

    def run(self) -> SimResult:
        try:
            self._run()
        except Violation as v:
            self.result.violation = str(v)
        self.result.events = self.cluster.events
        self.result.committed_rounds = len(self.cluster.rounds)
        return self.result

    def _run(self) -> None:
        for s in self.cluster.live():
            self.reschedule(s)
        self.push(0.05, "propose", None)
        if self.faults - {"skew"}:
            self.push(self.rng.uniform(0.2, 1.0), "fault", None)
        self.push(self.fault_s, "heal", None)
        end = self.fault_s + liveness_bound(self.config, self.MAX_DELAY)
        while self.queue:
            t, _, kind, data = heapq.heappop(self.queue)
            if t > end:
                break
            self.t = t
            getattr(self, f"_on_{kind}")(data)
            self.cluster.check_leases({s: self.local(s) for s in self.cluster.live()})
        self.result.live_ok = self.result.commit_after_heal_s is not None
        if not self.result.live_ok:
            raise Violation(f"liveness: no round committed on every live peer within "
                            f"{liveness_bound(self.config, self.MAX_DELAY):.2f}s of healing")

    def _on_wake(self, data: object) -> None:
        site, t = data  # type: ignore[misc]
        if self.wake_at.get(site) != t or self.cluster.cores.get(site) is None or site in self.paused:
            return
        del self.wake_at[site]
        self.send(site, self.cluster.tick(site, self.local(site)))

    def _on_deliver(self, data: object) -> None:
        site, msg = data  # type: ignore[misc]
        if self.cluster.cores.get(site) is None:
            return
        if site in self.paused:
            self.paused[site].append(msg)  # the kernel buffers it for the stopped process
            return
        self.send(site, self.cluster.deliver(site, msg, self.local(site)))

    def _on_propose(self, _: object) -> None:
        """The rounds layer of every peer: the leader decides the next round when it may."""
        self.push(self.t + 0.1, "propose", None)
        self._depart_leavers()
        self.cluster.compact_all(every=12)
        for site in self.cluster.live():
            core = self.cluster.core(site)
            if core.role is not Role.LEADER or site in self.paused:
                continue
            rnd = core.log.last_round_entry()[0] + 1
            contributors = tuple(
                Contributor(s, self.rng.randint(1, 10**6), (SampleRange(rnd, 0, self.rng.randint(1, 64)),),
                            hashlib.blake2b(f"{self.seed}/{rnd}/{s}".encode(), digest_size=8).digest())
                for s in self.cluster.live() if self.rng.random() < 0.7
            )
            weights = hashlib.blake2b(f"{self.seed}/{rnd}/{site}/{self.t}".encode(), digest_size=8).digest()
            d = core.propose_round(RoundCommit(Round(rnd), contributors, weights), self.local(site))
            if d.accepted and self.healed and d.index is not None:
                self.proposed_after_heal.add(d.index)
            self.send(site, self.cluster.execute(site, d.effects))
        self._check_progress()

    def _check_progress(self) -> None:
        if not self.healed:
            return
        live = [s for s in self.cluster.live()]
        if self.result.leader_after_heal_s is None and any(
                self.cluster.core(s).role is Role.LEADER and self.local(s) < self.cluster.core(s)._lease_expiry()
                for s in live):
            self.result.leader_after_heal_s = self.t - self.heal_t
        if self.result.commit_after_heal_s is None and any(
                all(self.cluster.apps[s].index >= i for s in live) for i in self.proposed_after_heal):
            self.result.commit_after_heal_s = self.t - self.heal_t

    # ----- faults -----

    def _on_fault(self, _: object) -> None:
        if self.healed:
            return
        self.push(self.t + self.rng.uniform(0.1, 0.8), "fault", None)
        actions = [a for a in ("partition", "bridge", "one_way", "pause", "crash", "jump", "replay", "churn")
                   if a in self.faults]
        if not actions:
            return
        getattr(self, f"_fault_{self.rng.choice(actions)}")()

    def _sites(self) -> list[SiteId]:
        return sorted(s for s in self.cluster.cores if s not in self.gone)

    def _fault_partition(self) -> None:
        sites = self._sites()
        if self.blocked or len(sites) < 2:
            self.blocked = set()
            return
        side = set(self.rng.sample(sites, self.rng.randint(1, len(sites) - 1)))
        self.blocked = {(a, b) for a in sites for b in sites if (a in side) != (b in side)}

    def _fault_bridge(self) -> None:
        sites = self._sites()
        if len(sites) < 3:
            return
        bridge = self.rng.choice(sites)
        rest = [s for s in sites if s != bridge]
        side = set(self.rng.sample(rest, self.rng.randint(1, len(rest) - 1)))
        self.blocked = {(a, b) for a in rest for b in rest if (a in side) != (b in side)}

    def _fault_one_way(self) -> None:
        sites = self._sites()
        a = self.rng.choice(sites)
        outgoing = self.rng.random() < 0.5
        self.blocked = {(a, b) if outgoing else (b, a) for b in sites if b != a}

    def _leader_or_any(self) -> SiteId | None:
        live = [s for s in self.cluster.live() if s not in self.paused]
        leaders = [s for s in live if self.cluster.core(s).role is Role.LEADER]
        pool = leaders if leaders and self.rng.random() < 0.6 else live
        return self.rng.choice(pool) if pool else None

    def _fault_pause(self) -> None:
        site = self._leader_or_any()
        if site is None:
            return
        self.paused[site] = []
        # Longer than the election timeout: the others elect a new leader meanwhile.
        self.push(self.t + self.rng.uniform(0.5, 3) * self.config.election_timeout_max_s, "resume", site)

    def _on_resume(self, site: object) -> None:
        s = SiteId(str(site))
        buffered = self.paused.pop(s, None)
        if buffered is None or self.cluster.cores.get(s) is None:
            return
        self.wake_at.pop(s, None)
        self.send(s, self.cluster.tick(s, self.local(s)))  # timers fire first, as after SIGCONT
        for msg in buffered:
            if self.cluster.cores.get(s) is not None:
                self.send(s, self.cluster.deliver(s, msg, self.local(s)))

    def _fault_crash(self) -> None:
        site = self._leader_or_any()
        if site is None:
            return
        self.cluster.crash(site)
        down = self.rng.uniform(0.1, 3.0)
        if "churn" in self.faults and down > self.config.election_timeout_max_s * 2:
            for s in self.cluster.live():
                self.cluster.core(s).member_dead(site)  # membership's verdict reaches every peer
        self.push(self.t + down, "restart", site)

    def _on_restart(self, site: object) -> None:
        s = SiteId(str(site))
        if self.cluster.cores.get(s) is not None or s in self.gone:
            return
        self.leaving.discard(s)  # a crash interrupted its leave: it comes back as a member
        self.cluster.restart(s, self.local(s))
        if "churn" in self.faults:
            for other in self.cluster.live():
                if other != s:
                    self.cluster.core(other).member_alive(s, self.cluster.address(s))
        self.reschedule(s)

    def _fault_jump(self) -> None:
        site = self.rng.choice(self._sites())
        self.offset[site] += self.rng.choice([-1, 1]) * self.rng.uniform(0.1, 2.0)
        self.wake_at.pop(site, None)
        self.reschedule(site)

    def _fault_replay(self) -> None:
        for _ in range(min(5, len(self.history))):
            to, msg = self.rng.choice(self.history)
            self.push(self.t + self.rng.uniform(0.001, 0.05), "deliver", (to, msg))

    def _fault_churn(self) -> None:
        live = [s for s in self.cluster.live() if s not in self.paused]
        if self.rng.random() < 0.5 and len(self._sites()) < len(self.cluster.founders) + 2:
            site = SiteId(f"s{self.next_site:02d}")
            self.next_site += 1
            self.rate[site], self.offset[site] = 1.0, self.rng.uniform(0, 100)
            self.cluster.add(site, self.local(site))
            for s in live:
                self.cluster.core(s).member_alive(site, self.cluster.address(site))
            self.reschedule(site)
        elif len(live) > 2:
            site = self.rng.choice(live)
            self.leaving.add(site)
            self.cluster.execute(site, self.cluster.core(site).leave(self.local(site)).effects)
            for s in live:
                if s != site:
                    self.cluster.core(s).member_left(site)  # membership gossips LEFT

    def _depart_leavers(self) -> None:
        """A leaving peer exits once its removal is committed (I8), as `ops leave` waits for it; it
        may learn that from any peer, so judge by the most advanced committed voter set."""
        live = [self.cluster.core(s) for s in self.cluster.live()]
        if not live:
            return
        ahead = max(live, key=lambda c: c.commit_index)
        committed_voters = dict(ahead.log.voters_at(ahead.commit_index))
        for site in sorted(self.leaving):
            if self.cluster.cores.get(site) is not None and site not in committed_voters:
                self.cluster.crash(site)
                self.gone.add(site)
                self.leaving.discard(site)
                self.paused.pop(site, None)

    def _on_heal(self, _: object) -> None:
        self.healed, self.heal_t = True, self.t
        self.blocked, self.p_drop, self.p_dup, self.jitter = set(), 0.0, 0.0, 0.0
        for site in list(self.paused):
            self._on_resume(site)
        for site in self._sites():
            if self.cluster.cores.get(site) is None:
                self._on_restart(site)
        if "churn" in self.faults:
            # Membership converges after healing: every peer sees every other live one alive.
            for s in self.cluster.live():
                for other in self.cluster.live():
                    if other in self.leaving:
                        self.cluster.core(s).member_left(other)
                    elif other != s:
                        self.cluster.core(s).member_alive(other, self.cluster.address(other))


def run_consensus_sweep(seeds: Iterable[int], voters: Iterable[int], faults: Iterable[str] = ALL_FAULTS,
                        fault_s: float = 6.0) -> dict[str, object]:
    """Runs every (seed, voters) pair; returns a summary with the failing seeds and their violations.

    Clock jumps void leases by design (docs/decisions/consensus-lease-drift.md), so when `jump` is
    among the faults every seed also runs once without it, with the lease invariant checked."""
    fault_set = frozenset(faults)
    variants = [fault_set] + ([fault_set - {"jump"}] if "jump" in fault_set else [])
    results = [Sim(seed, n, f, fault_s).run() for n in voters for seed in seeds for f in variants]
    failures = [r for r in results if r.violation]
    heal = [r.commit_after_heal_s for r in results if r.commit_after_heal_s is not None]
    lead = [r.leader_after_heal_s for r in results if r.leader_after_heal_s is not None]
    return {
        "runs": len(results),
        "lease_checked_runs": sum(1 for r in results if "jump" not in r.faults),
        "violations": len(failures),
        "failures": [{"seed": r.seed, "voters": r.voters, "faults": sorted(r.faults), "violation": r.violation}
                     for r in failures[:20]],
        "committed_rounds": sum(r.committed_rounds for r in results),
        "events": sum(r.events for r in results),
        "max_leader_after_heal_s": max(lead, default=None),
        "max_commit_after_heal_s": max(heal, default=None),
        "liveness_bound_s": liveness_bound(SIM_CONFIG, Sim.MAX_DELAY),
        "faults": sorted(fault_set),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Simulate election + commit log under faults.")
    p.add_argument("--seeds", type=int, default=100, help="number of seeds, from --first-seed")
    p.add_argument("--first-seed", type=int, default=0, help="first seed (replay one with --seeds 1)")
    p.add_argument("--voters", type=int, nargs="+", default=[3, 5], help="voter counts to simulate")
    p.add_argument("--faults", default=",".join(sorted(ALL_FAULTS)), help="comma-separated fault kinds")
    p.add_argument("--fault-s", type=float, default=6.0, help="seconds of faults before healing")
    args = p.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    summary = run_consensus_sweep(range(args.first_seed, args.first_seed + args.seeds), args.voters, faults,
                                  args.fault_s)
    print(json.dumps(summary, indent=2))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
