"""Round records as TensorBoard scalars, read back with TensorBoard's own event reader."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from peer.core.timeline import RoundTimeline
from peer.tensorboard_log import TensorBoardLog


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_each_record_is_a_step_at_the_tokens_committed(tmp_path: Path) -> None:
    board = TensorBoardLog(tmp_path / "tensorboard")
    board.write(RoundTimeline(1, "a", compute_s=3.0, exchange_s=0.5, idle_s=0.5, tokens=4096, loss=7.5,
                              committed_tokens=8192))
    # Round 2: this site only applied it (no loss), and evaluated θ_2.
    board.write(RoundTimeline(2, "a", compute_s=0.0, idle_s=2.0, committed_tokens=16384,
                              heldout_perplexity=900.0, heldout_samples=16, heldout_s=0.25))
    board.close()
    got = _scalars(tmp_path / "tensorboard")
    assert got["loss/train"] == [(8192, 7.5)]  # a round without training writes no loss
    assert got["eval/heldout_perplexity"] == [(16384, 900.0)]
    assert got["eval/heldout_loss"][0][1] == pytest.approx(math.log(900.0))
    assert got["round"] == [(8192, 1.0), (16384, 2.0)]
    assert got["tokens/committed"] == [(8192, 8192.0), (16384, 16384.0)]
    assert got["tokens/site_round"] == [(8192, 4096.0), (16384, 0.0)]
    assert got["time/round_wall_s"] == [(8192, 4.0), (16384, 2.0)]
    assert got["time/overhead_s"] == [(8192, 1.0), (16384, 2.0)]
    assert got["phase/exchange_s"] == [(8192, 0.5), (16384, 0.0)]


def test_a_failed_write_warns_and_the_next_round_starts_a_new_file(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "tensorboard"
    blocked.write_text("a file where the directory should be")  # as unwritable as a full disk
    board = TensorBoardLog(blocked)
    with caplog.at_level(logging.WARNING, "sitemesh.tensorboard"):
        board.write(RoundTimeline(1, "a", idle_s=1.0, committed_tokens=0))  # must not raise
    assert "round 1: TensorBoard scalars not written" in caplog.text
    blocked.unlink()
    board.write(RoundTimeline(2, "a", idle_s=1.0, committed_tokens=64))
    board.close()
    assert _scalars(blocked)["round"] == [(64, 2.0)]
