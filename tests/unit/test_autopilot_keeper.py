"""The operator loop's decisions (ops/autopilot/keeper.py), table by table, with a manual clock."""

from __future__ import annotations

import datetime as dt

import pytest

from ops.autopilot.keeper import (
    Hold,
    Job,
    JobState,
    KeeperConfig,
    StartNow,
    Submit,
    decide,
    job_name,
    job_state,
    led_begin,
    parse_job_name,
)

CONFIG = KeeperConfig(handover_s=300, max_failures=3, backoff_s=(600, 3600), min_useful_s=120)
T0 = 1_800_000_000.0


def job(seq: int, state: JobState, start: float | None = None, end: float | None = None,
        slurm: str = "", wall_s: float = 3600) -> Job:
    return Job("lumi", seq, str(1000 + seq), state, slurm or state.name, wall_s, start, end)


def test_names_carry_run_site_and_sequence_and_other_jobs_are_ignored() -> None:
    assert job_name("c4", "lumi", 7) == "sitemesh-c4-lumi-7"
    assert parse_job_name("sitemesh-c4-lumi-7", "c4") == ("lumi", 7)
    assert parse_job_name("sitemesh-c4-my-site-12", "c4") == ("my-site", 12)
    for other in ("sitemesh-other-lumi-7", "sitemesh-c4-lumi", "sitemesh-c4-lumi-x", "interactive", "sitemesh-c4--3"):
        assert parse_job_name(other, "c4") is None, other
    assert job_state("CANCELLED by 1000") is JobState.FAILED
    assert job_state("TIMEOUT") is JobState.ENDED and job_state("PENDING") is JobState.QUEUED
    assert job_state("NODE_FAIL") is JobState.FAILED and job_state("COMPLETING") is JobState.RUNNING


def test_a_site_without_a_job_gets_one_at_once() -> None:
    d = decide(T0, "lumi", [], 0, False, CONFIG)
    assert d == Submit("lumi", 1, None, "no job running or queued: it has no job yet")


def test_a_running_job_gets_a_successor_that_may_start_handover_s_before_its_end() -> None:
    d = decide(T0 + 60, "lumi", [job(1, JobState.RUNNING, start=T0)], 1, False, CONFIG)
    assert isinstance(d, Submit) and d.seq == 2
    assert d.begin == T0 + 3600 - 300
    assert "job 1 (1001) runs until" in d.reason and "300 s before" in d.reason
    # Submitted late (the loop was down): it may start at once.
    late = decide(T0 + 3500, "lumi", [job(1, JobState.RUNNING, start=T0)], 1, False, CONFIG)
    assert isinstance(late, Submit) and late.begin == T0 + 3500


@pytest.mark.parametrize(("now", "wait_s", "begin", "says"), [
    # Slurm counts the wait from --begin: led by the calibrated wait, the job has waited by the window.
    (T0, 45.0, T0 + 3300 - 45, "- calibrated wait 45 s (why)"),
    (T0, 0.0, T0 + 3300, "- calibrated wait 0 s (why)"),
    # No calibrated wait (too few pairs, no probe): the window itself, not a raw guess 10x too long.
    (T0, None, T0 + 3300, "not led by a queue wait: why"),
    # Never more than half the 3300 s from the predecessor's start to the window, never before now.
    (T0 - 7200, 9000.0, T0 + 3300 - 1650, "at most half the 3300 s from the predecessor's start"),
    (T0 + 3000, 600.0, T0 + 3000, "but not before now"),
])
def test_a_successors_begin_leads_its_window_by_the_calibrated_wait(now: float, wait_s: float | None,
                                                                      begin: float, says: str) -> None:
    got, reason = led_begin(now, T0 + 3300, wait_s, 3600.0, 300.0, "why")
    assert got == begin and says in reason, reason
    assert reason.startswith(f"--begin {_clock(begin)}")


def test_a_wrong_predicted_wait_cannot_chain_successors_that_start_at_once() -> None:
    """2-minute jobs, successors 80 s before the end, and a calibrated wait of 2 minutes where the
    queue is empty: each successor starts at its --begin and at once gets a successor of its own.
    Led by the whole wall time, ten jobs started within a second (a soak did this); led by at most
    half the 40 s from a job's start to its successor's window, one starts every 20 s at most."""
    config = KeeperConfig(handover_s=80, max_failures=3, backoff_s=(600, 3600), min_useful_s=20)
    jobs = [Job("lumi", 1, "1", JobState.RUNNING, "RUNNING", 120, T0)]
    for seq in range(2, 12):
        now = jobs[-1].start
        assert now is not None
        d = decide(now, "lumi", jobs, seq - 1, False, config)
        assert isinstance(d, Submit) and d.begin is not None, d
        begin, _ = led_begin(now, d.begin, 120.0, 120.0, config.handover_s, "why")
        jobs.append(Job("lumi", seq, str(seq), JobState.RUNNING, "RUNNING", 120, begin))
    starts = [j.start for j in jobs]
    assert min(b - a for a, b in zip(starts, starts[1:])) == pytest.approx(20.0)  # type: ignore[operator]


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M:%S UTC")


def test_nothing_is_submitted_while_a_job_is_queued_or_once_the_target_is_reached() -> None:
    jobs = [job(1, JobState.RUNNING, start=T0), job(2, JobState.QUEUED)]
    assert decide(T0 + 60, "lumi", jobs, 2, False, CONFIG) == Hold("lumi", "job 2 (1002) is queued")
    assert decide(T0, "lumi", [], 0, True, CONFIG) == Hold("lumi", "the run reached its target: no more jobs")


