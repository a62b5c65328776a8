"""Whole-peer simulation (peer/sim/peer_sim.py): the real round, consensus and lease cores of five
sites under a killed contributor, a killed leader and a late join; and proof that the sweep reports
planted bugs with a command that replays them.

    .venv/bin/python -m pytest -q tests/sim/test_peer_sim.py
"""

from __future__ import annotations

import argparse
import pytest

from ops import simulate as ops_simulate
from peer import rounds
from peer.admission import Admission
from peer.core import events as ev
from peer.core.apply import ApplyQueue
from peer.sim.peer_sim import PeerSimConfig, simulate

SEEDS = range(10)


def _args(seeds: range) -> argparse.Namespace:
    return argparse.Namespace(protocol="peer", members=5, faults="all", seed=None, seeds=seeds, trace=False,
                              jobs=1, json=False)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_peer_applies_the_same_rounds_and_every_epoch_commits_each_sample_once(seed: int) -> None:
    world, res = simulate(seed)
    assert res.violations == [], f"replay: ops simulate --protocol peer --members 5 --seed {seed} --trace"
    assert world.epochs_done == 2
    assert any("kill" in what and "mid-round" in what for _, what in world.faults), world.faults
    assert any("start s4" == what for _, what in world.faults), "the late joiner must join"
    # Every site ends at the last committed round, by applying it or by a state transfer to it.
    assert {seq[-1] for seq in world.applied.values() if seq} == {world.order[-1]}


def test_the_faults_exercise_reopen_exclusion_and_state_transfer() -> None:
    notes = [n for seed in SEEDS for n in simulate(seed)[0].notes]
    for what in ("reopened", "excluded", "catching up by state transfer", "not every trained sample was vouched"):
        assert any(what in n for n in notes), what


def test_ops_simulate_runs_whole_peers(capsys: pytest.CaptureFixture[str]) -> None:
    assert ops_simulate.run(_args(range(0, 3))) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("seeds=3 events=") and last.endswith(" violations=0"), last


def test_contributions_admitted_without_vouchers_are_reported_with_a_replay_command(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The leader admits every report, vouched or not (I6 off): a site that lost a lease while it
    trained gets its samples committed beside the new holder's."""
    monkeypatch.setattr(rounds.admission, "admit_round",
                        lambda r, cs, ledger: [Admission(c.site, True, "sabotaged", ()) for c in cs])
    assert ops_simulate.run(_args(SEEDS)) == 1
    out = capsys.readouterr().out
    assert "committed twice in data epoch" in out and "(I4)" in out, out
    assert "  replay: ops simulate --protocol peer --members 5 --faults all --seed " in out, out


def test_rounds_applied_again_after_a_state_transfer_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ApplyQueue._next

    def forgets_what_the_transfer_covered(self: ApplyQueue, now: float) -> list[ev.Effect]:
        self.applied_round = -1  # the skip of rounds a state transfer covered no longer works
        return real(self, now)

    monkeypatch.setattr(ApplyQueue, "_next", forgets_what_the_transfer_covered)
    found = [simulate(seed)[1].violations for seed in SEEDS]
    assert any(any("applied round" in v for v in vs) for vs in found), found


def test_too_few_sites_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least 3 sites"):
        PeerSimConfig(sites=2)
