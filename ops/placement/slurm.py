"""The per-site Slurm adaptor: `sbatch --test-only` probes, submission and real start times.

    python -c "from ops.placement.slurm import SlurmSite; from ops.placement.config import JobShape; \
print(SlurmSite(()).test_only(JobShape(nodes=1, time_s=600), job_name='probe'))"

A probe is `sbatch --test-only` with the job shape: Slurm's scheduler answers when and where the
job would start ("sbatch: Job 1 to start at 2026-11-30T05:06:05 using 1 processors on nodes vm in
partition debug", on stderr) and submits nothing. It needs no privileges, so it works from any
login node. Every command runs either here or through the site's command prefix (e.g.
`ssh lumi-uan01`), which must run its last argument as a shell command line. Each command runs
under `env TZ=UTC SLURM_TIME_FORMAT=standard` so the times Slurm prints are UTC ISO timestamps,
whatever the cluster's local time zone or the user's own time format.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from ops.placement.config import JobShape

# The script a plain probe asks about; a probe never runs anything, but sbatch wants a script.
PROBE_SCRIPT = "#!/bin/sh\ntrue\n"

_TEST_ONLY_RE = re.compile(
    r"Job (?P<job>\d+) to start at (?P<start>\S+) using (?P<procs>\d+) processors on nodes? "
    r"(?P<nodes>\S+) in partition (?P<partition>\S+)"
)
_SLURM_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
# Job states in which a job surely has (or had) a real start time; PENDING's %S is only an
# estimate. CANCELLED and DEADLINE are left out: Slurm also gives them when a job never ran, with
# the cancel time as "start", which would poison the calibration.
_STARTED_STATES = {
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "SUSPENDED",
    "OUT_OF_MEMORY",
    "STOPPED",
}


class SlurmError(RuntimeError):
    """sbatch/squeue missing, refused, timed out or answered something we cannot parse.

    The message holds the command and Slurm's raw output, so a user can see what the cluster said.
    """


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def parse_slurm_timestamp(text: str) -> datetime:
    """A Slurm timestamp printed under TZ=UTC, SLURM_TIME_FORMAT=standard."""
    return datetime.strptime(text, _SLURM_TIME_FORMAT).replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class TestOnlyAnswer:
    """What `sbatch --test-only` printed, parsed."""

    __test__ = False  # not a pytest test class despite the name

    start: datetime
    """Predicted start, UTC."""
    processors: int
    nodelist: str
    """Slurm hostlist expression of the predicted nodes, e.g. nid[005001-005016]."""
    partition: str


def parse_test_only(text: str) -> TestOnlyAnswer:
    """Parses the answer of `sbatch --test-only`; SlurmError with the raw text if there is none."""
    m = _TEST_ONLY_RE.search(text)
    if not m:
        raise SlurmError(f"cannot find a predicted start in the sbatch --test-only output:\n{text.strip()}")
    try:
        start = parse_slurm_timestamp(m.group("start"))
    except ValueError as err:
        raise SlurmError(f"unparseable start time {m.group('start')!r} in:\n{text.strip()}") from err
    return TestOnlyAnswer(
        start=start,
        processors=int(m.group("procs")),
        nodelist=m.group("nodes"),
        partition=m.group("partition"),
    )


@dataclass(frozen=True)
class Prediction:
    """One probe: when Slurm says a job of `shape` at `site` would start, asked at `probed_at`."""

    site: str
    shape: JobShape
    probed_at: datetime
    answer: TestOnlyAnswer

    @property
    def wait_s(self) -> float:
        """Predicted queue wait; never negative (a free node answers with the current second)."""
        return max(0.0, (self.answer.start - self.probed_at).total_seconds())


@dataclass(frozen=True)
class JobStart:
    """Where a submitted job stands: its state and its start time."""

    job_id: str
    state: str
    start: datetime | None
    """The real start once `started`; before that Slurm's current estimate (None if it has none)."""
    started: bool

    @property
    def active(self) -> bool:
        """Pending or running: the site already has this allocation coming or in hand."""
        return self.state in ("PENDING", "CONFIGURING", "RUNNING")


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class SlurmSite:
    """Runs Slurm's client commands for one site, here or through its command prefix."""

    def __init__(
        self,
        command_prefix: Sequence[str] = (),
        timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.command_prefix = tuple(command_prefix)
        self.timeout_s = timeout_s
        self.env = dict(env) if env is not None else None
        self.clock = clock

    def command(self, argv: Sequence[str]) -> list[str]:
        """The full command line for a Slurm client `argv` at this site."""
        inner = ["env", "TZ=UTC", "SLURM_TIME_FORMAT=standard", *argv]
        if not self.command_prefix:
            return inner
        return [*self.command_prefix, shlex.join(inner)]

    def run(
        self, argv: Sequence[str], stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Runs `argv`; SlurmError (with the raw output) if it cannot run, times out or fails
        (`check` False: a non-zero exit is returned, for a caller that tells its kinds apart)."""
        cmd = self.command(argv)
        shown = shlex.join(cmd)
        try:
            proc = subprocess.run(
                cmd,
                input=stdin,
                check=False,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=self.env,
            )
        except FileNotFoundError as err:
            raise SlurmError(f"cannot run {shown}: {err.strerror}: {err.filename}") from err
        except subprocess.TimeoutExpired as err:
            raise SlurmError(f"{shown} did not answer within {self.timeout_s:g} s") from err
        if proc.returncode != 0 and check:
            raw = (proc.stdout + proc.stderr).strip() or "(no output)"
            hint = f"{argv[0]} is not installed there (exit 127)" if proc.returncode == 127 else ""
            raise SlurmError(
                f"{shown} failed with exit {proc.returncode}{': ' + hint if hint else ''}\n{raw}"
            )
        return proc

    def test_only(
        self, shape: JobShape, job_name: str, script: str = PROBE_SCRIPT, site: str = ""
    ) -> Prediction:
        """Asks Slurm when a job of `shape` would start; submits nothing."""
        probed_at = self.clock()
        proc = self.run(
            ["sbatch", "--test-only", f"--job-name={job_name}", *shape.sbatch_args()], stdin=script
        )
        return Prediction(
            site=site, shape=shape, probed_at=probed_at, answer=parse_test_only(proc.stderr + proc.stdout)
        )

    def submit(self, shape: JobShape, job_name: str, script: str, extra: Sequence[str] = ()) -> str:
        """Submits `script` (sent on stdin) with `shape` and `extra` sbatch options; returns the job id."""
        proc = self.run(
            ["sbatch", "--parsable", f"--job-name={job_name}", *shape.sbatch_args(), *extra], stdin=script
        )
        # --parsable prints "jobid" or "jobid;cluster"; anything else on stdout is not an id.
        first = proc.stdout.strip().split(";")[0]
        if not first.isdigit():
            raise SlurmError(f"sbatch --parsable answered no job id:\n{(proc.stdout + proc.stderr).strip()}")
        return first

    def job_starts(self, job_ids: Sequence[str]) -> dict[str, JobStart]:
        """States and real start times of `job_ids` that Slurm still knows (others are absent)."""
        if not job_ids:
            return {}
        argv = ["squeue", "--states=all", "--noheader", "--format=%i|%T|%S", f"--jobs={','.join(job_ids)}"]
        try:
            proc = self.run(argv)
        except SlurmError as err:
            # squeue refuses a list in which no job is known any more (aged out of slurmctld).
            if "Invalid job id" in str(err):
                return {}
            raise
        out: dict[str, JobStart] = {}
        for line in proc.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 3:
                raise SlurmError(f"unexpected squeue line {line!r} in:\n{proc.stdout.strip()}")
            job_id, state, start = parts
            when = parse_slurm_timestamp(start) if start not in ("N/A", "", "Unknown") else None
            out[job_id] = JobStart(job_id=job_id, state=state, start=when, started=state in _STARTED_STATES)
        return out
