"""Deterministic simulation of data leases (DARL) under faults, with invariants checked per event.

Each simulated site runs the real cores (peer/leases.py owner, peer/lease_client.py holder) over a
seeded fake network (delay, loss, duplication) with its own skewed clock, and a training stand-in
that consumes samples at a site-specific speed. One `Control` stands in for the leader and its
commit log: it closes rounds, runs the real admission check (peer/admission.py), appends RoundCommits,
and commits ring views (membership changes) as the voter set would; every site applies the log in
order after a network delay. (The generic peer/sim runner and the real consensus core are not used
yet: see docs/leases.md, "Simulator".)

Faults per seed, at seeded random times: crash and restart of a holder; crash of a block's owners
in turn (each after the previous one is back); simultaneous crash of a majority of a block's owners
(rebuild from the log); a zombie paused past its lease; late joins; a rolling restart of every
site; a graceful leave; clock offsets and rates (one site's clock runs 40% slow).

Checked after every event: no sample in two commits of a data epoch (I4); no two sites hold owner
vouchers for the same sample in undecided rounds unless its record was rebuilt; no lease generation
acknowledged as started to two sites. At the end: every epoch that ended has every sample in
exactly one commit (I5, via peer/audit.py), and the run finished its epochs.

    .venv/bin/python -m peer.sim.leases_sim --seeds 0:20 --sites 5
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from peer.admission import Admission, Contribution, admit_round
from peer.audit import EpochAudit, EpochLedger, audit, event_to_json, universe_to_json
from peer.commitlog import Contributor, Entry, LogIndex, Round, RoundCommit
from peer.election import Epoch
from peer.election import SiteId
from peer.lease_client import LeaseClient
from peer.lease_types import (
    EventKind,
    LeaseEvent,
    Message,
    Send,
    Spans,
    StartReply,
    TrainedReply,
    fmt,
    intersect,
    normalize,
    to_ranges,
)
from peer.leases import LeaseConfig, LeaseOwner
from peer.logstore import FileStore
from peer.ring import RingView

TICK = 0.25
STEP = 0.5


@dataclass(frozen=True)
class SimConfig:
    sites: int = 5
    blocks: int = 40
    block_samples: int = 32
    epochs: int = 3
    round_len: float = 8.0
    decide_after: float = 2.0
    """The leader decides round r this long after closing it (contributions arriving later are late)."""
    drop: float = 0.02
    dup: float = 0.01
    faults: bool = True
    fault_span: float = 15.0
    """Faults start within this many seconds of each other (the run takes a few times more)."""
    max_time: float = 2000.0
    speed_scale: int = 1
    """Multiplies every site's samples per step (the benchmark's big datasets)."""
    lease: LeaseConfig = field(default_factory=LeaseConfig.local_test)


@dataclass
class Site:
    name: SiteId
    speed: int
    offset: float
    rate: float
    ledger: EpochLedger
    owner: LeaseOwner
    client: LeaseClient
    applied: int = 0
    alive: bool = True
    paused_until: float = 0.0
    incarnation: int = 0

    def local(self, t: float) -> float:
        return self.offset + self.rate * t


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


class Sim:
    def __init__(self, seed: int, cfg: SimConfig) -> None:
        self.seed, self.cfg = seed, cfg
        self.rng = random.Random(seed)
        self.universe = {1000 + i: cfg.block_samples - (i % 3 == 2) for i in range(cfg.blocks)}
        self.t = 0.0
        self.q: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.sites: dict[SiteId, Site] = {}
        self.log: list[tuple[int, list[tuple[SiteId, tuple]]]] = []
        self.leader_ledger = EpochLedger(self.universe)
        self.views: list[RingView] = []
        self.contribs: dict[int, list[Contribution]] = {}
        self.round = 0
        self.violations: list[str] = []
        self.events: list[LeaseEvent] = []
        self.messages = 0
        self.by_kind: dict[str, int] = {}
        """Messages sent, per type (the benchmark's grant and renewal counts)."""
        self.vouched: dict[tuple[int, int], list[tuple[SiteId, int, Spans]]] = {}
        self.started: dict[tuple[int, int, int], SiteId] = {}
        self.rebuilt: set[tuple[int, int]] = set()
        self.committed_sets: list[frozenset[tuple[int, int]]] = []
        self._epoch_samples: set[tuple[int, int]] = set()
        self.contributed: set[tuple[SiteId, int]] = set()
        self.faults: list[tuple[float, str]] = []
        """(time, what) of every fault injected, for replay and for tests that check coverage."""
        self.decisions: list[Admission] = []

    # --- event loop ---

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.q, (t, self.seq, fn))

    def run(self) -> Result:
        names = [SiteId(f"s{i}") for i in range(self.cfg.sites)]
        founders = names if not self.cfg.faults else names[:-1]
        for n in founders:
            self._spawn(n, amnesiac=False)
        self._commit_view(set(founders))
        if self.cfg.faults:
            self._schedule_faults(names)
        self.at(self.cfg.round_len, self._close_round)
        while self.q and self.leader_ledger.data_epoch < self.cfg.epochs and self.t < self.cfg.max_time:
            self.t, _, fn = heapq.heappop(self.q)
            fn()
        if self.leader_ledger.data_epoch < self.cfg.epochs:
            self.violations.append(f"t={self.t:.1f}: only {self.leader_ledger.data_epoch} of "
                                   f"{self.cfg.epochs} epochs finished (liveness)")
        audits = audit(self.universe, self.log, self.events, run_ended=False)
        for a in audits:
            if not a.ok:
                self.violations.append(f"audit: {a}")
        return Result(self.seed, self.violations, audits, self.events, self.t, self.messages,
                      self.committed_sets, self.universe, self.log, self.faults,
                      self.by_kind)

    # --- sites ---

    def _spawn(self, name: SiteId, amnesiac: bool) -> None:
        old = self.sites.get(name)
        ledger = EpochLedger.from_log(self.universe, self.log)  # the durable commit log survives
        lc = self.cfg.lease
        speed = old.speed if old else self.rng.choice([1, 2, 3, 5, 8])
        offset = old.offset if old else self.rng.uniform(-50, 50)
        rate = old.rate if old else (0.6 if name == "s1" else self.rng.uniform(0.98, 1.02))
        s = Site(name, speed, offset, rate, ledger, LeaseOwner(name, ledger, lc, amnesiac=amnesiac),
                 LeaseClient(name, ledger, lc), applied=len(self.log),
                 incarnation=(old.incarnation + 1) if old else 0)
        self.sites[name] = s
        inc = s.incarnation
        self._every(s, inc, TICK, lambda: self._tick(s))
        self._every(s, inc, STEP, lambda: self._train(s))
        if self.views and amnesiac:
            self._apply_view(s, len(self.views) - 1)

    def _every(self, s: Site, inc: int, dt: float, fn: Callable[[], None]) -> None:
        def go() -> None:
            if not s.alive or s.incarnation != inc or self.sites[s.name] is not s:
                return
            if self.t >= s.paused_until:
                fn()
            self.at(max(self.t, s.paused_until) + dt, go)
        self.at(self.t + self.rng.uniform(0, dt), go)

    def _effects(self, s: Site, effects: list) -> None:
        for e in effects:
            if isinstance(e, LeaseEvent):
                self.events.append(e)
                if e.kind is EventKind.REBUILD:
                    self.rebuilt.add((e.data_epoch, e.block))
            else:
                self._send(s.name, e)

    def _tick(self, s: Site) -> None:
        now = s.local(self.t)
        self._effects(s, s.owner.tick(now) + s.client.tick(now))
        self._maybe_contribute(s)

    def _train(self, s: Site) -> None:
        s.client.next_samples(s.speed * self.cfg.speed_scale, s.local(self.t))

    def _send(self, frm: SiteId, e: Send) -> None:
        self.messages += 1
        kind = type(e.msg).__name__
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if self.rng.random() < self.cfg.drop:
            return
        copies = 2 if self.rng.random() < self.cfg.dup else 1
        for _ in range(copies):
            self.at(self.t + self.rng.uniform(0.001, 0.05), lambda: self._deliver(e.to, e.msg))

    def _deliver(self, to: SiteId, msg: Message) -> None:
        s = self.sites.get(to)
        if s is None or not s.alive or self.t < s.paused_until:
            return
        now = s.local(self.t)
        if isinstance(msg, StartReply) and msg.ok:
            self._check_start(to, msg)
        if isinstance(msg, TrainedReply):
            self._check_vouchers(to, msg)
        self._effects(s, s.owner.receive(msg, now) + s.client.receive(msg, now))
        self._maybe_contribute(s)

    # --- the leader and its log (stand-in) ---

    def _close_round(self) -> None:
        self.round += 1
        r = self.round
        self.contribs[r] = []
        for s in list(self.sites.values()):
            self.at(self.t + self.rng.uniform(0.001, 0.05), lambda s=s, inc=s.incarnation: self._end_round(s, inc, r))
        self.at(self.t + self.cfg.decide_after, lambda: self._decide(r))
        self.at(self.t + self.cfg.round_len, self._close_round)

    def _end_round(self, s: Site, inc: int, r: int) -> None:
        if s.alive and s.incarnation == inc and self.t >= s.paused_until and s.client.view is not None:
            self._effects(s, s.client.end_round(r, s.local(self.t)))
            self._maybe_contribute(s)

    def _maybe_contribute(self, s: Site) -> None:
        for r in sorted(s.client.rounds):
            c = s.client.contribution(r)
            if c is not None and c.ranges and r in self.contribs and (s.name, r) not in self.contributed:
                self.contributed.add((s.name, r))
                self.at(self.t + self.rng.uniform(0.001, 0.05), lambda c=c: self._receive_contribution(c))

    def _receive_contribution(self, c: Contribution) -> None:
        if c.round == self.round and c.round not in {rnd for rnd, _ in self.log}:
            self.contribs[c.round].append(c)

    def _decide(self, r: int) -> None:
        offered = {c.site: c for c in self.contribs.pop(r, [])}
        decisions = admit_round(r, offered.values(), self.leader_ledger)
        self.decisions.extend(decisions)
        included = [(d.site, offered[d.site].ranges) for d in decisions if d.included]
        applied = self.leader_ledger.apply(r, included)
        if applied.duplicated_samples:
            self.violations.append(f"t={self.t:.1f}: round {r} commits {applied.duplicated_samples} "
                                   f"samples twice in data epoch {applied.data_epoch} (I4)")
        for site, ranges in included:
            for rg in ranges:
                self._epoch_samples.update((rg.block_id, i) for i in range(rg.start, rg.end))
        if applied.epoch_ended:
            self.committed_sets.append(frozenset(self._epoch_samples))
            self._epoch_samples = set()
            self.vouched.clear()
        self.log.append((r, included))
        for k, lst in list(self.vouched.items()):
            self.vouched[k] = [v for v in lst if v[1] > r]
        n = len(self.log)
        for s in list(self.sites.values()):
            self.at(self.t + self.rng.uniform(0.01, 0.3), lambda s=s: self._apply_log(s, n))

    def _apply_log(self, s: Site, upto: int) -> None:
        if not s.alive or self.sites[s.name] is not s:
            return
        while s.applied < upto:
            rnd, contributors = self.log[s.applied]
            s.ledger.apply(rnd, contributors)
            s.applied += 1
            now = s.local(self.t)
            self._effects(s, s.owner.on_commit(now) + s.client.on_commit(now))

    def _commit_view(self, members: set[SiteId]) -> None:
        self.views.append(RingView.of(len(self.views) + 1, members))
        i = len(self.views) - 1
        for s in list(self.sites.values()):
            self.at(self.t + self.rng.uniform(0.01, 0.3), lambda s=s: self._apply_view(s, i))

    def _apply_view(self, s: Site, i: int) -> None:
        if not s.alive or self.sites[s.name] is not s:
            return
        self._apply_log(s, len(self.log))
        now = s.local(self.t)
        prev = self.views[i - 1] if i > 0 else None
        self._effects(s, s.owner.set_view(self.views[i], 1, now, previous=prev)
                      + s.client.set_view(self.views[i], 1, now))

    # --- invariants ---

    def _check_start(self, to: SiteId, msg: StartReply) -> None:
        key = (self.sites[to].ledger.data_epoch, msg.lease.block_id, msg.lease.generation)
        other = self.started.setdefault(key, to)
        if other != to:
            self.violations.append(f"t={self.t:.1f}: generation {msg.lease.generation} of block {msg.lease.block_id} "
                                   f"started by {other} and {to}")

    def _check_vouchers(self, to: SiteId, msg: TrainedReply) -> None:
        epoch = self.leader_ledger.data_epoch
        if msg.round <= self.leader_ledger.last_round:
            return
        for v in msg.vouched:
            key = (epoch, v.block_id)
            for site, rnd, spans in self.vouched.get(key, []):
                if (site, rnd) != (to, msg.round) and intersect(spans, v.spans) and key not in self.rebuilt:
                    self.violations.append(f"t={self.t:.1f}: block {v.block_id} samples {fmt(intersect(spans, v.spans))} "
                                           f"vouched to {site} (round {rnd}) and {to} (round {msg.round})")
            self.vouched.setdefault(key, []).append((to, msg.round, normalize(v.spans)))

    # --- faults ---

    def _schedule_faults(self, names: list[SiteId]) -> None:
        rng, span = self.rng, self.cfg.fault_span
        last = names[-1]
        self.at(rng.uniform(5, span), lambda: self._join(last))
        victim = names[rng.randrange(len(names) - 1)]
        t = rng.uniform(10, span)
        self.at(t, lambda: self._crash(victim))
        self.at(t + rng.uniform(3, 15), lambda: self._restart(victim))
        self.at(rng.uniform(10, span), lambda: self._pause(self._pick_alive(), self.cfg.lease.ttl * rng.uniform(1.5, 3)))
        block = rng.choice(sorted(self.universe))
        t = rng.uniform(span, 2 * span)
        self.at(t, lambda: self._owners_in_turn(block, 0))
        t = rng.uniform(2 * span, 3 * span)
        self.at(t, lambda: self._rolling(sorted(self.sites), 0))
        if self.cfg.sites >= 5:
            self.at(rng.uniform(3 * span, 4 * span), lambda: self._majority_loss(rng.choice(sorted(self.universe))))
        t = rng.uniform(4 * span, 5 * span)
        self.at(t, lambda: self._leave(self._pick_alive()))

    def _pick_alive(self) -> SiteId | None:
        """A live member, chosen when the fault fires (a site picked in advance may be down then)."""
        alive = sorted(n for n, s in self.sites.items() if s.alive)
        return self.rng.choice(alive) if alive else None

    def _members(self) -> set[SiteId]:
        return set(self.views[-1].members) if self.views else set()

    def _join(self, name: SiteId) -> None:
        if name in self.sites and self.sites[name].alive:
            return
        self.faults.append((self.t, f"join {name}"))
        self._spawn(name, amnesiac=True)
        self.at(self.t + 1.0, lambda: self._commit_view(self._members() | {name}))

    def _crash(self, name: SiteId) -> None:
        s = self.sites.get(name)
        if s is None or not s.alive:
            return
        s.alive = False
        self.faults.append((self.t, f"crash {name}"))
        self.at(self.t + 2.0, lambda: self._commit_view(self._members() - {name}))

    def _restart(self, name: SiteId) -> None:
        if not self.sites[name].alive:
            self._join(name)

    def _pause(self, name: SiteId | None, dt: float) -> None:
        s = self.sites.get(name) if name else None
        if s is not None and s.alive:
            self.faults.append((self.t, f"pause {name} for {dt:.1f}s"))
            s.paused_until = self.t + dt

    def _leave(self, name: SiteId | None) -> None:
        s = self.sites.get(name) if name else None
        if s is None or not s.alive or len(self._members()) <= 2:
            return
        self.faults.append((self.t, f"leave {name}"))
        self._effects(s, s.client.release_all(s.local(self.t)))
        s.alive = False
        self.at(self.t + 0.5, lambda: self._commit_view(self._members() - {name}))
        self.at(self.t + self.rng.uniform(10, 30), lambda: self._join(name))

    def _owners_in_turn(self, block: int, i: int) -> None:
        owners = self.views[-1].owners(block)
        if i >= len(owners) or len(self._members()) <= 2:
            return
        name = owners[i]
        self.faults.append((self.t, f"owner {i} of block {block}"))
        self._crash(name)
        self.at(self.t + 5.0, lambda: self._restart(name))
        self.at(self.t + 12.0, lambda: self._owners_in_turn(block, i + 1))

    def _majority_loss(self, block: int) -> None:
        owners = self.views[-1].owners(block)
        if len(self._members()) - len(owners) < 1 or len(owners) < 3:
            return
        self.faults.append((self.t, f"majority of owners of block {block}"))
        for name in owners[:2]:
            self._crash(name)
            self.at(self.t + 6.0, lambda name=name: self._restart(name))

    def _rolling(self, names: list[SiteId], i: int) -> None:
        if i >= len(names):
            return
        self.faults.append((self.t, f"rolling restart {i}"))
        self._crash(names[i])
        self.at(self.t + 4.0, lambda: self._restart(names[i]))
        self.at(self.t + 10.0, lambda: self._rolling(names, i + 1))


