"""Membership scenario for the simulator: N members join, faults hit, then views must converge.

Timeline of one seed (times scale with the preset's probe interval): members start within the
first 2 periods and join through whichever of the others (all are seeds, as in the run file)
answers first; after a warm-up, the fault window
applies a seeded schedule (`peer.sim.faults`) and up to two graceful leaves (a departed site may come
back later as a new process); at the end of the window every fault is over, crashed members marked
permanent stay down, and the run continues until views have converged.

Invariants (`MembershipChecker`), checked after every event:

- **detection**: a crashed member is DEAD (or unknown) in every live member's view within
  `MembershipConfig.detection_bound_s(n, h)` of the crash (or of the observer's (re)start/resume,
  or of it learning a newer incarnation of the crashed member), h = the observer's worst local
  health multiplier in that window, stretched by the clock drift bound;
- **no false death**: in a seed without lossy faults (no drop, partition, pause or crash; every
  `benign_every`-th seed) nobody is ever declared DEAD;
- **left is never dead**: nobody declares DEAD a member at or above the incarnation it left at;
- **incarnations are minted only by their owner**: no view holds an incarnation of X above the
  highest X itself ever had;
- **honest messages are believed**: no core refuses a rumour as malformed, over the incarnation
  limit or a jump (peer/core/membership_guard.py); only a full table may refuse;
- **convergence** (covers "a paused member refutes" and "a healed partition revives everyone"): from
  the end of the fault window, within `convergence_bound_s(n, h)`, every live member sees every
  live member ALIVE, every permanently crashed one DEAD or unknown and every departed one LEFT or
  unknown, and keeps doing so until the end of the run. (A departed member whose LEFT never reached
  a process that is still running may also be DEAD: every copy of its goodbye was lost, which is
  indistinguishable from a crash.)

    ops simulate --members 20 --seeds 0:500 --faults all
    ops simulate --members 20 --seed 137 --faults all --trace
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from peer.core.membership import (
    MemberMeta,
    Membership,
    MembershipConfig,
    MemberState,
    MemberUpdate,
    MemberView,
    RefusalKind,
    Rejected,
    StateChanged,
)
from peer.sim.faults import KINDS, LOSSY, FaultLimits, apply, clocks, plan
from peer.sim.network import SimNetwork
from peer.sim.runner import NodeState, RunResult, Simulation, derive_rng

PRESETS: dict[str, Callable[[], MembershipConfig]] = {
    "lan": MembershipConfig.lan,
    "wan": MembershipConfig.wan,
    "local_test": MembershipConfig.local_test,
}
# One-way latency per preset: LAN sub-millisecond, WAN cross-continent (RTT 100-150 ms), loopback.
LATENCY_S: dict[str, tuple[float, float]] = {
    "lan": (0.0002, 0.001),
    "wan": (0.05, 0.075),
    "local_test": (0.00005, 0.0005),
}
DEAD, ALIVE, LEFT = MemberState.DEAD, MemberState.ALIVE, MemberState.LEFT


@dataclass(frozen=True)
class MembershipScenario:
    """Parameters of the membership scenario (one `run_seed` call per seed)."""

    members: int = 20
    preset: str = "lan"
    faults: tuple[str, ...] = KINDS
    warmup_periods: float = 10.0
    """Periods before the fault window: everyone joined and agreed."""
    fault_periods: float = 60.0
    """Length of the fault window in probe periods."""
    max_leaves: int = 2
    settle_periods: float = 20.0
    """After all views agree, keep running this long (stale rumours must not undo the agreement)."""
    benign_every: int = 5
    """Every benign_every-th seed keeps only the non-lossy faults and asserts no false death."""
    core: type[Membership] = Membership
    """The core under test (tests swap in deliberately broken subclasses to show the invariants
    catch them)."""

    def __post_init__(self) -> None:
        if self.members < 3:
            raise ValueError("the membership scenario needs at least 3 members")
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose from {', '.join(PRESETS)}")

    def config(self) -> MembershipConfig:
        return PRESETS[self.preset]()

    def kinds_for(self, seed: int) -> tuple[str, ...]:
        if self.benign_every and seed % self.benign_every == 0:
            return tuple(k for k in self.faults if k not in LOSSY)
        return self.faults


def _limits(cfg: MembershipConfig, n: int) -> FaultLimits:
    """Fault intensities in units of the preset's period, so LAN and WAN runs are comparable.
    Pauses reach past the longest suspicion timeout, so some paused members get declared dead and
    must rejoin; the extra delay stays under a quarter of the probe timeout (a benign fault)."""
    p = cfg.probe_interval_s
    return FaultLimits(
        crash_s=(1 * p, 40 * p),
        pause_s=(0.2 * p, 1.3 * cfg.suspicion_max_s(n)),
        cut_s=(2 * p, 30 * p),
        max_extra_delay_s=cfg.probe_timeout_s / 4,
        reorder_window_s=cfg.probe_timeout_s / 10,
        jump_s=(0.1 * p, 5 * p),
    )


@dataclass
class _Watch:
    """A timed detection check: `observer` must see `subject` dead by start + bound(h)."""

    observer: str
    subject: str
    start: float
    health: int = 1  # worst local health multiplier of the observer since `start`
    last_inc: int = -1  # newest incarnation of subject the observer accepted alive/suspect


@dataclass
class MembershipChecker:
    """The membership invariants (see the module docstring); addresses are sites' addresses."""

    cfg: MembershipConfig
    sites: dict[str, str]  # address -> site
    benign: bool
    drift: float
    quiesce_at: float
    slack_s: float
    settle_s: float
    _agreed_at: float | None = None
    _addr: dict[str, str] = field(default_factory=dict)  # site -> address
    _states: dict[str, NodeState] = field(default_factory=dict)
    _nodes: dict[str, Any] = field(default_factory=dict)
    _max_inc: dict[str, int] = field(default_factory=dict)  # site -> highest incarnation it held
    _left_inc: dict[str, int] = field(default_factory=dict)  # site -> incarnation it left at
    _departed: set[str] = field(default_factory=set)  # sites that left and are down
    # departed site -> (address, process) that received its LEFT rumour
    _goodbye_heard: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    _watches: dict[tuple[str, str], _Watch] = field(default_factory=dict)
    _conv_health: dict[str, int] = field(default_factory=dict)
    _converged: set[str] = field(default_factory=set)  # observers past their convergence deadline
    _pending: list[str] = field(default_factory=list)
    _n: int = 0

    def __post_init__(self) -> None:
        self._addr = {s: a for a, s in self.sites.items()}
        self._n = len(self.sites)

    # -- scenario hooks ----------------------------------------------------------------------------

    def leave(self, sim: Simulation, address: str) -> None:
        node = sim.node(address)
        if isinstance(node, Membership) and sim.state(address) is NodeState.UP and not node.left:
            sim.act(address, lambda m, now: m.leave(now))
            self._left_inc[self.sites[address]] = node.incarnation
            self._max_inc[self.sites[address]] = node.incarnation
            self._departed.add(self.sites[address])

    # -- Checker protocol --------------------------------------------------------------------------

    def after_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> list[str]:
        if not address:
            self._diff_processes(sim)
        else:
            self._after_node_event(sim, address, effects)
        out, self._pending = self._pending, []
        return out

    def at_end(self, sim: Simulation) -> list[str]:
        if self._watches:
            w = next(iter(self._watches.values()))
            return [f"run ended with a detection check open: {w.observer} on {w.subject}"]
        if self._agreed_at is None:
            return ["run ended before the views converged"]
        return [v for s in sorted(self._converged) for v in self._view_errors(sim, s)]

    # -- per-event work ----------------------------------------------------------------------------

    def _after_node_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> None:
        observer = self.sites[address]
        node = sim.node(address)
        assert isinstance(node, Membership)
        if self._departed and sim.delivering is not None:
            self._note_goodbye(sim, address, node)
        site_max = max(self._max_inc.get(observer, 0), node.incarnation)
        self._max_inc[observer] = site_max
        h = node.health_multiplier
        if observer in self._conv_health:
            self._conv_health[observer] = max(self._conv_health[observer], h)
        for key in [k for k in self._watches if k[0] == observer]:
            self._watches[key].health = max(self._watches[key].health, h)
        for e in effects:
            if isinstance(e, StateChanged):
                self._on_change(sim, observer, e)
            elif isinstance(e, Rejected) and e.kind is not RefusalKind.FULL:
                self._pending.append(f"t={sim.now:.3f} {observer} refused {e.what} from {e.from_site} "
                                     f"({e.kind.value}): {e.reason}")

    def _on_change(self, sim: Simulation, observer: str, e: StateChanged) -> None:
        t = f"t={sim.now:.3f}"
        if e.incarnation > self._max_inc.get(e.site, 0) and e.site != observer:
            self._pending.append(f"{t} {observer} holds {e.site}@{e.incarnation}, an incarnation "
                                 f"{e.site} never had (max {self._max_inc.get(e.site, 0)})")
        if e.new is DEAD:
            if self.benign:
                self._pending.append(f"{t} {observer} declared {e.site} dead with no loss and no "
                                     f"pauses ({e.reason})")
            left = self._left_inc.get(e.site)
            if left is not None and e.incarnation >= left:
                self._pending.append(f"{t} {observer} declared {e.site} dead at incarnation "
                                     f"{e.incarnation} although it left at {left}")
        watch = self._watches.get((observer, e.site))
        if watch is not None and e.new in (DEAD, LEFT) and e.incarnation >= self._max_inc.get(e.site, 0):
            # Dead at the subject's last incarnation: only the subject could mint a newer one, and
            # it is down, so the verdict is final: the check passed.
            del self._watches[(observer, e.site)]
        elif watch is not None and e.new in (ALIVE, MemberState.SUSPECT) and e.incarnation > watch.last_inc:
            # It learned of a newer life of the subject (the subject's own last refutation): the
            # observer's failure detector starts over from here. Bounded by the subject's real
            # incarnations, so this cannot re-arm forever.
            watch.last_inc = e.incarnation
            watch.start = sim.now
            watch.health = 1
        if sim.now >= self.quiesce_at:
            errors = self._view_errors(sim, observer, only=e.site)
            if errors:
                self._agreed_at = None
                if observer in self._converged:
                    self._pending += errors

    def _diff_processes(self, sim: Simulation) -> None:
        for address, site in self.sites.items():
            new, old = sim.state(address), self._states.get(site, NodeState.DOWN)
            node = sim.node(address)
            if new is old and (new is NodeState.DOWN or node is self._nodes.get(site)):
                continue
            self._states[site] = new
            self._nodes[site] = node
            if new is NodeState.DOWN:
                self._on_down(sim, site)
            elif old is NodeState.DOWN or node is not self._nodes.get(site):
                self._on_start(sim, site)
            elif new is NodeState.UP:  # resumed: its detector was frozen, give it a fresh window
                for w in self._watches.values():
                    if w.observer == site:
                        w.start, w.health = sim.now, 1
                        self._schedule(sim, w)

    def _on_down(self, sim: Simulation, site: str) -> None:
        for key in [k for k in self._watches if site in k]:
            del self._watches[key]
        self._converged.discard(site)
        self._conv_health.pop(site, None)
        if site in self._departed:
            return
        for observer in self._live(sim):
            if observer != site:
                self._watch(sim, observer, site)

    def _on_start(self, sim: Simulation, site: str) -> None:
        self._departed.discard(site)
        self._goodbye_heard.pop(site, None)
        self._left_inc.pop(site, None)
        for key in [k for k in self._watches if k[1] == site]:
            del self._watches[key]
        for other, state in self._states.items():
            if state is NodeState.DOWN and other not in self._departed and other != site:
                self._watch(sim, site, other)
        if sim.now >= self.quiesce_at:
            self._start_convergence(sim, site)

    def _watch(self, sim: Simulation, observer: str, subject: str) -> None:
        view = self._view_row(sim, observer, subject)
        if (view is not None and view.state in (DEAD, LEFT)
                and view.incarnation >= self._max_inc.get(subject, 0)):
            return  # already final (see _on_change)
        w = _Watch(observer, subject, sim.now, last_inc=-1 if view is None else view.incarnation)
        self._watches[(observer, subject)] = w
        self._schedule(sim, w)

    def _deadline(self, w: _Watch) -> float:
        bound = self.cfg.detection_bound_s(self._n, w.health) / (1 - self.drift)
        return w.start + bound + self.slack_s

    def _schedule(self, sim: Simulation, w: _Watch) -> None:
        key = (w.observer, w.subject)
        sim.schedule(self._deadline(w), lambda: self._check_watch(sim, key), "check detection")

    def _check_watch(self, sim: Simulation, key: tuple[str, str]) -> None:
        w = self._watches.get(key)
        if w is None:
            return
        if sim.now < self._deadline(w) or self._states.get(w.observer) is NodeState.PAUSED:
            if self._states.get(w.observer) is not NodeState.PAUSED:
                self._schedule(sim, w)  # the window moved (health worsened, newer incarnation)
            return
        del self._watches[key]
        view = self._view(sim, w.observer, w.subject)
        if view is not None and view not in (DEAD, LEFT):
            self._pending.append(
                f"t={sim.now:.3f} {w.observer} still sees crashed {w.subject} {view.name} "
                f"{sim.now - w.start:.1f}s after the window opened (bound "
                f"{self._deadline(w) - w.start:.1f}s, health x{w.health})")

    # -- convergence -------------------------------------------------------------------------------

    def quiesce(self, sim: Simulation) -> None:
        """The fault window is over: every live member must converge within the bound."""
        for site in self._live(sim):
            self._start_convergence(sim, site)
        self._poll_agreement(sim)

    def _start_convergence(self, sim: Simulation, site: str) -> None:
        self._conv_health[site] = 1
        self._schedule_convergence(sim, site, sim.now)

    def _conv_deadline(self, site: str, start: float) -> float:
        bound = self.cfg.convergence_bound_s(self._n, self._conv_health.get(site, 1))
        return start + bound / (1 - self.drift) + self.slack_s + self.cfg.join_retry_interval_s

    def _schedule_convergence(self, sim: Simulation, site: str, start: float) -> None:
        node = sim.node(self._addr[site])

        def check() -> None:
            if sim.node(self._addr[site]) is not node or site in self._converged:
                return  # restarted or crashed since (a new check runs), or already agreed
            if sim.now < self._conv_deadline(site, start):
                self._schedule_convergence(sim, site, start)  # its health worsened: later
                return
            self._converged.add(site)
            self._pending += self._view_errors(sim, site)

        sim.schedule(self._conv_deadline(site, start), check, f"check convergence of {site}")

    def _poll_agreement(self, sim: Simulation) -> None:
        """Once per period after the faults: track since when every live view has been right.
        After `settle_s` of uninterrupted agreement, with every detection check closed, the run
        has shown what it can and stops (a wrong view before an observer's own deadline just
        restarts the agreement clock; after it, it is a violation)."""
        if self._agreed_at is None and not any(self._view_errors(sim, s) for s in self._live(sim)):
            self._agreed_at = sim.now
        if (self._agreed_at is not None and sim.now >= self._agreed_at + self.settle_s
                and not self._watches):
            sim.stop()
            return
        sim.schedule(sim.now + self.cfg.probe_interval_s, lambda: self._poll_agreement(sim),
                     "poll agreement")

    def _view_errors(self, sim: Simulation, observer: str, only: str | None = None) -> list[str]:
        node = sim.node(self._addr[observer])
        if not isinstance(node, Membership):
            return []
        views = {v.site: v for v in node.members()}
        errors = []
        for site in [only] if only else self._addr:
            if site == observer:
                continue
            v = views.get(site)
            state = self._states.get(site, NodeState.DOWN)
            if state is not NodeState.DOWN:
                ok, want = v is not None and v.state is ALIVE, "ALIVE"
            elif site in self._departed and self._left_known(sim, site):
                ok, want = v is None or v.state is LEFT, "LEFT or unknown"
            elif site in self._departed:
                # Its goodbye never got out (every copy lost before the process exited): to the
                # others that is a crash, and DEAD is all they can know.
                ok, want = v is None or v.state in (LEFT, DEAD), "LEFT, DEAD or unknown"
            else:
                ok, want = v is None or v.state is DEAD, "DEAD or unknown"
            if not ok:
                seen = "unknown" if v is None else f"{v.state.name}@{v.incarnation}"
                errors.append(f"t={sim.now:.3f} after convergence {observer} sees {site} {seen}, "
                              f"expected {want}")
        return errors

    # -- helpers -----------------------------------------------------------------------------------

    def _left_known(self, sim: Simulation, site: str) -> bool:
        """Whether `site`'s LEFT reached a process that is still running (then everyone must
        learn it from there)."""
        return any(sim.node(address) is node for address, node in self._goodbye_heard.get(site, ()))

    def _note_goodbye(self, sim: Simulation, address: str, node: Membership) -> None:
        msg = sim.delivering
        rows: tuple[MemberUpdate, ...] = getattr(msg, "updates", None) or getattr(msg, "members", None) or ()
        for u in rows:
            if u.state is LEFT and u.site in self._departed and u.site != self.sites[address]:
                self._goodbye_heard.setdefault(u.site, []).append((address, node))

    def _live(self, sim: Simulation) -> list[str]:
        return [s for s, st in self._states.items() if st is not NodeState.DOWN]

    def _view(self, sim: Simulation, observer: str, subject: str) -> MemberState | None:
        row = self._view_row(sim, observer, subject)
        return None if row is None else row.state

    def _view_row(self, sim: Simulation, observer: str, subject: str) -> MemberView | None:
        node = sim.node(self._addr[observer])
        assert isinstance(node, Membership)
        return node.member(subject)


