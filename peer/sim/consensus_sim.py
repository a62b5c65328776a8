"""Deterministic simulation of election + commit log under faults, with invariants after every event.

FoundationDB-style: one seed fixes everything (clocks, delays, faults, workload); a failure names
the command that replays it with a trace. `Cluster` (peer/sim/consensus_cluster.py) holds the cores,
their "disks" (`MemoryStore`) and the invariant checks; `Lockstep` (peer/sim/lockstep.py) runs it on
one clock with a fixed delay (unit tests, bench); `run_seed` here runs it on the generic simulator
(peer/sim/runner.py) under its seeded fault schedule
(peer/sim/faults.py: crash/restart, pause past the election timeout, partitions incl. bridge and
one-way, drop, duplicate, reorder, delay, clock skew and forward jumps) plus this scenario's own
`replay` (old messages re-delivered: stale epochs) and `churn` (a join, a graceful leave, crashed
voters declared dead), then heals and checks liveness within `liveness_bound`.

Invariants (architecture.md I1-I3, docs/consensus.md):
  I1 at most one leader per epoch; a message with a stale epoch never changes the receiver's state;
  I2 no two different entries committed for one round or one index, on any two peers;
  I3 a committed entry is never lost: every new leader's log holds all of them;
  apply exactly once and in order (checked through a hash chain every peer computes);
  lease: at most one leader with a valid lease at any real time (when no clock jumps).

    .venv/bin/python -m peer.sim.consensus_sim --seeds 0:1000 --voters 3 5
    .venv/bin/python -m peer.sim.consensus_sim --seeds 17:18 --voters 3 --trace   # replay one seed
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from peer.core.commitlog import Contributor, Round, RoundCommit, SampleRange
from peer.core.consensus import ConsensusCore
from peer.core.consensus_checks import Message
from peer.core.consensus_effects import Effect, Send
from peer.core.election import ElectionConfig, Role, SiteId
from peer.sim.faults import KINDS, FaultLimits, apply, clocks, parse_faults, plan
from peer.sim.network import SimNetwork
from peer.sim.runner import NodeState, RunResult, Simulation, derive_rng
from peer.sim.consensus_cluster import SIM_CONFIG, Cluster, Violation


def liveness_bound(config: ElectionConfig, max_delay_s: float) -> float:
    """Seconds from the end of the faults until a round proposed then is applied by every live peer.

    Restarted peers refuse votes for E_min; then one election timeout (< E_max), a pre-vote and a
    vote round trip (4 delays), the EpochStart commit (2), the proposal (one workload period of
    `PROPOSE_EVERY`), the round's commit (2) and the commit index reaching followers (1). Split votes
    retry after another E_max; the bound allows two retries. docs/consensus.md derives it."""
    e = config
    return (e.election_timeout_min_s + 3 * e.election_timeout_max_s + PROPOSE_EVERY
            + 2 * e.heartbeat_interval_s + 12 * max_delay_s)


PROPOSE_EVERY = 0.1
"""Seconds between two attempts of the rounds layer to decide a round (the workload)."""
LATENCY_S = (0.001, 0.01)
"""One-way delay of the simulated network (faults add jitter and reordering on top)."""
LEAVE_TIMEOUT_S = 2.0
"""How long a leaving peer waits to learn its removal before exiting anyway (`ops leave` timeout)."""
EXTRA_KINDS = ("replay", "churn")
"""Faults of this scenario beyond peer.sim.faults.KINDS: re-delivery of old messages (stale epochs),
and membership churn (a site joins, a voter leaves gracefully, crashed voters are declared dead)."""


def parse_kinds(spec: str) -> tuple[str, ...]:
    """`ops simulate --faults` words plus `replay` and `churn`; `all` includes them."""
    words = [w.strip() for w in spec.split(",") if w.strip()]
    extra = tuple(k for k in EXTRA_KINDS if k in words or "all" in words)
    return parse_faults(",".join(w for w in words if w not in EXTRA_KINDS) or "none") + extra


@dataclass(frozen=True)
class ConsensusScenario:
    """One seed: `voters` founders; a fault window; then healing and the liveness check."""

    voters: int = 3
    kinds: tuple[str, ...] = KINDS + EXTRA_KINDS
    warmup_s: float = 1.0
    fault_s: float = 6.0
    check_lease: bool = False
    """Check that leases never overlap; needs clocks without jumps (so `jump` faults are left out)."""
    config: ElectionConfig = SIM_CONFIG
    core: type[ConsensusCore] = ConsensusCore
    """The core under test (tests swap in broken subclasses to show the invariants catch them)."""

    def limits(self) -> FaultLimits:
        # Faults scaled to the election timing: pauses and crashes around E_max, so some outlive it.
        return FaultLimits(max_crashes=max(1, (self.voters - 1) // 2), permanent_crash_p=0.2,
                           crash_s=(0.1, 3.0), pause_s=(0.1, 2.0), max_pauses=3, cut_s=(0.3, 2.5),
                           reorder_window_s=0.05, max_extra_delay_s=0.05, max_drift=0.005, max_offset_s=100.0,
                           jump_s=(0.1, 2.0))


class SimPeer:
    """The node the generic runner drives: one core plus its disk and applied state (in `Cluster`).
    Violations raised by the cluster's checks are recorded for the checker and stop the run."""

    def __init__(self, cluster: Cluster, site: SiteId, violations: list[str], record: bool) -> None:
        self.cluster, self.site, self.violations, self.record = cluster, site, violations, record

    def _guard(self, fn: Callable[[], list[Send]]) -> list[Send]:
        try:
            return fn()
        except Violation as v:
            self.violations.append(str(v))
            return []

    def tick(self, now: float) -> list[Send]:
        return self._guard(lambda: self.cluster.tick(self.site, now))

    def receive(self, msg: Message, now: float) -> list[Send]:
        if self.record:
            self.cluster.history.append((self.site, msg))
        return self._guard(lambda: self.cluster.deliver(self.site, msg, now))

    def next_deadline(self) -> float:
        return self.cluster.core(self.site).next_deadline()

    def do(self, effects: list[Effect]) -> list[Send]:
        return self._guard(lambda: self.cluster.execute(self.site, effects))


