"""The round timeline: records, the file, and how RoundClock splits wall time into phases."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from peer import timeline_file
from peer.core.timeline import PHASES, RoundClock, RoundTimeline


def test_phases_partition_the_wall_time_and_idle_takes_the_rest() -> None:
    clock = RoundClock("a", now=100.0)
    clock.add(1, "gather", 0.5)
    clock.computing(now=100.5)
    clock.computed(6.0)
    clock.add(1, "publish", 0.5)
    clock.trained(1, tokens=4096, inner_steps=10)
    clock.reported(1, now=107.0)
    clock.add(1, "exchange", 1.0)  # a leader pulls the pseudo-gradients while it waits
    clock.committed(1, now=109.0)  # 2 s after the report, 1 s of it exchanging: 1 s commit_wait
    clock.add(1, "outer", 0.25)
    clock.add(1, "persist", 0.25)
    rec = clock.finish(1, now=110.0)
    assert rec.wall_s == pytest.approx(10.0)
    assert (rec.compute_s, rec.commit_wait_s, rec.exchange_s, rec.idle_s) == (6.0, 1.0, 1.0, 0.5)
    assert rec.tokens == 4096 and rec.inner_steps == 10
    assert rec.overhead_share == pytest.approx(0.4)
    assert rec.tokens_per_s == pytest.approx(409.6)


def test_seconds_of_the_next_round_stay_out_of_this_record() -> None:
    clock = RoundClock("a", now=0.0)
    clock.computing(now=0.0)
    clock.computed(3.0)
    clock.add(2, "gather", 0.5)  # round 2 started gathering while round 1 was still persisting
    first = clock.finish(1, now=4.0)
    assert (first.compute_s, first.gather_s, first.idle_s) == (3.0, 0.0, 1.0)
    second = clock.finish(2, now=5.0)
    assert (second.gather_s, second.idle_s, second.wall_s) == (0.5, 0.5, 1.0)


def test_a_commit_of_another_round_does_not_end_the_wait() -> None:
    clock = RoundClock("a", now=0.0)
    clock.reported(2, now=1.0)
    clock.committed(1, now=2.0)
    clock.committed(2, now=4.0)
    assert clock.finish(2, now=4.0).commit_wait_s == pytest.approx(3.0)


def test_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown round phase"):
        RoundClock("a", 0.0).add(1, "lunch", 1.0)


def test_file_round_trip_and_torn_tail(tmp_path: Path) -> None:
    recs = [RoundTimeline(r, "a", compute_s=1.0 * r, idle_s=0.5, tokens=10, loss=4.5) for r in (1, 2)]
    for rec in recs:
        timeline_file.append(tmp_path, rec)
    with open(tmp_path / timeline_file.TIMELINE_FILE, "a") as f:
        f.write('{"round": 3, "si')  # a crash mid-append
    assert timeline_file.read(tmp_path) == recs
    assert set(PHASES) <= {k.removesuffix("_s") for k in recs[0].to_json()}


def test_with_overlap_the_wall_time_is_the_clocks_not_the_sum_of_overlapping_phases(tmp_path: Path) -> None:
    """Compute of the next round runs beside this round's commit wait: 8 s of compute and 6 s of
    commit wait in a 9 s record is 9 s of wall and 1/9 overhead, not 14 s and 3/7."""
    clock = RoundClock("a", now=0.0)
    clock.computing(now=0.0)
    clock.computed(8.0)
    clock.reported(2, now=1.0)
    clock.committed(2, now=7.0)
    rec = clock.finish(2, now=9.0)
    assert rec.commit_wait_s == pytest.approx(6.0) and rec.idle_s == 0.0
    assert rec.wall_s == pytest.approx(9.0)
    assert rec.overhead_share == pytest.approx(1 / 9)
    timeline_file.append(tmp_path, rec)
    (back,) = timeline_file.read(tmp_path)
    assert back.wall_s == pytest.approx(9.0), "the measured wall time survives the file"


def test_a_run_that_spans_two_records_books_its_compute_where_it_ran() -> None:
    """Overlap: round 2 trains from t=4 to t=10 while round 1 closes at t=6. Round 1's record holds
    the 2 s it ran there (with 3 s of round 1's own run), round 2's the other 4; neither record's
    compute exceeds its wall time, and nothing is counted twice."""
    clock = RoundClock("a", now=0.0)
    clock.computing(now=0.0)
    clock.computed(3.0)
    clock.computing(now=4.0)  # round 2, ahead
    first = clock.finish(1, now=6.0)
    clock.computed(6.0)
    second = clock.finish(2, now=11.0)
    assert (first.compute_s, second.compute_s) == (5.0, 4.0)
    assert 0.0 <= first.overhead_share <= 1.0 and 0.0 <= second.overhead_share <= 1.0
    assert clock.totals["compute"] == pytest.approx(9.0)


def test_a_dropped_run_books_no_more_compute() -> None:
    clock = RoundClock("a", now=0.0)
    clock.computing(now=1.0)
    assert clock.finish(1, now=3.0).compute_s == 2.0  # under way when round 1 closed
    clock.computed(None)  # trained ahead for a round decided without this site
    assert clock.finish(2, now=5.0).compute_s == 0.0


def test_compute_is_not_an_added_phase() -> None:
    with pytest.raises(ValueError, match="computed"):
        RoundClock("a", now=0.0).add(1, "compute", 1.0)


def test_tokens_and_heldout_fields_round_trip_and_old_records_still_read(tmp_path: Path) -> None:
    clock = RoundClock("a", now=0.0)
    clock.trained(3, tokens=4096, inner_steps=8, loss=5.25)
    rec = clock.finish(3, now=2.0, committed_tokens=12_288)
    assert rec.committed_tokens == 12_288 and rec.heldout_perplexity is None
    evaluated = replace(rec, heldout_perplexity=412.5, heldout_samples=64, heldout_s=0.45)
    timeline_file.append(tmp_path, evaluated)
    # A line written before the fields existed (and before overlap: no measured wall time).
    old = {"round": 2, "site": "a", "compute_s": 1.0, "idle_s": 0.5, "tokens": 10, "loss": 4.5,
           "inner_steps": 2, **{f"{p}_s": 0.0 for p in PHASES if p not in ("compute", "idle")}}
    with open(tmp_path / timeline_file.TIMELINE_FILE, "a") as f:
        f.write(json.dumps(old) + "\n")
    back, legacy = timeline_file.read(tmp_path)
    assert back == evaluated
    assert (legacy.committed_tokens, legacy.heldout_perplexity, legacy.heldout_samples) == (None, None, None)
    assert legacy.wall_s == pytest.approx(1.5)