def run_seed(seed: int, scenario: MembershipScenario,
             trace: Callable[[str], None] | None = None) -> RunResult:
    """Run one seed of the membership scenario and return its events and violations."""
    cfg = scenario.config()
    n = scenario.members
    period = cfg.probe_interval_s
    kinds = scenario.kinds_for(seed)
    limits = _limits(cfg, n)
    rng = derive_rng(seed, "scenario")
    sites = [f"s{i:03d}" for i in range(n)]
    addresses = {f"{s}:7946": s for s in sites}
    addr_list = list(addresses)
    net = SimNetwork(derive_rng(seed, "network"), LATENCY_S[scenario.preset])
    sim = Simulation(seed, net, trace)
    fault_start = scenario.warmup_periods * period
    fault_end = fault_start + scenario.fault_periods * period
    checker = MembershipChecker(cfg, addresses, benign=not (set(kinds) & LOSSY),
                                drift=limits.max_drift if "skew" in kinds else 0.0,
                                quiesce_at=fault_end, slack_s=period + 4 * LATENCY_S[scenario.preset][1],
                                settle_s=scenario.settle_periods * period)
    node_clocks = clocks(rng, addr_list, limits, skew="skew" in kinds)
    for address, site in addresses.items():
        # Like the run file, every member lists every other as a seed (in its own order).
        seeds = rng.sample([a for a in addr_list if a != address], n - 1)
        sim.add_node(address, _factory(scenario.core, seed, site, address, cfg, seeds),
                     at=rng.uniform(0, 2 * period), clock=node_clocks[address])
    faults = plan(derive_rng(seed, "faults"), kinds, addr_list, fault_start, fault_end, limits)
    for f in faults:
        apply(sim, f, limits)
    _plan_leaves(sim, rng, checker, scenario, faults, fault_start, fault_end)
    sim.schedule(fault_end + 1e-6, lambda: checker.quiesce(sim), "quiesce")
    hard_stop = fault_end + 2 * cfg.convergence_bound_s(n, cfg.awareness_max_multiplier)
    return sim.run(hard_stop, checker)


