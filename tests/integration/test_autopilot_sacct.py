"""`ops autopilot` reconciles with Slurm's accounting on start (ops/autopilot/history.py), against
the real local Slurm with a real slurmdbd and MariaDB (tests/integration/slurm_cluster.py,
`start(accounting=True)`): a loop whose state file is gone, at a site whose queue has forgotten the
run's ended jobs, still numbers its next job above all of them; without accounting it says once
that it goes on with squeue and the state file.

    .venv/bin/python -m pytest tests/integration/test_autopilot_sacct.py -v
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.autopilot.keeper import job_name, parse_job_name
from tests.integration import slurm_accounting
from tests.integration.peers import wait_for
from tests.integration.slurm_cluster import (  # noqa: F401
    SlurmCluster, skip_reason, slurm_fixture, slurm_session_fixture, start, stop
)

REPO = Path(__file__).resolve().parents[2]
RUN = "soak"
EARLIER = (1, 2, 5)
"""The sequence numbers of the run's earlier jobs at site b (a gap: a number is never refilled)."""


@pytest.fixture(scope="module", name="accounting")
def accounting_fixture() -> Iterator[SlurmCluster]:
    """A cluster of its own with slurmdbd, whose queue forgets an ended job within seconds
    (MinJobAge 2, the least Slurm advises)."""
    reason = skip_reason() or slurm_accounting.skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="sitemesh-slurm-acct-"))
    try:
        cluster = start(root, accounting=True, min_job_age_s=2)
        yield cluster
        cluster.clear()  # a job's slurmstepd outlives slurmd: cancelled, or it runs on after the cluster
    finally:
        stop(root)
        shutil.rmtree(root, ignore_errors=True)


def _run_file(tmp_path: Path, cluster: SlurmCluster) -> Path:
    """A run file with one job site, b: 1-node, 3-minute jobs of a peer that waits for SIGTERM."""
    peer = tmp_path / "fake-peer"
    peer.write_text("#!/bin/bash\ntrap 'exit 0' TERM\nwhile true; do sleep 0.2; done\n")
    peer.chmod(0o755)
    path = tmp_path / "run.toml"
    path.write_text(f"""[run]\nname = "{RUN}"\n[placement]\ntarget_tokens = 1e9\nlog = "placement.jsonl"
[sites.b]\ntokens_per_s = 1000.0\n[sites.b.slurm]\nnodes = 1\ntime = "3"\npartition = "debug"
command_prefix = {json.dumps(cluster.prefix)}\ntemplate = "{REPO / 'scripts/slurm/snellius-h100.sbatch'}"
peer_command = "{peer}"\nworkdir = "{tmp_path}"
""")
    return path


def _loop(config: Path, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "ops.cli", "autopilot", "--config", str(config), *extra]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split(" ", 2)[2] for line in done.stderr.splitlines()]


def _names(out: str) -> dict[int, str]:
    """seq -> state of site b's jobs of the run in `--parsable2` lines of JobName|State."""
    jobs = {}
    for line in out.splitlines():
        name, state = line.split("|")
        named = parse_job_name(name, RUN)
        if named is not None and named[0] == "b":
            jobs[named[1]] = state
    return jobs


def test_a_loop_without_its_state_file_numbers_above_the_jobs_squeue_forgot(accounting: SlurmCluster,
                                                                           tmp_path: Path) -> None:
    for seq in EARLIER:  # the run's earlier jobs, as an earlier loop submitted them
        accounting.sbatch(f"--job-name={job_name(RUN, 'b', seq)}", "--time=1", "--output=/dev/null", "--wrap=true")

    def accounted() -> dict[int, str]:
        return _names(accounting.run("sacct", "-X", "-n", "-P", "--starttime=2000-01-01", "-o", "JobName,State").stdout)

    def queued() -> dict[int, str]:
        return _names(accounting.run("squeue", "--states=all", "--noheader", "--format=%j|%T").stdout)

    wait_for(lambda: accounted() == {seq: "COMPLETED" for seq in EARLIER}, 60, "the accounting to hold the jobs ended")
    wait_for(lambda: not queued(), 90, "squeue to forget the ended jobs", interval_s=1.0)

    config = _run_file(tmp_path, accounting)  # and no state file: lost, or a second loop's elsewhere
    lines = _loop(config, "--once")
    assert ("reconciled b from sacct on the loop's first pass there: highest sequence 5 (state file had 0); "
            "3 ended job(s) entered") in lines, lines
    (submitted,) = [line for line in lines if line.startswith("b: submitted ")]
    assert submitted.startswith(f"b: submitted {job_name(RUN, 'b', 6)} as job "), lines
    assert list(queued()) == [6]

    state = json.loads(config.with_name(config.name + ".autopilot.json").read_text())
    assert state["seen"] == {"b": 6}
    jobs = {j["seq"]: j for j in state["jobs"]}  # the ended ones count in `ops report --autopilot-state`
    assert sorted(jobs) == [*EARLIER, 6]
    for seq in EARLIER:
        assert (jobs[seq]["state"], jobs[seq]["slurm_state"], jobs[seq]["nodes"]) == ("ended", "COMPLETED", 1)
        assert jobs[seq]["start"] <= jobs[seq]["end"]


def test_without_accounting_the_loop_says_once_that_it_goes_on_without(slurm: SlurmCluster, tmp_path: Path) -> None:
    config = _run_file(tmp_path, slurm)
    loop = subprocess.Popen([sys.executable, "-m", "ops.cli", "autopilot", "--config", str(config), "--interval",
                             "0.5"], stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert loop.stderr is not None
    lines: list[str] = []
    other: list[str] = []
    """What the loop's stderr carried that is not a log line (a command's own error output, a Python
    warning): a fresh clone's test command failed here twice, right after set-up, while the tests
    alone passed; such a line is kept apart and shown, and the checks below do not count on order."""
    try:
        while sum(line.startswith("b: ") for line in lines) < 3:  # three passes: a submission, two holds
            line = loop.stderr.readline()
            assert line, f"the loop exited: {lines} {other}"
            logged = re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ (.*)", line.rstrip("\n"))
            if logged:
                lines.append(logged.group(1))
            else:
                other.append(line.rstrip("\n"))
    finally:
        loop.send_signal(signal.SIGINT)
        loop.wait(30)
    fallback = [line for line in lines if line.startswith("no Slurm accounting at b")]
    assert fallback == ["no Slurm accounting at b (sacct: Slurm accounting storage is disabled): its job numbers "
                        "come from squeue and the state file only, so a lost state file can reuse the number of a "
                        "job squeue forgot"], (lines, other)
    submitted = [line for line in lines if line.startswith("b: submitted ")]
    assert submitted and submitted[0].startswith(f"b: submitted {job_name(RUN, 'b', 1)} as job "), (lines, other)