def test_a_successor_waiting_for_its_begin_starts_now_when_its_predecessor_is_gone() -> None:
    """Job 1 died an hour before its wall time; job 2 was to begin 300 s before that end: the site
    would be out until then. While job 1 runs, or once the begin has passed, job 2 just waits."""
    waiting = Job("lumi", 2, "1002", JobState.QUEUED, "PENDING", 3600, begin=T0 + 3300)
    dead = job(1, JobState.FAILED, start=T0, end=T0 + 1200, slurm="NODE_FAIL")
    d = decide(T0 + 1260, "lumi", [dead, waiting], 2, False, CONFIG)
    assert isinstance(d, StartNow) and (d.seq, d.job_id) == (2, "1002")
    assert "no job running, and job 2 (1002) was to begin at" in d.reason
    running = job(1, JobState.RUNNING, start=T0)
    assert decide(T0 + 1260, "lumi", [running, waiting], 2, False, CONFIG) == Hold("lumi", "job 2 (1002) is queued")
    assert decide(T0 + 3400, "lumi", [dead, waiting], 2, False, CONFIG) == Hold("lumi", "job 2 (1002) is queued")
    # Queued for resources (no --begin): nothing to bring forward.
    assert isinstance(decide(T0 + 1260, "lumi", [dead, job(2, JobState.QUEUED)], 2, False, CONFIG), Hold)


def test_sequence_numbers_are_never_reused() -> None:
    # The state file remembers 9 (jobs aged out of sacct); the queue shows 4: the next is 10.
    d = decide(T0, "lumi", [job(4, JobState.ENDED, T0 - 4000, T0 - 400)], 9, False, CONFIG)
    assert isinstance(d, Submit) and d.seq == 10


def test_a_failed_or_cancelled_job_is_replaced_at_once() -> None:
    d = decide(T0, "lumi", [job(1, JobState.FAILED, T0 - 50, T0 - 10, "NODE_FAIL")], 1, False, CONFIG)
    assert d == Submit("lumi", 2, None, "no job running or queued: its last job 1 (1001) failed (NODE_FAIL)")
    short = decide(T0, "lumi", [job(1, JobState.ENDED, T0 - 50, T0 - 10, "COMPLETED")], 1, False, CONFIG)
    assert isinstance(short, Submit) and "ended after 40 s, under 120 s" in short.reason


def test_a_short_job_that_ran_to_its_sigterm_is_no_failure() -> None:
    # 2-minute jobs that left at their SIGTERM 90 s in (a soak's short wall time) ran their course:
    # no streak of them backs the site off; one that ended 40 s in did not.
    ran = [job(i, JobState.ENDED, T0 + 200 * i, T0 + 200 * i + 90, "COMPLETED", wall_s=120) for i in (1, 2, 3)]
    d = decide(T0 + 1000, "lumi", ran, 3, False, CONFIG)
    assert d == Submit("lumi", 4, None, "no job running or queued: its last job 3 (1003) ended (COMPLETED)")
    short = [*ran[:2], job(3, JobState.ENDED, T0 + 600, T0 + 640, "COMPLETED", wall_s=120)]
    d = decide(T0 + 1000, "lumi", short, 3, False, CONFIG)
    assert isinstance(d, Submit) and "ended after 40 s, under 60 s" in d.reason


def test_a_site_whose_jobs_keep_failing_is_backed_off_doubling_not_retried_in_a_loop() -> None:
    fails = [job(i, JobState.FAILED, T0 + 100 * i, T0 + 100 * i + 5, "FAILED") for i in (1, 2, 3)]
    end = fails[-1].end
    assert end is not None
    held = decide(end + 10, "lumi", fails, 3, False, CONFIG)
    assert isinstance(held, Hold) and "its last 3 jobs failed (1 FAILED, 2 FAILED, 3 FAILED)" in held.reason
    assert isinstance(decide(end + 600, "lumi", fails, 3, False, CONFIG), Submit)  # the pause is over
    fourth = [*fails, job(4, JobState.FAILED, end + 700, end + 705, "FAILED")]
    assert isinstance(decide(end + 705 + 1199, "lumi", fourth, 4, False, CONFIG), Hold)  # doubled: 1200 s
    assert isinstance(decide(end + 705 + 1200, "lumi", fourth, 4, False, CONFIG), Submit)
    many = [job(i, JobState.FAILED, T0, T0 + 1, "FAILED") for i in range(1, 20)]
    assert isinstance(decide(T0 + 1 + 3599, "lumi", many, 19, False, CONFIG), Hold)  # capped at an hour
    assert isinstance(decide(T0 + 1 + 3600, "lumi", many, 19, False, CONFIG), Submit)
    # A good job ends the streak.
    healed = [*fails, job(4, JobState.ENDED, end + 700, end + 4300, "TIMEOUT")]
    assert isinstance(decide(end + 4301, "lumi", healed, 4, False, CONFIG), Submit)


def test_bad_configs_are_refused() -> None:
    for bad in ({"max_failures": 0}, {"handover_s": -1}, {"backoff_s": (10.0, 5.0)}, {"backoff_s": (0.0, 5.0)}):
        with pytest.raises(ValueError):
            KeeperConfig(**bad)  # type: ignore[arg-type]
