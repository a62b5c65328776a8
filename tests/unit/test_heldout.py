"""Which rounds the leader evaluates, and records leaving in round order around an evaluation
(the real evaluation in a mesh: tests/integration/test_heldout_mesh.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from peer import timeline_file
from peer.core.timeline import RoundTimeline
from peer.heldout import HeldOut, default_eval_every
from peer.trainer.process import Evaluation


def test_due_on_the_leader_every_n_rounds_and_the_last() -> None:
    held = HeldOut(Path("/nonexistent"), 3, print)
    assert [r for r in range(1, 10) if held.due(r, leading=True, last=False)] == [3, 6, 9]
    assert not held.due(3, leading=False, last=False)  # a follower: the leader evaluates
    assert held.due(7, leading=True, last=True)  # the run's last θ, off the cadence
    assert not HeldOut(Path("/nonexistent"), 0, print).due(3, leading=True, last=True)  # 0: never


def test_default_cadence_keeps_evaluations_within_two_percent_of_compute() -> None:
    assert default_eval_every(256, inner_steps=10, batch_size=8) == 80  # the demo: 256 / (0.04 x 80)
    assert default_eval_every(256, inner_steps=500, batch_size=16) == 1
    for samples, h, batch in ((256, 10, 8), (64, 20, 4), (16, 8, 1)):
        n = default_eval_every(samples, h, batch)
        assert samples / (n * 2.0 * h * batch) <= 0.02 < samples / (max(n - 1, 0.5) * 2.0 * h * batch)


def _run(tmp_path: Path, evaluate_round_1: Evaluation | Exception) -> list[RoundTimeline]:
    async def scenario() -> None:
        tasks: set[asyncio.Task[None]] = set()
        held = HeldOut(tmp_path, 1, lambda coro: tasks.add(asyncio.ensure_future(coro)))
        release = asyncio.Event()

        async def evaluate() -> Evaluation:
            await release.wait()  # the trainer is still busy when round 2 closes
            if isinstance(evaluate_round_1, Exception):
                raise evaluate_round_1
            return evaluate_round_1

        assert held.due(1, leading=True, last=False)
        held.closed(RoundTimeline(1, "a", idle_s=1.0, committed_tokens=100), evaluate)
        assert not held.due(2, leading=True, last=False)  # one evaluation at a time
        held.closed(RoundTimeline(2, "a", idle_s=1.0, committed_tokens=200), None)
        assert timeline_file.read(tmp_path) == []  # round 2 waits behind round 1
        release.set()
        await asyncio.gather(*tasks)
        held.closed(RoundTimeline(3, "a", idle_s=1.0, committed_tokens=300), None)  # written at once

    asyncio.run(scenario())
    return timeline_file.read(tmp_path)


def test_records_wait_for_the_evaluation_and_leave_in_round_order(tmp_path: Path) -> None:
    first, second, third = _run(tmp_path, Evaluation(perplexity=321.0, samples=16, seconds=0.5))
    assert [r.round for r in (first, second, third)] == [1, 2, 3]
    assert (first.heldout_perplexity, first.heldout_samples, first.heldout_s) == (321.0, 16, 0.5)
    assert second.heldout_perplexity is None and third.heldout_perplexity is None
    assert (tmp_path / "tensorboard").is_dir()


def test_a_failed_evaluation_costs_the_point_not_the_records(tmp_path: Path) -> None:
    records = _run(tmp_path, RuntimeError("trainer worker died"))
    assert [(r.round, r.heldout_perplexity) for r in records] == [(1, None), (2, None), (3, None)]