class ConsensusChecker:
    """Per-event checks that need the runner (leases, process states) and the liveness check."""

    def __init__(self, scenario: ConsensusScenario, cluster: Cluster, violations: list[str], heal_at: float) -> None:
        self.scenario, self.cluster, self.violations, self.heal_at = scenario, cluster, violations, heal_at
        self.proposed_after_heal: list[int] = []
        self.committed_after_heal_s: float | None = None
        self.liveness_skipped = False

    def sync(self, sim: Simulation) -> None:
        for site, core in self.cluster.cores.items():
            if core is not None and sim.node(site) is None:
                self.cluster.crash(site)  # the runner crashed it: its core's memory is gone

    def after_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> list[str]:
        self.sync(sim)
        if self.scenario.check_lease and not self.violations:
            try:
                self.cluster.check_leases({s: sim.local_now(s) for s in self.cluster.live()})
            except Violation as v:
                self.violations.append(str(v))
        return list(self.violations)

    def progress(self, sim: Simulation) -> None:
        if self.committed_after_heal_s is not None or sim.now < self.heal_at:
            return
        live = [s for s in self.cluster.live() if sim.state(s) is NodeState.UP]
        if any(all(self.cluster.apps[s].index >= i for s in live) for i in self.proposed_after_heal):
            self.committed_after_heal_s = sim.now - self.heal_at

    def at_end(self, sim: Simulation) -> list[str]:
        if self.violations or self.committed_after_heal_s is not None:
            return list(self.violations)
        # Liveness is owed only while the live sites form a majority of the voter set in force in the
        # most up-to-date live log (Raft: the latest configuration, committed or not, decides; only
        # that log's holders can win an election). A minority crash is survived (architecture.md),
        # but two permanent crashes right after a leave was appended can legitimately strand it.
        live = set(self.cluster.live())
        newest = max((self.cluster.core(s) for s in live), key=lambda c: (c.log.last_epoch, c.log.last_index),
                     default=None)
        voters = {v for v, _ in newest.log.voters()} if newest else set()
        if not voters or len(voters & live) < len(voters) // 2 + 1:
            self.liveness_skipped = True
            return []
        bound = liveness_bound(self.scenario.config, LATENCY_S[1])
        return [f"liveness: no round proposed after healing at {self.heal_at:.2f}s was applied by every live "
                f"peer within {bound:.2f}s (live {sorted(live)}, voters {sorted(voters)})"]


