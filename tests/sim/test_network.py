"""The generic simulator layer: fake network faults, clocks, fault schedules and the event loop."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from peer.sim.clock import NodeClock
from peer.sim.faults import KINDS, LOSSY, FaultLimits, apply, clocks, parse_faults, plan
from peer.sim.network import SimNetwork
from peer.sim.runner import NodeState, Simulation

# -- network -----------------------------------------------------------------------------------------


def test_symmetric_partition_one_way_and_bridge() -> None:
    net = SimNetwork(random.Random(0))
    net.partition([["a", "b"], ["c"]])
    assert not net.reachable("a", "c") and not net.reachable("c", "b") and net.reachable("a", "b")
    net.heal()
    net.one_way(["a"], ["c"])
    assert not net.reachable("a", "c") and net.reachable("c", "a")
    net.heal()
    net.bridge(["a"], ["c"])  # b is in neither group: the bridge
    assert not net.reachable("a", "c") and not net.reachable("c", "a")
    assert net.reachable("a", "b") and net.reachable("b", "c") and net.reachable("c", "b")
    assert net.lossy
    net.heal()
    assert not net.lossy


def test_drop_and_duplicate_rates_and_accounting() -> None:
    net = SimNetwork(random.Random(1))
    net.drop_rate, net.duplicate_rate = 0.25, 0.1
    copies = [len(net.send("a", "b", 0.0)) for _ in range(20_000)]
    assert copies.count(0) / len(copies) == pytest.approx(0.25, abs=0.02)
    assert copies.count(2) / len(copies) == pytest.approx(0.75 * 0.1, abs=0.01)
    assert net.stats["sent"] == 20_000
    assert net.stats["lost_drop"] == copies.count(0) and net.stats["duplicated"] == copies.count(2)


def test_delay_and_reorder_stay_within_their_windows() -> None:
    net = SimNetwork(random.Random(2), latency_s=(0.01, 0.02))
    net.extra_delay_s, net.reorder_rate, net.reorder_window_s = 0.05, 0.5, 0.1
    times = [t for _ in range(5000) for t in net.send("a", "b", 10.0)]
    assert min(times) >= 10.01 and max(times) <= 10.0 + 0.02 + 0.05 + 0.1
    assert net.stats["reordered"] > 2000
    plain = SimNetwork(random.Random(2), latency_s=(0.01, 0.02))
    assert all(10.01 <= t <= 10.02 for _ in range(100) for t in plain.send("a", "b", 10.0))


def test_same_seed_same_fates() -> None:
    def fates(seed: int) -> list[list[float]]:
        net = SimNetwork(random.Random(seed))
        net.drop_rate, net.duplicate_rate, net.reorder_rate, net.reorder_window_s = 0.2, 0.2, 0.2, 0.1
        return [net.send("a", "b", float(i)) for i in range(200)]

    assert fates(7) == fates(7) and fates(7) != fates(8)


# -- clocks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset,rate,jump", [(0.0, 1.0, 0.0), (1234.5, 1.001, 0.0), (7.0, 0.999, 3.0),
                                              (1e6, 1.0 + 1e-9, 0.1)])
def test_clock_round_trip_never_wakes_a_node_early(offset: float, rate: float, jump: float) -> None:
    c = NodeClock(offset, rate)
    c.jump(jump)
    for local in (offset + 0.1, offset + 17.3, offset + 1e5 / 3):
        assert c.local(c.to_true(local)) >= local
    with pytest.raises(ValueError):
        c.jump(-1.0)


# -- fault schedules -----------------------------------------------------------------------------------


def test_parse_faults() -> None:
    assert parse_faults("all") == KINDS
    assert parse_faults("none") == ()
    assert parse_faults("pause,network") == ("pause", "drop", "duplicate", "reorder", "delay")
    assert not set(parse_faults("benign")) & LOSSY
    with pytest.raises(ValueError):
        parse_faults("meteor")


@pytest.mark.parametrize("seed", range(30))
def test_plans_are_deterministic_bounded_and_do_not_overlap(seed: int) -> None:
    addresses = [f"n{i}" for i in range(8)]
    limits = FaultLimits()
    faults = plan(random.Random(seed), KINDS, addresses, 10.0, 70.0, limits)
    assert faults == plan(random.Random(seed), KINDS, addresses, 10.0, 70.0, limits)
    for f in faults:
        assert 10.0 <= f.start < 70.0
        assert f.end is None or f.start < f.end <= 70.0
    cuts = ("partition", "one_way", "bridge")
    cut = sorted((f.start, f.end or 70.0) for f in faults if f.kind in cuts)
    assert all(a[1] <= b[0] for a, b in zip(cut, cut[1:], strict=False))
    for address in addresses:
        own = sorted((f.start, f.end or 70.0) for f in faults
                     if f.kind in ("crash", "pause") and address in f.targets)
        overlapping = [(a, b) for a, b in zip(own, own[1:], strict=False) if a[1] > b[0]]
        assert not overlapping, f"overlapping faults on {address}: {overlapping}"
    for f in faults:
        if f.kind == "bridge":
            assert len(f.groups) == 3 and all(f.groups)
            assert len(f.groups[2]) <= min(len(f.groups[0]), len(f.groups[1]))
    crashed = [f for f in faults if f.kind == "crash"]
    assert len(crashed) <= limits.max_crashes and len({f.targets for f in crashed}) == len(crashed)


def test_skewed_clocks_within_limits() -> None:
    limits = FaultLimits()
    cs = clocks(random.Random(3), ["a", "b"], limits, skew=True)
    assert all(abs(c.rate - 1) <= limits.max_drift and 0 <= c.base <= limits.max_offset_s
               for c in cs.values())
    assert all(c.rate == 1 and c.base == 0 for c in clocks(random.Random(3), ["a"], limits, False).values())


# -- the event loop -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    to: str
    msg: Any


@dataclass
class Echo:
    """A toy core: pings its peer every second, answers pings; records what it saw (local time)."""

    me: str
    peer: str
    start: float
    got: list[tuple[float, str]] = field(default_factory=list)
    next_at: float = 0.0

    def __post_init__(self) -> None:
        self.next_at = self.start + 1.0

    def tick(self, now: float) -> list[Any]:
        if now < self.next_at:
            return []
        self.next_at = now + 1.0
        return [Send(self.peer, ("ping", self.me))]

    def receive(self, msg: Any, now: float) -> list[Any]:
        self.got.append((now, msg[0]))
        return [Send(msg[1], ("pong", self.me))] if msg[0] == "ping" else []

    def next_deadline(self) -> float:
        return self.next_at


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[float, str]] = []

    def after_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> list[str]:
        self.events.append((sim.now, address))
        return []

    def at_end(self, sim: Simulation) -> list[str]:
        return []


def two_echoes(seed: int = 0, clock_b: NodeClock | None = None) -> tuple[Simulation, dict[str, Echo]]:
    sim = Simulation(seed, SimNetwork(random.Random(seed), latency_s=(0.01, 0.01)))
    made: dict[str, Echo] = {}

    def factory(me: str, peer: str) -> Any:
        def start(now: float) -> tuple[Echo, list[Any]]:
            made[me] = Echo(me, peer, now)
            return made[me], []
        return start

    sim.add_node("a", factory("a", "b"))
    sim.add_node("b", factory("b", "a"), clock=clock_b)
    return sim, made


def test_pause_holds_messages_until_resume_and_crash_loses_them() -> None:
    sim, made = two_echoes()
    sim.schedule(2.5, lambda: sim.pause("b"), "pause b")
    sim.schedule(6.5, lambda: sim.resume("b"), "resume b")
    sim.run(6.49, Recorder())
    assert sim.state("b") is NodeState.PAUSED
    got_by_b = len(made["b"].got)
    result = sim.run(6.6, Recorder())
    assert not result.violations
    held = [t for t, _ in made["b"].got[got_by_b:]]
    assert len(held) >= 4 and all(t == pytest.approx(6.5) for t in held[:4])  # delivered on resume
    sim.schedule(7.0, lambda: sim.crash("a"), "crash a")
    sim.run(9.0, Recorder())
    assert sim.node("a") is None and sim.network.stats["lost_node_down"] >= 1


def test_timers_follow_the_node_clock() -> None:
    sim, made = two_echoes(clock_b=NodeClock(offset=100.0, rate=2.0))  # b's clock runs twice as fast
    sim.run(10.0, Recorder())
    pings_from_b = [t for t, kind in made["a"].got if kind == "ping"]
    assert len(pings_from_b) == pytest.approx(19, abs=1)  # every 0.5 s of true time
    assert all(t < 11 for t, _ in made["a"].got) and all(t > 100 for t, _ in made["b"].got)


def test_clock_jump_fires_due_timers_at_once() -> None:
    sim, made = two_echoes()
    sim.schedule(3.2, lambda: sim.jump_clock("b", 5.0), "jump b")
    sim.run(3.3, Recorder())
    pings_from_b = [t for t, kind in made["a"].got if kind == "ping"]
    assert any(t == pytest.approx(3.21) for t in pings_from_b)


def test_same_seed_same_run() -> None:
    def events(seed: int) -> list[tuple[float, str]]:
        sim, _ = two_echoes(seed)
        sim.network.drop_rate = 0.3
        rec = Recorder()
        sim.run(30.0, rec)
        return rec.events

    assert events(5) == events(5) and events(5) != events(6)


def test_livelock_is_reported() -> None:
    class Stuck:
        def tick(self, now: float) -> list[Any]:
            return []

        def receive(self, msg: Any, now: float) -> list[Any]:
            return []

        def next_deadline(self) -> float:
            return 0.0  # always due, never progressing

    sim = Simulation(0, SimNetwork(random.Random(0)))
    sim.add_node("x", lambda now: (Stuck(), []))
    result = sim.run(1.0, Recorder())
    assert result.violations and "livelock" in result.violations[0]


def test_fault_schedule_applies_and_undoes() -> None:
    sim, _ = two_echoes()
    sim.add_node("c", lambda now: (Echo("c", "a", now), []))
    limits = FaultLimits(drop_rate=(0.5, 0.9))  # a few messages a second: make drops certain
    faults = plan(random.Random(4), ("partition", "drop", "pause"), ["a", "b", "c"], 1.0, 20.0, limits)
    assert {f.kind for f in faults} == {"partition", "drop", "pause"}
    for f in faults:
        apply(sim, f, limits)
    sim.run(20.5, Recorder())
    assert sim.network.stats["lost_partition"] and sim.network.stats["lost_drop"]
    assert not sim.network.lossy and all(sim.state(a) is NodeState.UP for a in "abc")
