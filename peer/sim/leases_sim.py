"""Deterministic simulation of data leases (DARL) under faults, with invariants checked per event.

Runs on the generic simulator (peer/sim/runner.py: event heap, `SimNetwork`, `NodeClock`). Every site
is a `LeasePeer` node: the node's lease cores fed from the log exactly as the node feeds them
(peer/core/lease_log.py: the owner, the holder and the ring views they derive from committed voter
changes) plus a training stand-in that consumes samples at a site-specific speed, claims them when
its time-boxed round ends and reports them. The rounds are decided by one more node, `Control` at
address "leader", which runs the node's own round leader (`RoundLeader`: open, collect reports,
admission, deadline, the empty commit of a round nobody trained in) and its decision core
(`Decision`: the RoundCommit proposal), and never crashes. Only consensus is stood in for: Control's
log (real log entries: VoterChanges and RoundCommits) commits at once and is replicated with
resent `LogUpdate`s, which also carry the open round. Cheap: the 50-peer benchmark uses it. What
this simulator tests is the lease protocol under lease-specific faults; the real consensus core and
round core deciding rounds through leader failovers are the whole-peer simulator's
(peer/sim/peer_sim.py, `ops simulate --protocol peer`).

Faults per seed (peer/sim/lease_faults.py), at seeded random times: crash and restart of a holder; the owners of a block
crashed in turn (each after the previous one is back); a majority of a block's owners crashed at once
(rebuild from the log); a zombie paused past its lease (SIGSTOP: its messages wait); a late join; a
rolling restart of every site; a graceful leave and rejoin; clock offsets and rates (one site's clock
runs 40% slow); message loss, duplication and reordering.

Checked after every event (peer/sim/lease_checks.py): no sample in two commits of a data epoch (I4); no two sites vouched for
the same sample in undecided rounds unless its record was rebuilt; no lease generation acknowledged
as started to two sites. At the end: every epoch exactly once (I5, via peer/core/audit.py), all finished.

    .venv/bin/python -m peer.sim.leases_sim --seeds 0:20 --sites 5
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from peer.core import rounds as r
from peer.core import events as ev
from peer.core.decision import Decision
from peer.core.audit import EpochAudit, audit, event_to_json, universe_to_json
from peer.core.commitlog import (
    Contributor,
    Entry,
    LogIndex,
    Round,
    RoundCommit,
    VoterChange,
)
from peer.core.lease_log import LeaseLog
from peer.core.election import Epoch, HardState, Header, SiteId
from peer.core.lease_types import LeaseEvent
from peer.core.lease_config import LeaseConfig
from peer.logstore import FileStore
from peer.core.ring import RingView
from peer.sim.clock import NodeClock
from peer.sim.network import SimNetwork
from peer.sim.faults import parse_faults
from peer.sim.lease_checks import LeaseChecker, Truth
from peer.sim.lease_faults import LeaseFaults
from peer.sim.runner import RunResult, Simulation, derive_rng

LEADER = "leader"
LEADER_EPOCH = 1
"""The leader node never fails over: one epoch for the whole run."""
STEP = 0.5
"""Seconds (local) between two training steps of a site."""
RESEND = 0.5
"""Log updates (with the open round) are resent this often until acknowledged."""


@dataclass(frozen=True)
class SimConfig:
    sites: int = 5
    blocks: int = 40
    block_samples: int = 32
    epochs: int = 3
    round_len: float = 8.0
    """A round's compute budget (RoundOpen.budget_s): a site claims what it trained this long after
    it saw the round open."""
    decide_after: float = 8.0
    """The round's deadline is this long after its budget: a report arriving later is excluded. It
    covers the site whose clock runs 40% slow (s1 under faults): its 8 s budget ends 13.3 s after
    the round opened."""
    drop: float = 0.02
    dup: float = 0.01
    reorder: float = 0.02
    faults: bool = True
    fault_span: float = 15.0
    """Faults start within this many seconds of each other (the run takes a few times more)."""
    max_time: float = 2000.0
    speed_scale: int = 1
    """Multiplies every site's samples per step (the benchmark's big datasets)."""
    lease: LeaseConfig = field(default_factory=LeaseConfig.local_test)


# --- the log and the messages of the leader node ---


@dataclass(frozen=True)
class LogUpdate:
    """Leader -> site: log entries from `first` (1-based) on, and the round open now."""

    first: int
    entries: tuple[Entry, ...]
    """The real log's entries: VoterChanges (the ring views) and RoundCommits."""
    open: r.RoundOpen | None
    """What the round leader broadcast last, until its round is decided."""
    opening: int
    """Counts the leader's openings: a round opened again (nobody trained in it) is a new one."""