def run_seed(seed: int, scenario: ConsensusScenario, trace: Callable[[str], None] | None = None) -> RunResult:
    """One seeded run on the generic simulator; RunResult.stats carries the consensus counters."""
    return _Run(seed, scenario, trace).run()


class _Run:
    def __init__(self, seed: int, scenario: ConsensusScenario, trace: Callable[[str], None] | None) -> None:
        self.seed, self.sc = seed, scenario
        self.rng = derive_rng(seed, "consensus")
        sites = [SiteId(f"s{i:02d}") for i in range(scenario.voters)]
        self.cluster = Cluster(scenario.config, seed, {s: f"{s}:7000" for s in sites}, boot=False,
                               core_type=scenario.core)
        self.violations: list[str] = []
        self.sim = Simulation(seed, SimNetwork(derive_rng(seed, "network"), LATENCY_S), trace)
        self.fault_start = scenario.warmup_s
        self.heal_at = scenario.warmup_s + scenario.fault_s
        self.checker = ConsensusChecker(scenario, self.cluster, self.violations, self.heal_at)
        self.leaving: dict[SiteId, float] = {}  # site -> when its leave started
        self.gone: set[SiteId] = set()
        limits = scenario.limits()
        kinds = [k for k in scenario.kinds if k in KINDS]
        node_clocks = clocks(derive_rng(seed, "clocks"), sites, limits, skew="skew" in kinds)
        for s in sites:
            self.sim.add_node(s, self._factory(s), at=0.0, clock=node_clocks[s])
        self.faults = plan(derive_rng(seed, "faults"), kinds, sites, self.fault_start, self.heal_at, limits)
        if scenario.check_lease:
            self.faults = [f for f in self.faults if f.kind != "jump"]  # jumps void leases by design
        for f in self.faults:
            apply(self.sim, f, limits)
        if "replay" in scenario.kinds:
            for _ in range(self.rng.randint(3, 10)):
                self.sim.schedule(self.rng.uniform(self.fault_start, self.heal_at), self._replay, "replay old messages")
        if "churn" in scenario.kinds:
            self._plan_churn(sites)
            self.sim.schedule(self.heal_at, self._converge, "membership converges")
        self.sim.schedule(0.05, self._workload, "rounds layer")

    def _factory(self, site: SiteId) -> Callable[[float], tuple[SimPeer, list[Any]]]:
        def start(now: float) -> tuple[SimPeer, list[Any]]:
            if "churn" in self.sc.kinds:
                self._tell_all(lambda c: c.member_alive(site, self.cluster.address(site)), but=site)
            self.cluster.start(site, now)  # after _tell_all: the runner registers the node only later
            if "churn" in self.sc.kinds:
                self._membership_view(self.cluster.core(site))
            return SimPeer(self.cluster, site, self.violations, record="replay" in self.sc.kinds), []
        return start

    def run(self) -> RunResult:
        end = self.heal_at + liveness_bound(self.sc.config, LATENCY_S[1])
        result = self.sim.run(end, self.checker)
        result.stats.update(committed_rounds=len(self.cluster.rounds), leaders=len(self.cluster.leaders),
                            liveness_skipped=int(self.checker.liveness_skipped),
                            commit_after_heal_ms=round(1000 * (self.checker.committed_after_heal_s or -0.001)))
        return result

    def _peer(self, site: SiteId) -> SimPeer | None:
        node = self.sim.node(site)
        return node if isinstance(node, SimPeer) and self.sim.state(site) is NodeState.UP else None

    def _tell_all(self, fn: Callable[[ConsensusCore], None], but: SiteId | None = None) -> None:
        """A membership verdict reaching every running peer (gossip is simulated elsewhere)."""
        self.checker.sync(self.sim)
        for s in self.cluster.live():
            if s != but:
                fn(self.cluster.core(s))

    def _workload(self) -> None:
        """The rounds layer of every peer: the leader decides the next round when it may."""
        self.sim.schedule(self.sim.now + PROPOSE_EVERY, self._workload, "rounds layer")
        self.checker.sync(self.sim)
        self._depart_leavers()
        try:
            self.cluster.compact_all(every=12)
        except Violation as v:
            self.violations.append(str(v))
        for site in self.cluster.live():
            peer, core = self._peer(site), self.cluster.core(site)
            if peer is None or core.role is not Role.LEADER:
                continue
            self.sim.act(site, lambda _n, now, s=site: self._propose(s, now))  # type: ignore[misc]
        self.checker.progress(self.sim)

    def _propose(self, site: SiteId, now: float) -> list[Send]:
        core = self.cluster.core(site)
        rnd = Round(core.log.last_round_entry()[0] + 1)
        contributors = tuple(
            Contributor(s, self.rng.randint(1, 10**6), (SampleRange(rnd, 0, self.rng.randint(1, 64)),),
                        hashlib.blake2b(f"{self.seed}/{rnd}/{s}".encode(), digest_size=8).digest())
            for s in self.cluster.live() if self.rng.random() < 0.7)
        weights = hashlib.blake2b(f"{self.seed}/{rnd}/{site}/{now}".encode(), digest_size=8).digest()
        d = core.propose_round(RoundCommit(rnd, contributors, weights), now)
        if d.accepted and d.index is not None and self.sim.now >= self.heal_at:
            self.checker.proposed_after_heal.append(d.index)
        peer = self._peer(site)
        return peer.do(d.effects) if peer else []

    def _replay(self) -> None:
        """Re-deliver a few messages seen earlier: stale epochs must change nothing."""
        history = self.cluster.history
        for _ in range(min(5, len(history))):
            to, msg = history[self.rng.randrange(len(history))]
            if self._peer(to) is not None:
                self.sim.act(to, lambda node, now, m=msg: node.receive(m, now))  # type: ignore[misc]

    def _plan_churn(self, sites: list[SiteId]) -> None:
        span = (self.fault_start, self.heal_at)
        joiner = SiteId(f"s{len(sites):02d}")
        self.sim.add_node(joiner, self._factory(joiner), at=self.rng.uniform(*span))
        busy = {t for f in self.faults for t in f.targets if f.kind in ("crash", "pause")}
        calm = [s for s in sites if s not in busy]
        if len(sites) >= 5 and calm:  # a leave plus the minority of crashes stays survivable
            leaver = self.rng.choice(calm)
            self.sim.schedule(self.rng.uniform(*span), lambda: self._leave(leaver), f"leave {leaver}")
        for f in self.faults:
            if f.kind == "crash" and (f.end is None or f.end - f.start > 2 * self.sc.config.election_timeout_max_s):
                (site,) = f.targets
                # Membership declares it dead some time after the crash.
                at = f.start + 1.5 * self.sc.config.election_timeout_max_s
                self.sim.schedule(at, lambda s=site: self._tell_all(lambda c: c.member_dead(s)),  # type: ignore[misc]
                                  f"dead {site}")

    def _membership_view(self, core: ConsensusCore) -> None:
        """What membership tells a peer about the others: those running are alive, leavers left."""
        for other in self.cluster.live():
            if other in self.leaving or other in self.gone:
                core.member_left(other)
            elif other != core.site:
                core.member_alive(other, self.cluster.address(other))

    def _converge(self) -> None:
        """Once faults stop, gossip converges: every running peer holds the same view."""
        self.checker.sync(self.sim)
        for site in self.cluster.live():
            self._membership_view(self.cluster.core(site))

    def _leave(self, site: SiteId) -> None:
        if self._peer(site) is None:
            return
        self.leaving[site] = self.sim.now
        self.sim.act(site, lambda node, now: node.do(self.cluster.core(site).leave(now).effects))
        self._tell_all(lambda c: c.member_left(site), but=site)

    def _depart_leavers(self) -> None:
        """A leaving peer exits once its own log shows its removal committed (I8), as `ops leave`
        waits for it; like `ops leave`, it gives up waiting after a while if the removal committed
        elsewhere but the news did not reach it."""
        live = [self.cluster.core(s) for s in self.cluster.live()]
        if not live or not self.leaving:
            return
        ahead = max(live, key=lambda c: c.commit_index)
        committed_voters = dict(ahead.log.voters_at(ahead.commit_index))
        for site, since in sorted(self.leaving.items()):
            me = self.cluster.cores.get(site)
            if me is None:
                continue
            learnt = site not in dict(me.log.voters_at(me.commit_index))
            if learnt or (site not in committed_voters and self.sim.now - since > LEAVE_TIMEOUT_S):
                self.sim.crash(site)
                self.cluster.crash(site)
                del self.leaving[site]
                self.gone.add(site)


