"""Membership in the deterministic simulator: a bounded seed sweep with every fault, the presets,
replay determinism, `ops simulate`, and deliberately broken cores that the invariants must catch."""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

import ops.simulate as simulate
from peer.core.membership import (
    MemberMeta,
    Membership,
    MembershipConfig,
    MemberState,
    MemberUpdate,
    StateChanged,
)
from peer.core.membership import _Probe as Probe
from peer.sim.membership_sim import LATENCY_S, MembershipScenario, run_seed
from peer.sim.network import SimNetwork
from peer.sim.runner import Simulation

# 200 seeds x 20 members with all faults: about 70 s of CPU (the 500-seed sweep is the slow test).
SWEEP = range(0, 200)


def test_seed_sweep_all_faults() -> None:
    scenario = MembershipScenario(members=20)
    failures = []
    for seed in SWEEP:
        result = run_seed(seed, scenario)
        if result.violations:
            failures.append(f"seed {seed}: {result.violations[0]}\n  replay: ops simulate "
                            f"--members 20 --seed {seed} --faults all --trace")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("preset,members,seeds", [("wan", 8, range(0, 6)), ("local_test", 5, range(0, 8))])
def test_other_presets(preset: str, members: int, seeds: range) -> None:
    scenario = MembershipScenario(members=members, preset=preset)
    for seed in seeds:
        result = run_seed(seed, scenario)
        assert not result.violations, f"{preset} seed {seed}: {result.violations[0]}"


def test_same_seed_replays_identically() -> None:
    scenario = MembershipScenario(members=8)
    a, b = run_seed(3, scenario), run_seed(3, scenario)
    assert (a.events, a.end_time, a.stats) == (b.events, b.end_time, b.stats)
    assert a.events != run_seed(4, scenario).events
    assert a.stats["lost_drop"] + a.stats["lost_partition"] > 0  # faults really happened


def test_benign_seeds_carry_no_lossy_fault() -> None:
    scenario = MembershipScenario()
    assert set(scenario.kinds_for(0)) == {"duplicate", "reorder", "delay", "skew"}
    assert "drop" in scenario.kinds_for(1)


# -- the invariants catch broken cores ---------------------------------------------------------------


class NeverRefutes(Membership):
    """Ignores accusations about itself: a paused member stays dead."""

    def _about_self(self, u: MemberUpdate) -> list:
        return []


class NeverSuspects(Membership):
    """A failed probe changes nothing: crashed members stay alive forever."""

    def _probe_failed(self, p: Probe, now: float) -> list:
        self._probe = None
        return []


class IgnoresLeft(Membership):
    """Drops LEFT rumours: departed members end up DEAD instead of LEFT."""

    def _apply(self, u: MemberUpdate, now: float, from_push_pull: bool = False,
               regossip: bool = True) -> list:
        return [] if u.state is MemberState.LEFT else super()._apply(u, now, from_push_pull, regossip)


class TriggerHappy(Membership):
    """Deaf to acks and declares death at the first missed probe."""

    def _on_ack(self, msg: object, now: float) -> list:
        return []

    def _suspect(self, m: object, incarnation: int, from_site: str, now: float, reason: str) -> list:
        effects = super()._suspect(m, incarnation, from_site, now, reason)  # type: ignore[arg-type]
        self._suspicions[m.site].deadline = now  # type: ignore[attr-defined]
        return effects


@pytest.mark.parametrize("core,seeds,expect", [
    (NeverRefutes, range(1, 6), r"after convergence .* sees .* (DEAD|SUSPECT)"),
    (NeverSuspects, range(1, 6), r"still sees crashed .* (ALIVE|SUSPECT)"),
    (IgnoresLeft, range(1, 20), r"expected LEFT or unknown"),
    (TriggerHappy, range(0, 11, 5), r"declared .* dead with no loss and no pauses"),
])
def test_broken_cores_are_caught(core: type[Membership], seeds: range, expect: str) -> None:
    scenario = MembershipScenario(members=10, core=core)
    caught = []
    for seed in seeds:
        caught += run_seed(seed, scenario).violations[:1]
        if any(re.search(expect, v) for v in caught):
            return
    pytest.fail(f"{core.__name__} was not caught as expected; violations: {caught}")


# -- ops simulate -------------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ops")
    simulate.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *argv])