def write_data_dir(out: Path, universe: dict[int, int], log: list[tuple[int, list]],
                   events: list[LeaseEvent]) -> None:
    """Write a run's commit log (the real on-disk format, peer/logstore.py), the dataset's blocks and
    the lease ledger where a peer keeps them, so `ops audit --data-dir OUT` reads a simulated run."""
    entries = tuple(
        Entry(LogIndex(i), Epoch(1), RoundCommit(
            Round(rnd), tuple(Contributor(site, sum(r.end - r.start for r in rs), tuple(rs), b"")
                              for site, rs in sorted(contributors)), b""))
        for i, (rnd, contributors) in enumerate(log, start=1))
    FileStore(out / "consensus").write_log(1, entries)
    (out / "leases").mkdir(parents=True, exist_ok=True)
    (out / "leases" / "universe.json").write_text(universe_to_json(universe))
    (out / "leases" / "ledger.jsonl").write_text("".join(event_to_json(e) + "\n" for e in events))


def simulate(seed: int, cfg: SimConfig | None = None) -> Result:
    return Sim(seed, cfg or SimConfig()).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="leases_sim", description="Simulate data leases under faults.")
    p.add_argument("--seeds", default="0:10", help="seed range A:B (B exclusive) or one seed")
    p.add_argument("--sites", type=int, default=5, help="number of sites (the last one joins late)")
    p.add_argument("--no-faults", action="store_true", help="no crashes, pauses or joins")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write the first seed's log, blocks and lease ledger here (for `ops audit`)")
    args = p.parse_args(argv)
    a, _, b = args.seeds.partition(":")
    seeds = range(int(a), int(b)) if b else [int(a)]
    cfg = SimConfig(sites=args.sites, faults=not args.no_faults)
    bad = 0
    t0 = time.time()
    for seed in seeds:
        try:
            res = simulate(seed, cfg)
        except Exception as err:  # a core raising is a failure of this seed, not of the sweep
            bad += 1
            print(f"seed {seed}: crashed: {type(err).__name__}: {err}")
            continue
        if args.out is not None and seed == seeds[0]:
            write_data_dir(args.out, res.universe, res.log, res.events)
        if res.violations:
            bad += 1
            print(f"seed {seed}: {len(res.violations)} violations; first: {res.violations[0]}")
    print(f"{len(seeds)} seeds, {bad} with violations, {time.time() - t0:.1f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