def run_consensus_sweep(seeds: Iterable[int], voters: Iterable[int],
                        kinds: Iterable[str] = KINDS + EXTRA_KINDS, fault_s: float = 6.0) -> dict[str, object]:
    """Every (seed, voters) pair, each twice: with all `kinds` (clock jumps included), and with
    clock jumps left out and the lease invariant checked. Returns totals and the failing runs."""
    kinds = tuple(kinds)
    runs: list[tuple[int, int, bool, RunResult]] = []
    for n in voters:
        for seed in seeds:
            for lease in (False, True):
                sc = ConsensusScenario(voters=n, kinds=kinds, fault_s=fault_s, check_lease=lease)
                runs.append((seed, n, lease, run_seed(seed, sc)))
    failures = [(s, n, lease, r) for s, n, lease, r in runs if r.violations]
    heal = [r.stats["commit_after_heal_ms"] for *_, r in runs if r.stats["commit_after_heal_ms"] >= 0]
    return {
        "runs": len(runs),
        "violations": sum(len(r.violations) for *_, r in runs),
        "failures": [{"seed": s, "voters": n, "lease_checked": lease, "violation": r.violations[0],
                      "replay": f"python -m peer.sim.consensus_sim --seeds {s}:{s + 1} --voters {n} --trace"
                                + (" --check-lease" if lease else "")}
                     for s, n, lease, r in failures[:20]],
        "events": sum(r.events for *_, r in runs),
        "committed_rounds": sum(r.stats["committed_rounds"] for *_, r in runs),
        "liveness_checked": sum(1 for *_, r in runs if not r.stats["liveness_skipped"]),
        "max_commit_after_heal_ms": max(heal, default=None),
        "liveness_bound_ms": round(1000 * liveness_bound(SIM_CONFIG, LATENCY_S[1])),
        "kinds": list(kinds),
    }