@dataclass(frozen=True)
class LogAck:
    site: SiteId
    applied: int


@dataclass(frozen=True)
class SimSend:
    to: str
    msg: object


class Control:
    """The round leader (the node's `RoundLeader` and `Decision` cores) over a commit log that
    commits at once (the consensus stand-in), replicated to the sites."""

    def __init__(self, truth: Truth, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.truth = truth
        self.log: list[Entry] = []
        self._voters: set[SiteId] = set()
        self.acked: dict[SiteId, int] = {}
        """Sites the log is replicated to (members, joiners, leavers until gone) -> applied index."""
        self.rounds = r.RoundLeader(r.RoundsConfig(
            inner_steps=1, samples_per_step=1, deadline_s=cfg.round_len + cfg.decide_after,
            data_epochs=cfg.epochs, budget_s=cfg.round_len), truth.ledger)
        self.decision = Decision("control")  # a leader that trains nothing and never leaves
        self.committed = 0
        self.open: r.RoundOpen | None = None
        self.opening = 0
        self._next_resend = 0.0

    def commit_view(self, members: set[SiteId]) -> None:
        """Commits the voter set `members`, a VoterChange per site in or out, as consensus does; every
        peer's LeaseLog derives the ring view from them (its version: the last change's index)."""
        changes = [VoterChange(s, s, True, "joined") for s in sorted(members - self._voters)]
        changes += [VoterChange(s, s, False, "gone") for s in sorted(self._voters - members)]
        for change in changes:
            self._append(change)
        self._voters = set(members)
        if changes:
            self.truth.see_view(len(self.log), RingView.of(len(self.log), sorted(members)))

    def _append(self, body: VoterChange | RoundCommit) -> None:
        self.log.append(Entry(LogIndex(len(self.log) + 1), Epoch(LEADER_EPOCH), body))

    # Node interface (the leader's clock is true time: it is never skewed)

    def tick(self, now: float) -> list[SimSend]:
        header = Header(SiteId(LEADER), LEADER, Epoch(LEADER_EPOCH), self.committed)
        # The voters are the live sites: the fault schedule removes a dead or leaving one from the
        # view, as membership does for the node.
        self._leader(self.rounds.tick(now, header, self.committed, sorted(self._voters), b""), now)
        if now < self._next_resend:
            return []
        self._next_resend = now + RESEND
        # also a heartbeat: it carries the open round, so it goes out even with no new entry
        return [SimSend(s, LogUpdate(i + 1, tuple(self.log[i:]), self.open, self.opening))
                for s, i in sorted(self.acked.items())]

    def receive(self, msg: object, now: float) -> list[SimSend]:
        if isinstance(msg, LogAck) and msg.site in self.acked:
            self.acked[msg.site] = max(self.acked[msg.site], msg.applied)
        elif isinstance(msg, r.Contribution):
            self._leader(self.rounds.receive(msg, now), now)
        return []

    def next_deadline(self) -> float:
        return min(self._next_resend, self.rounds.next_deadline())

    def _leader(self, effects: Sequence[r.Effect], now: float) -> None:
        for e in effects:
            if isinstance(e, r.Broadcast):
                self.open, self.opening, self._next_resend = e.msg, self.opening + 1, now  # tell every site now
            elif isinstance(e, r.Decide):
                self.truth.excluded.extend((x.site, x.reason) for x in e.excluded)
                self._decide(self.decision.handle(ev.DecideRound(e, frozenset(self._voters)), now), now)

    def _decide(self, effects: Sequence[ev.Effect], now: float) -> None:
        """The executor's part: the fetch of the admitted pseudo-gradients succeeds at once (this
        simulator has no θ), and the proposal commits at once."""
        for e in effects:
            if isinstance(e, ev.Fetch):
                self._decide(self.decision.handle(ev.OutcomeReady(e.round, e.attempt, b""), now), now)
            elif isinstance(e, ev.Propose):
                self._append(e.commit)
                self.committed = e.commit.round
                self.open, self._next_resend = None, now
                self.truth.see_commit(len(self.log), e.commit.round,
                                      [(c.site, c.ranges) for c in e.commit.contributors])
                self.rounds.on_commit(e.commit.round)


class LeasePeer:
    """One site: the node's lease cores fed from the log (`LeaseLog`, as peer/leasing.py runs them),
    its copy of the log from `Control`'s LogUpdates, and a training stand-in that trains all the
    time, claims what it trained when its round's budget ends and reports it to the leader."""

    def __init__(self, site: SiteId, universe: dict[int, int], cfg: SimConfig, speed: int, now: float,
                 boot: int) -> None:
        self.site = site
        self.cfg = cfg
        self.speed = speed
        self.leases = LeaseLog(site, universe, cfg.lease, boot, prefetch=2)
        self.leases.note_leader_epoch(LEADER_EPOCH)
        self.owner, self.client = self.leases.owner, self.leases.client
        self.client.trained_at(float(speed))  # as a node's round core sets it from its trainer's pace
        self.applied = 0
        self.next_step = now + STEP
        self.opening = 0
        """The leader's last opening this site acted on."""
        self.closing: tuple[int, float] | None = None
        """(round, local time): when this round's budget ends and what was trained is claimed."""
        self.report: int | None = None
        """The round whose report goes out as soon as every owner answered its claims."""
        self.left = False

    def tick(self, now: float) -> list[Any]:
        out: list[Any] = []
        if now >= self.next_step:
            self.next_step = now + STEP
            if not self.left:
                self.client.next_samples(self.speed * self.cfg.speed_scale, now)
        if self.closing is not None and now >= self.closing[1]:
            self.report, self.closing = self.closing[0], None
            out += self.client.end_round(self.report, now)
        return [*out, *self.leases.tick(now), *self._report()]

    def receive(self, msg: object, now: float) -> list[Any]:
        if isinstance(msg, LogUpdate):
            return self._log_update(msg, now)
        return [*self.leases.receive(msg, now), *self._report()]  # type: ignore[arg-type]

    def next_deadline(self) -> float:
        return min(self.next_step, self.leases.next_deadline(),
                   self.closing[1] if self.closing is not None else float("inf"))

    def leave(self, now: float) -> list[Any]:
        """Graceful leave (I8): give every lease back, train no more."""
        self.left, self.closing = True, None
        return list(self.client.release_all(now))

    def _log_update(self, m: LogUpdate, now: float) -> list[Any]:
        out: list[Any] = []
        if m.first <= self.applied + 1:
            fresh = m.entries[self.applied + 1 - m.first:]
            self.applied += len(fresh)
            out += self.leases.apply_entries(fresh, now)
        if self.closing is not None and self.closing[0] <= self.leases.ledger.last_round:
            self.closing = None  # decided without this site: what it trained goes into its next round
        if m.open is not None and m.opening > self.opening and self.client.view is not None:
            self.opening, rnd = m.opening, m.open.round
            if self.left or rnd in self.client.rounds:
                self.report = rnd  # nothing to train, or opened again: the same report (or none) again
            else:
                self.closing = (rnd, now + m.open.budget_s)
        out.append(SimSend(LEADER, LogAck(self.site, self.applied)))
        return out + self._report()

    def _report(self) -> list[SimSend]:
        """The report of `self.report` once its claims are answered: the vouched samples, or none."""
        if self.report is None:
            return []
        rnd = self.report
        c = self.client.offer(rnd) if rnd in self.client.rounds else None
        if c is None and rnd in self.client.rounds:
            return []  # an owner has not answered yet
        self.report = None
        ranges, vouchers = (c.ranges, c.vouchers) if c is not None else ((), ())
        tokens = sum(x.end - x.start for x in ranges)
        header = Header(self.site, self.site, Epoch(LEADER_EPOCH), self.leases.ledger.last_round)
        return [SimSend(LEADER, r.Contribution(header, rnd, self.site, self.site, tokens, ranges,
                                               b"sim" if ranges else b"", vouchers))]


@dataclass
class Result:
    seed: int
    violations: list[str]
    audits: list[EpochAudit]
    events: list[LeaseEvent]
    end_time: float
    messages: int
    committed_sets: list[frozenset[tuple[int, int]]]
    universe: dict[int, int]
    log: list[tuple[int, list]]
    faults: list[tuple[float, str]]
    by_kind: dict[str, int]
    excluded: list[tuple[str, str]]
    """(site, reason) of every report or expected site a round left out."""


class LeaseSim:
    """One seeded run: the sites, the leader node, the fault schedule."""

    def __init__(self, seed: int, cfg: SimConfig, trace: Callable[[str], None] | None = None) -> None:
        self.seed, self.cfg = seed, cfg
        self.rng = derive_rng(seed, "leases")
        self.universe = {1000 + i: cfg.block_samples - (i % 3 == 2) for i in range(cfg.blocks)}
        net = SimNetwork(derive_rng(seed, "network"), latency_s=(0.001, 0.05))
        if cfg.faults:
            net.drop_rate, net.duplicate_rate = cfg.drop, cfg.dup
            net.reorder_rate, net.reorder_window_s = cfg.reorder, 0.2
        self.sim = Simulation(seed, net, trace)
        self.truth = Truth(self.universe)
        self.control = Control(self.truth, cfg)
        self.boots: dict[SiteId, int] = {}
        self.checker = LeaseChecker(self.truth, self.universe, cfg.epochs)
        self.faults = LeaseFaults(self.sim, self.rng, self.truth, self.universe, self.control.commit_view)
        self.speeds: dict[SiteId, int] = {}

    def run(self) -> Result:
        names = [SiteId(f"s{i}") for i in range(self.cfg.sites)]
        founders = names if not self.cfg.faults else names[:-1]
        self.sim.add_node(LEADER, lambda now: (self.control, []))
        for n in names:
            self.speeds[n] = self.rng.choice([1, 2, 3, 5, 8])
            rate = 0.6 if (n == "s1" and self.cfg.faults) else (self.rng.uniform(0.98, 1.02) if self.cfg.faults else 1.0)
            clock = NodeClock(offset=self.rng.uniform(-50, 50), rate=rate)
            at = 0.0 if n in founders else 1e9  # late joiners are started by their join fault
            self.sim.add_node(n, partial(self._start, n), at=at, clock=clock)
        for n in founders:
            self.control.acked[n] = 0
        self.control.commit_view(set(founders))
        if self.cfg.faults:
            self.faults.schedule(names, self.cfg.sites, self.cfg.fault_span, self.cfg.lease.ttl)
        self.sim.schedule(0.0, self._watch_epochs, "watch epochs")
        res = self.sim.run(self.cfg.max_time, self.checker)
        t = self.truth
        return Result(self.seed, res.violations, audit(self.universe, t.commits, self.checker.events),
                      self.checker.events, res.end_time, res.stats.get("sent", 0), t.committed_sets,
                      self.universe, t.commits, self.faults.notes, self.checker.by_kind, t.excluded)

    def _watch_epochs(self) -> None:
        if self.truth.ledger.data_epoch >= self.cfg.epochs:
            self.sim.stop()
        else:
            self.sim.schedule(self.sim.now + 1.0, self._watch_epochs, "watch epochs")

    def _start(self, name: SiteId, now: float) -> tuple[LeasePeer, list[Any]]:
        return self._peer(name, now), []

    def _peer(self, name: SiteId, now: float) -> LeasePeer:
        # The node keeps this count on its disk; LeaseLog distrusts a restarted process's records.
        self.boots[name] = boot = self.boots.get(name, -1) + 1
        self.control.acked[name] = 0  # a (re)started process applies the log from its start
        return LeasePeer(name, self.universe, self.cfg, self.speeds[name], now, boot)


def write_data_dir(out: Path, universe: dict[int, int], log: list[tuple[int, list]],
                   events: list[LeaseEvent]) -> None:
    """Write a run's commit log (the real on-disk format, peer/logstore.py), the dataset's blocks and
    the lease ledger where a peer keeps them, so `ops audit --data-dir OUT` reads a simulated run."""
    entries = tuple(
        Entry(LogIndex(i), Epoch(1), RoundCommit(
            Round(rnd), tuple(Contributor(site, sum(r.end - r.start for r in rs), tuple(rs), b"")
                              for site, rs in sorted(contributors)), b""))
        for i, (rnd, contributors) in enumerate(log, start=1))
    store = FileStore(out / "consensus")
    store.save_hard_state(HardState(Epoch(1), None))  # a real store writes its hardstate before its log
    store.write_log(1, entries)
    store.save_commit_index(len(entries))  # a finished run: every entry written is committed
    (out / "leases").mkdir(parents=True, exist_ok=True)
    (out / "leases" / "universe.json").write_text(universe_to_json(universe))
    (out / "leases" / "ledger.jsonl").write_text("".join(event_to_json(e) + "\n" for e in events))


def simulate(seed: int, cfg: SimConfig | None = None) -> Result:
    return LeaseSim(seed, cfg or SimConfig()).run()


def run_seed(args: argparse.Namespace, seed: int, trace: Callable[[str], None] | None = None) -> RunResult:
    """One seed for `ops simulate --protocol leases`: ops/simulate.py registers
    `"leases": SimProtocol(leases_sim.run_seed, leases_sim.replay_flags)`. `--members` sites, every
    lease fault unless `--faults none`; one leader that never fails."""
    cfg = SimConfig(sites=args.members, faults=bool(parse_faults(args.faults)))
    run = LeaseSim(seed, cfg, trace)
    res = run.run()
    return RunResult(seed, run.sim.events, res.end_time, res.violations, dict(run.sim.network.stats))


def replay_flags(args: argparse.Namespace) -> list[str]:
    return ["--members", str(args.members), "--faults", args.faults]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="leases_sim", description="Simulate data leases under faults.")
    p.add_argument("--seeds", default="0:10", help="seed range A:B (B exclusive) or one seed")
    p.add_argument("--sites", type=int, default=5, help="number of sites (the last one joins late)")
    p.add_argument("--no-faults", action="store_true", help="no crashes, pauses or joins")
    p.add_argument("--counts", action="store_true",
                   help="also print the lease events of all seeds by kind (grant, steal, reclaim, rebuild, ...)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write the first seed's log, blocks and lease ledger here (for `ops audit`)")
    args = p.parse_args(argv)
    a, _, b = args.seeds.partition(":")
    seeds = range(int(a), int(b)) if b else [int(a)]
    cfg = SimConfig(sites=args.sites, faults=not args.no_faults)
    bad = 0
    counts: dict[str, int] = {}
    t0 = time.time()
    for seed in seeds:
        try:
            res = simulate(seed, cfg)
        except Exception as err:  # a core raising is a failure of this seed, not of the sweep
            bad += 1
            print(f"seed {seed}: crashed: {type(err).__name__}: {err}")
            continue
        for e in res.events:
            counts[e.kind.value] = counts.get(e.kind.value, 0) + 1
        if args.out is not None and seed == seeds[0]:
            write_data_dir(args.out, res.universe, res.log, res.events)
        if res.violations:
            bad += 1
            print(f"seed {seed}: {len(res.violations)} violations; first: {res.violations[0]}")
        done = seed - seeds[0] + 1
        if done % 50 == 0 and done < len(seeds):
            print(f"... {done} seeds, {bad} with violations, {time.time() - t0:.1f}s", flush=True)
    print(f"{len(seeds)} seeds, {bad} with violations, {time.time() - t0:.1f}s")
    if args.counts:
        print("lease events: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
