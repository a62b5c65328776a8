"""The job's start and end where Slurm (before 23.02) does not export them (peer/slurm_env.py)."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest

from peer import slurm_env
from peer.slurm_env import END, START


def _at(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).timestamp())


def test_a_job_without_the_times_learns_them_from_squeue() -> None:
    env = {"SLURM_JOB_ID": "17"}
    asked: list[str] = []

    def ask(job: str) -> str:
        asked.append(job)
        return "2026-12-06T22:04:01|2026-12-06T22:06:01"

    assert slurm_env.complete(env, ask) is None
    assert asked == ["17"]
    assert (int(env[START]), int(env[END])) == (_at("2026-12-06T22:04:01"), _at("2026-12-06T22:06:01"))
    assert int(env[END]) - int(env[START]) == 120


def test_nothing_is_asked_outside_slurm_or_where_slurm_says_itself() -> None:
    def ask(job: str) -> str:
        raise AssertionError("squeue asked")

    outside: dict[str, str] = {}
    assert slurm_env.complete(outside, ask) is None and outside == {}
    told = {"SLURM_JOB_ID": "3", START: "100", END: "200"}
    assert slurm_env.complete(told, ask) is None and (told[START], told[END]) == ("100", "200")


@pytest.mark.parametrize("answer", ["N/A|N/A", "2026-12-06T22:04:01", "", "soon|later",
                                    "2026-12-06T22:04:01|2026-12-06T22:06:01\n2026-12-06T22:04:01|2026-12-06T22:06:01"])
def test_an_answer_that_is_not_one_start_and_end_leaves_the_env_alone(answer: str) -> None:
    env = {"SLURM_JOB_ID": "9"}
    line = slurm_env.complete(env, lambda job: answer)
    assert line is not None and "Slurm job 9" in line and "leaves only at Slurm's signal" in line
    assert env == {"SLURM_JOB_ID": "9"}


def test_a_failing_squeue_is_said_not_raised() -> None:
    def ask(job: str) -> str:
        raise subprocess.CalledProcessError(1, ["squeue"], stderr="slurm_load_jobs error: Invalid job id")

    line = slurm_env.complete({"SLURM_JOB_ID": "9"}, ask)
    assert line is not None and "squeue did not give them" in line