# --- `ops simulate --protocol consensus` (registered by ops/simulate.py's PROTOCOLS) ---


def ops_run_seed(args: argparse.Namespace, seed: int, trace: Callable[[str], None] | None) -> RunResult:
    sc = ConsensusScenario(voters=args.members, kinds=parse_kinds(args.faults),
                           check_lease=bool(getattr(args, "check_lease", False)))
    return run_seed(seed, sc, trace)


def ops_replay_flags(args: argparse.Namespace) -> list[str]:
    return ["--members", str(args.members), "--faults", args.faults]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Simulate election + commit log under faults.")
    p.add_argument("--seeds", default="0:100", help="seed range FIRST:END, end exclusive (default 0:100)")
    p.add_argument("--voters", type=int, nargs="+", default=[3, 5], help="voter counts to simulate (default 3 5)")
    p.add_argument("--faults", default="all", help="fault kinds or sets, comma-separated, plus replay, churn")
    p.add_argument("--fault-s", type=float, default=6.0, help="seconds of faults before healing (default 6)")
    p.add_argument("--trace", action="store_true", help="print every event of a single run")
    p.add_argument("--check-lease", action="store_true", help="with --trace: the lease-checked variant")
    args = p.parse_args(argv)
    lo, hi = (int(x) for x in args.seeds.split(":"))
    kinds = parse_kinds(args.faults)
    if args.trace:
        sc = ConsensusScenario(voters=args.voters[0], kinds=kinds, fault_s=args.fault_s, check_lease=args.check_lease)
        r = run_seed(lo, sc, print)
        print(json.dumps({"violations": r.violations, "events": r.events, **r.stats}))
        return 1 if r.violations else 0
    summary = run_consensus_sweep(range(lo, hi), args.voters, kinds, args.fault_s)
    print(json.dumps(summary, indent=2))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