def test_ops_simulate_summary_last_and_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["--members", "6", "--seeds", "0:3", "--fault-periods", "20"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"seeds=3 events=\d+ violations=0", lines[-1])


def test_ops_simulate_reports_a_failing_seed_with_replay(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    broken = simulate.SimProtocol(
        lambda args, seed, trace: run_seed(seed, replace(simulate._membership_scenario(args),
                                                         core=NeverSuspects), trace),
        simulate._membership_flags)
    monkeypatch.setitem(simulate.PROTOCOLS, "membership", broken)
    args = parse(["--members", "6", "--seeds", "1:3", "--faults", "process"])
    assert args.func(args) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("seed=") and "violation" in line for line in out)
    replay = next(line for line in out if "replay:" in line)
    assert re.search(r"ops simulate --protocol membership --members 6 .* --faults process "
                     r".*--seed \d+ --trace", replay)
    assert re.fullmatch(r"seeds=2 events=\d+ violations=[1-9]\d*", out[-1])


def test_ops_simulate_json_and_bad_faults(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    args = parse(["--members", "5", "--seed", "2", "--fault-periods", "10", "--json"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["seeds"] == 1 and doc["violations"] == 0 and doc["events"] > 0
    assert captured.err.strip().splitlines()[-1].startswith("seeds=1 ")
    args = parse(["--faults", "meteor"])
    assert args.func(args) == 2
    args = parse(["--members", "2"])
    assert args.func(args) == 2


@pytest.mark.slow
def test_five_hundred_seeds_all_faults(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["--members", "20", "--seeds", "0:500", "--faults", "all", "--jobs", "2"])
    code = args.func(args)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0 and re.fullmatch(r"seeds=500 events=\d+ violations=0", last), last


# -- WAN: a GC pause must not make a peer look dead ---------------------------------------------------


class Deaths:
    """Records every DEAD verdict (a Checker that never objects)."""

    def __init__(self) -> None:
        self.dead: list[str] = []
        self.suspected: list[str] = []

    def after_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> list[str]:
        for e in effects:
            if isinstance(e, StateChanged) and e.new is MemberState.DEAD:
                self.dead.append(f"{address} declared {e.site} dead: {e.reason}")
            if isinstance(e, StateChanged) and e.new is MemberState.SUSPECT:
                self.suspected.append(e.site)
        return []

    def at_end(self, sim: Simulation) -> list[str]:
        return []


@pytest.mark.parametrize("pause_s,seed", [(1.0, 0), (2.5, 1), (5.0, 2), (8.0, 3)])
def test_wan_gc_pause_is_not_death(pause_s: float, seed: int) -> None:
    cfg = MembershipConfig.wan()
    sim = Simulation(seed, SimNetwork(random.Random(seed), latency_s=LATENCY_S["wan"]))
    addresses = [f"site{i}:7946" for i in range(5)]
    for i, address in enumerate(addresses):
        def start(now: float, address: str = address) -> tuple[Membership, list[Any]]:
            m = Membership(MemberMeta(address.split(":")[0], address), cfg, random.Random(address), now)
            return m, m.join(addresses[:1], now)
        sim.add_node(address, start, at=0.3 * i)
    deaths = Deaths()
    for k in range(4):  # four long pauses of one member, each while it is probed
        at = 40.0 + 30.0 * k
        sim.schedule(at, lambda: sim.pause(addresses[3]), "gc pause")
        sim.schedule(at + pause_s, lambda: sim.resume(addresses[3]), "gc resumes")
    sim.run(200.0, deaths)
    assert not deaths.dead, deaths.dead
    if pause_s > cfg.probe_interval_s:
        assert "site3" in deaths.suspected  # it was noticed, and refuted in time
    node = sim.node(addresses[0])
    assert isinstance(node, Membership)
    assert all(v.state is MemberState.ALIVE for v in node.members())


def test_bench_membership_small_group_within_bounds() -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_membership"
    out = subprocess.run([sys.executable, str(script), "--sizes", "10", "--trials", "3", "--json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    assert row["n"] == 10 and row["trials"] == 3
    assert 0 < row["first_suspect_periods"] <= row["all_dead_periods"]
    assert row["all_dead_max"] <= row["detection_bound_periods"]
    assert 0 < row["dissemination_periods"] < row["all_dead_periods"]