def _factory(core: type[Membership], seed: int, site: str, address: str, cfg: MembershipConfig,
             seeds: Sequence[str]) -> Callable[[float], tuple[Membership, list[Any]]]:
    lives = [0]

    def start(now: float) -> tuple[Membership, list[Any]]:
        # A restarted process remembers nothing: incarnation 0, fresh randomness.
        lives[0] += 1
        m = core(MemberMeta(site, address, accelerator="sim"), cfg,
                       derive_rng(seed, f"node:{site}:{lives[0]}"), now)
        return m, m.join(seeds, now)

    return start


def _plan_leaves(sim: Simulation, rng: random.Random, checker: MembershipChecker,
                 scenario: MembershipScenario, faults: Sequence[Any], start: float, end: float) -> None:
    """Graceful departures of members no process fault touches; some come back later."""
    touched = {t for f in faults for t in f.targets}
    candidates = [a for a in checker.sites if a not in touched]
    period = scenario.config().probe_interval_s
    for address in rng.sample(candidates, min(len(candidates), rng.randint(0, scenario.max_leaves))):
        at = rng.uniform(start, end - 3 * period)
        sim.schedule(at, partial(checker.leave, sim, address), f"leave {address}")
        # Linger one period so the LEFT rumour goes out, then the process exits.
        sim.schedule(at + period, partial(sim.crash, address), f"exit {address}")
        if rng.random() < 0.4:
            back = rng.uniform(at + 2 * period, end)
            sim.schedule(back, partial(sim.restart, address), f"rejoin {address}")
