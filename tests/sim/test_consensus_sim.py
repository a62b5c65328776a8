"""Election + commit log in the deterministic simulator: a bounded sweep under every fault with zero
violations, determinism, and deliberately broken cores that the invariants must catch.

The >= 1,000-seed sweep is `-m slow` (and `python -m peer.sim.consensus_sim --seeds 0:1000`)."""

from __future__ import annotations

import dataclasses

import pytest

from peer.core.commitlog import AppendEntries
from peer.core.consensus import ConsensusCore, Message
from peer.core.consensus_effects import Effect
from peer.core.election import Epoch, HardState, RequestVote
from peer.sim.consensus_sim import ConsensusScenario, run_consensus_sweep, run_seed


def test_bounded_sweep_under_all_faults_has_no_violation() -> None:
    summary = run_consensus_sweep(range(40), voters=[3, 5])
    assert summary["violations"] == 0, summary["failures"]
    assert summary["runs"] == 160 and summary["liveness_checked"] >= 150
    assert summary["committed_rounds"] > 160 * 10  # rounds really commit between faults


def test_same_seed_same_run() -> None:
    sc = ConsensusScenario(voters=5)
    a, b = run_seed(7, sc), run_seed(7, sc)
    assert (a.events, a.stats, a.violations) == (b.events, b.stats, b.violations)


class ForgetsItsVote(ConsensusCore):
    """Grants a second vote in the same epoch (as if voted_for were not persisted)."""

    def _on_request_vote(self, req: RequestVote, effects: list[Effect]) -> None:
        self.hard = HardState(self.hard.epoch, None)
        super()._on_request_vote(req, effects)


class IgnoresLogFreshness(ConsensusCore):
    """Votes for candidates whatever their log (no Raft 5.4.1 up-to-date check)."""

    def _on_request_vote(self, req: RequestVote, effects: list[Effect]) -> None:
        super()._on_request_vote(dataclasses.replace(req, last_index=10**9, last_epoch=Epoch(10**9)), effects)


class OverlongLease(ConsensusCore):
    """Believes its lease lasts an election timeout longer than the drift-safe margin."""

    def _lease_expiry(self, hold_s: float | None = None) -> float:
        return super()._lease_expiry(hold_s) + self.config.election_timeout_max_s


class ObeysDeposedLeaders(ConsensusCore):
    """Follows an AppendEntries of an older epoch (no fencing)."""

    def receive(self, msg: Message, now: float) -> list[Effect]:
        if isinstance(msg, AppendEntries) and msg.header.epoch < self.hard.epoch:
            self.leader = msg.header.from_site
        return super().receive(msg, now)


@pytest.mark.parametrize("core,check_lease,expect", [
    (ForgetsItsVote, False, "two leaders in epoch"),
    (IgnoresLogFreshness, False, "lacks committed index"),
    (OverlongLease, True, "overlapping leases"),
    (ObeysDeposedLeaders, False, "stale AppendEntries"),
])
def test_broken_cores_are_caught(core: type[ConsensusCore], check_lease: bool, expect: str) -> None:
    found = []
    for seed in range(40):
        for voters in (3, 5):
            r = run_seed(seed, ConsensusScenario(voters=voters, core=core, check_lease=check_lease))
            found += r.violations
        if any(expect in v for v in found):
            return
    pytest.fail(f"{core.__name__} was not caught in 40 seeds: {found[:3]}")


@pytest.mark.slow
def test_thousand_seed_sweep() -> None:
    summary = run_consensus_sweep(range(1000), voters=[3, 5])
    assert summary["violations"] == 0, summary["failures"]
