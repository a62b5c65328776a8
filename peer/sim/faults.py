"""Seeded fault schedules: which faults hit which nodes when, reproducible from the seed.

Kinds (`KINDS`): crash (with or without restart), pause (SIGSTOP-like: state kept, messages wait),
partition (symmetric), one_way, bridge (two sides that only reach each other through bridge nodes),
drop, duplicate, reorder, delay (extra jitter), skew (per-node clock offset and drift, plus forward
clock jumps). Named sets (`FAULT_SETS`) group them for the command line: `--faults all`,
`--faults network,pause`. `LOSSY` are the kinds under which a failure detector may legitimately
suspect a healthy node; the others must never cause a false verdict.

A schedule is a list of `Fault`s planned inside one window [start, end): faults that share a knob
(the network's cut set, the drop rate, one node's process) never overlap, and every fault that is
undone is undone before `end`, so a scenario can check convergence after `end`.

    python -c "import random; from peer.sim.faults import plan, FaultLimits; \
[print(f.describe()) for f in plan(random.Random(7), ('crash', 'partition'), ['a', 'b', 'c', 'd'], \
10, 60, FaultLimits())]"
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from peer.sim.clock import NodeClock
from peer.sim.runner import Simulation

KINDS: tuple[str, ...] = ("crash", "pause", "partition", "one_way", "bridge", "drop", "duplicate",
                          "reorder", "delay", "skew")
LOSSY: frozenset[str] = frozenset({"crash", "pause", "partition", "one_way", "bridge", "drop"})
FAULT_SETS: dict[str, tuple[str, ...]] = {
    "none": (),
    "benign": ("duplicate", "reorder", "delay", "skew"),
    "network": ("drop", "duplicate", "reorder", "delay"),
    "partitions": ("partition", "one_way", "bridge"),
    "process": ("crash", "pause"),
    "clock": ("skew",),
    "all": KINDS,
}


def parse_faults(spec: str) -> tuple[str, ...]:
    """'all', 'network,pause', 'none' ... -> the fault kinds, in KINDS order."""
    chosen: set[str] = set()
    for word in filter(None, (w.strip() for w in spec.split(","))):
        if word in FAULT_SETS:
            chosen.update(FAULT_SETS[word])
        elif word in KINDS:
            chosen.add(word)
        else:
            raise ValueError(f"unknown fault {word!r}; kinds: {', '.join(KINDS)}; "
                             f"sets: {', '.join(FAULT_SETS)}")
    return tuple(k for k in KINDS if k in chosen)


@dataclass(frozen=True)
class FaultLimits:
    """How hard the faults hit. Defaults suit a LAN-timed protocol; scenarios scale them."""

    max_crashes: int = 3
    """Crash faults per schedule (each on a distinct node)."""
    permanent_crash_p: float = 0.3
    """Chance that a crashed node stays down until the end of the run."""
    crash_s: tuple[float, float] = (1.0, 40.0)
    pause_s: tuple[float, float] = (0.2, 40.0)
    max_pauses: int = 4
    cut_s: tuple[float, float] = (2.0, 30.0)
    """Duration of a partition / one-way cut / bridge."""
    drop_rate: tuple[float, float] = (0.02, 0.3)
    duplicate_rate: tuple[float, float] = (0.01, 0.2)
    reorder_rate: tuple[float, float] = (0.05, 0.5)
    reorder_window_s: float = 0.05
    max_extra_delay_s: float = 0.1
    """Extra jitter of `delay`; keep it under what the protocol treats as a lost message."""
    max_drift: float = 0.001
    """Clock rate error of `skew` (0.001 = 1000 ppm, far worse than real oscillators)."""
    max_offset_s: float = 1000.0
    jump_s: tuple[float, float] = (0.1, 5.0)


@dataclass(frozen=True)
class Fault:
    """One fault: `kind` from `start` until `end` (None: never undone)."""

    kind: str
    start: float
    end: float | None
    targets: tuple[str, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()
    value: float = 0.0

    def describe(self) -> str:
        until = "end" if self.end is None else f"{self.end:.2f}"
        what = " | ".join(",".join(g) for g in self.groups) if self.groups else ",".join(self.targets)
        return f"{self.kind} [{self.start:.2f}, {until}) {what} {self.value:g}".rstrip()


def _slots(rng: random.Random, n: int, start: float, end: float, dur: tuple[float, float]
           ) -> list[tuple[float, float]]:
    """n non-overlapping intervals in [start, end), one per equal slot, each within `dur`."""
    width = (end - start) / max(1, n)
    out = []
    for i in range(n):
        lo = start + i * width
        length = min(rng.uniform(*dur), width * 0.9)
        begin = rng.uniform(lo, lo + width - length)
        out.append((begin, begin + length))
    return out


def _split(rng: random.Random, addresses: Sequence[str], parts: int) -> list[tuple[str, ...]]:
    """Random non-empty groups covering `addresses` (needs len(addresses) >= parts)."""
    shuffled = list(addresses)
    rng.shuffle(shuffled)
    cuts = sorted(rng.sample(range(1, len(shuffled)), parts - 1))
    bounds = [0, *cuts, len(shuffled)]
    return [tuple(sorted(shuffled[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)]


def plan(rng: random.Random, kinds: Sequence[str], addresses: Sequence[str], start: float,
         end: float, limits: FaultLimits) -> list[Fault]:
    """A schedule of the given fault kinds over [start, end), seeded by `rng`."""
    faults: list[Fault] = []
    busy: dict[str, list[tuple[float, float]]] = {a: [] for a in addresses}  # process faults

    def free(address: str, a: float, b: float) -> bool:
        return all(b <= s or a >= e for s, e in busy[address])

    if "crash" in kinds and len(addresses) > 2:
        for target in rng.sample(list(addresses), min(limits.max_crashes, len(addresses) - 2)):
            a = rng.uniform(start, end - limits.crash_s[0])
            permanent = rng.random() < limits.permanent_crash_p
            b = end if permanent else min(end, a + rng.uniform(*limits.crash_s))
            busy[target].append((a, b))
            faults.append(Fault("crash", a, None if permanent else b, (target,)))
    if "pause" in kinds:
        for _ in range(rng.randint(1, limits.max_pauses)):
            target = rng.choice(list(addresses))
            a = rng.uniform(start, end - limits.pause_s[0])
            b = min(end, a + rng.uniform(*limits.pause_s))
            if free(target, a, b):
                busy[target].append((a, b))
                faults.append(Fault("pause", a, b, (target,)))
    cuts = [k for k in ("partition", "one_way", "bridge") if k in kinds]
    if cuts and len(addresses) >= 3:
        rng.shuffle(cuts)
        for kind, (a, b) in zip(cuts, _slots(rng, len(cuts), start, end, limits.cut_s), strict=True):
            groups = _split(rng, addresses, 3 if kind == "bridge" else 2)
            if kind == "bridge":  # the smallest group bridges the other two
                groups.sort(key=len)
                groups = [groups[1], groups[2], groups[0]]
            faults.append(Fault(kind, a, b, groups=tuple(groups)))
    knobs = {"drop": limits.drop_rate, "duplicate": limits.duplicate_rate,
             "reorder": limits.reorder_rate, "delay": (0.0, limits.max_extra_delay_s)}
    for kind, (lo, hi) in knobs.items():
        if kind in kinds:
            windows = _slots(rng, rng.randint(1, 2), start, end, (1.0, end - start))
            faults += [Fault(kind, a, b, value=rng.uniform(lo, hi)) for a, b in windows]
    if "skew" in kinds:
        for _ in range(rng.randint(1, 3)):
            faults.append(Fault("jump", rng.uniform(start, end), None, (rng.choice(list(addresses)),),
                                value=rng.uniform(*limits.jump_s)))
    return sorted(faults, key=lambda f: (f.start, f.kind))


def clocks(rng: random.Random, addresses: Sequence[str], limits: FaultLimits,
           skew: bool) -> dict[str, NodeClock]:
    """A clock per node: skewed (random offset and drift) when `skew`, else true time."""
    if not skew:
        return {a: NodeClock() for a in addresses}
    return {a: NodeClock(rng.uniform(0, limits.max_offset_s),
                         1.0 + rng.uniform(-limits.max_drift, limits.max_drift)) for a in addresses}


def apply(sim: Simulation, fault: Fault, limits: FaultLimits) -> None:
    """Schedule the start (and end) of `fault` on `sim`."""
    net = sim.network
    label = fault.describe()
    if fault.kind in ("crash", "pause", "jump"):
        (target,) = fault.targets
        begin = {"crash": lambda: sim.crash(target), "pause": lambda: sim.pause(target),
                 "jump": lambda: sim.jump_clock(target, fault.value)}[fault.kind]
        sim.schedule(fault.start, begin, label)
        if fault.end is not None:
            undo = sim.restart if fault.kind == "crash" else sim.resume
            sim.schedule(fault.end, lambda: undo(target), f"end {label}")
        return
    if fault.kind in ("partition", "one_way", "bridge"):
        groups = fault.groups
        cut = {"partition": lambda: net.partition(groups),
               "one_way": lambda: net.one_way(groups[0], groups[1]),
               "bridge": lambda: net.bridge(groups[0], groups[1])}[fault.kind]
        sim.schedule(fault.start, cut, label)
        sim.schedule(fault.end or sim.now, net.heal, f"end {label}")
        return
    attr = {"drop": "drop_rate", "duplicate": "duplicate_rate", "reorder": "reorder_rate",
            "delay": "extra_delay_s"}[fault.kind]

    def begin_knob() -> None:
        setattr(net, attr, fault.value)
        if fault.kind == "reorder":
            net.reorder_window_s = limits.reorder_window_s

    sim.schedule(fault.start, begin_knob, label)
    sim.schedule(fault.end or sim.now, lambda: setattr(net, attr, 0.0), f"end {label}")
