"""The chaos soak's core: three sites kept going by `ops autopilot` while faults hit the jobs' peers,
and what the run kept. scripts/soak runs it as long as you like, tests/integration/test_soak_slice.py
for CI's few minutes.

The mesh (tests/integration/autopilot_mesh.py): site `a`, a plain process, and sites `b` and `c`,
which live only in 2-minute jobs of the real Slurm the tests start (autopilot_mesh.SHORT). After `first_fault_s`, every
`fault_every_s` on average (exponential gaps from one fault's start to the next), one fault
(tests/integration/soak_faults.py) hits the peer of a running job chosen at random. The kinds come
from a shuffled deck, so each comes up once in every len(kinds) faults; the seed fixes the kinds
and the times, the targets depend on which jobs run then. A fault that would outlast the run is
not begun.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.autopilot_mesh import SHORT, AutopilotMesh, Allocation, train_args
from tests.integration.slurm_cluster import SlurmCluster
from tests.integration.soak_faults import KINDS, FaultConfig, cut_unavailable, hit, listening_ports

SITES = ("b", "c")
"""The job sites; with `a` the run has three, as three facilities would."""
VOTERS = ("coordinator",)
"""A trainer-less direct site (README, week-long run, step 1): with a, two voters outside the batch
queues, so a cut or stop of the one job voter a handover left never takes the majority with it (an
hour with a alone: a 26.5 s stall, a and b.j66 the only voters and b.j66 cut for 20 s)."""
ROUND_DEADLINE_S = 20.0
"""A round waits at most this long for a hit peer (the tests' default is 60 s): short, so faults cost little."""
DOCUMENTS = 24
"""Documents of each shard the sites train on: about 7 blocks of 64 samples an epoch, so each of the
five or so members (a, and two jobs each of b and c while they hand over) can hold one. With the
harness's default 8 an epoch has 3 blocks: in a 60-minute soak one or two members trained in 704
of 814 rounds, 40 were empty, and jobs trained a median 8 s of their 120."""
DEADLINE_K = 4.0
"""`--round-deadline-k`: a round waits for a late site only as long as the sites' recent pace says
(median + 4 MAD of their report delays, + 2 s), so a slowed or stopped site costs a round a few
seconds, not ROUND_DEADLINE_S (0: the fixed deadline)."""


def start_mesh(workdir: Path, slurm: SlurmCluster, alloc: Allocation = SHORT,
               deadline_k: float = DEADLINE_K, budget_s: float = 0.0, documents: int = DOCUMENTS,
               preset: str = "lan") -> AutopilotMesh:
    """The soak's mesh as the README's week-long recipe builds a run: site a, a trainer-less
    long-lived voter (`coordinator`), the job sites (2-minute jobs unless `alloc` says otherwise)
    and the loop; `budget_s` > 0: time-boxed rounds; `documents` per shard (more: longer data
    epochs); `preset`: the peers' membership and election timings."""
    train = train_args(docs=documents, round_deadline=ROUND_DEADLINE_S, deadline_k=deadline_k, budget_s=budget_s)
    return AutopilotMesh.start(workdir, slurm, alloc, train=train, sites=SITES, preset=preset, voters=VOTERS)


@dataclass(frozen=True)
class SoakPlan:
    minutes: float
    """How long the run goes on (faults, then the loop is stopped and the run read)."""
    fault_every_s: float = 90.0
    """Mean seconds between faults; 0: no faults."""
    first_fault_s: float = 60.0
    """No fault before: the first jobs start, join and commit rounds."""
    kinds: tuple[str, ...] = KINDS
    faults: FaultConfig = field(default_factory=FaultConfig)
    seed: int = 1

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(KINDS))
        if unknown or not self.kinds:
            raise ValueError(f"fault kinds {unknown or 'none'}: they are {', '.join(KINDS)}")
        if self.minutes <= 0 or self.fault_every_s < 0 or self.first_fault_s < 0:
            raise ValueError(f"minutes must be > 0, fault_every_s and first_fault_s >= 0: {self}")


@dataclass(frozen=True)
class SoakResult:
    rounds: int
    """Rounds in a's commit log."""
    jobs_run: dict[str, int]
    """Per job site, its jobs that started."""
    handed: dict[str, list[int]]
    """Per job site, every N whose job N handed the site over (AutopilotMesh.handovers)."""
    rounds_lost: int
    dup: int
    lost: int
    epochs: int
    """Data epochs that ended, audited."""
    max_stall_s: float
    round_s: float
    """The median time between two committed rounds: what a stall is measured in."""
    theta_identical: bool
    goodput: float | None
    job_fixed_s: float | None
    faults: list[str]

    @property
    def boundaries(self) -> int:
        return sum(len(n) for n in self.handed.values())

    def report(self) -> list[str]:
        """The lines the soak ends with; the last is the documented one scripts read."""
        def num(x: float | None, digits: int) -> str:
            return "n/a" if x is None else f"{x:.{digits}f}"

        return [
            f"faults: {len(self.faults)}; rounds committed: {self.rounds}; epochs audited: {self.epochs}",
            *(f"site {s}: {self.jobs_run[s]} jobs run, {len(n)} boundaries (jobs {n} handed over)"
              for s, n in self.handed.items()),
            f"theta_identical={'yes' if self.theta_identical else 'no'}",
            f"a round every {self.round_s:.1f} s (median): the longest stall is "
            f"{self.max_stall_s / self.round_s if self.round_s else 0:.1f} rounds' time",
            f"boundaries={self.boundaries} rounds_lost={self.rounds_lost} dup={self.dup} lost={self.lost} "
            f"max_stall_s={self.max_stall_s:.1f} goodput={num(self.goodput, 3)} job_fixed_s={num(self.job_fixed_s, 1)}",
        ]


def soak(mesh: AutopilotMesh, plan: SoakPlan, say: Callable[[str], None] = print) -> SoakResult:
    """Runs the plan on `mesh` (started by start_mesh), stops its loop and reads what the run kept."""
    kinds = plan.kinds
    if "cut" in kinds and (reason := cut_unavailable()):
        say(f"soak: {reason}: leaving `cut` out")
        kinds = tuple(k for k in kinds if k != "cut")
    timing = random.Random(plan.seed)  # the kinds and times: the same for a seed whatever runs
    aim = random.Random(f"{plan.seed}:targets")
    deck: list[str] = []
    faults: list[str] = []
    handed: dict[str, set[int]] = {s: set() for s in mesh.sites}
    start = time.monotonic()
    end = start + plan.minutes * 60
    next_at = start + plan.first_fault_s + _gap(timing, plan)
    while (now := time.monotonic()) < end:
        time.sleep(min(5.0, end - now))
        _keep_handovers(mesh, handed)
        if not kinds or time.monotonic() < next_at:
            continue
        deck = deck or timing.sample(kinds, len(kinds))
        kind = deck.pop()
        next_at = time.monotonic() + _gap(timing, plan)
        if time.monotonic() + plan.faults.duration_s(kind) < end:
            faults.append(f"{time.strftime('%H:%M:%S')} fault: {_strike(mesh, kind, aim, plan.faults)}")
            say(faults[-1])
    mesh.stop_loop()
    _keep_handovers(mesh, handed)
    epochs = [e for e in mesh.audit() if e["ended"]]
    totals = mesh.accounting()
    return SoakResult(
        rounds=len(mesh.commits()), jobs_run={s: mesh.jobs_run(s) for s in mesh.sites},
        handed={s: sorted(n) for s, n in handed.items()}, rounds_lost=mesh.rounds_lost(),
        dup=sum(e["duplicated"] for e in epochs), lost=sum(e["lost"] for e in epochs), epochs=len(epochs),
        max_stall_s=mesh.max_stall_s(), round_s=statistics.median(mesh.round_gaps() or [0.0]),
        theta_identical=not mesh.theta_splits(),
        goodput=None if totals is None else totals.goodput, job_fixed_s=None if totals is None else totals.fixed_s,
        faults=faults)


def _gap(timing: random.Random, plan: SoakPlan) -> float:
    return timing.expovariate(1 / plan.fault_every_s) if plan.fault_every_s else float("inf")


def _keep_handovers(mesh: AutopilotMesh, handed: dict[str, set[int]]) -> None:
    """Ended jobs leave squeue after MinJobAge (10 minutes): keep every handover once seen."""
    for site in mesh.sites:
        handed[site] |= set(mesh.handovers(site))


def _strike(mesh: AutopilotMesh, kind: str, aim: random.Random, config: FaultConfig) -> str:
    targets = [(j, pid) for j in mesh.running() if (pid := mesh.peer_pid(j)) is not None]
    if kind == "cut":  # a peer still starting listens nowhere yet: cutting it would do nothing
        targets = [(j, pid) for j, pid in targets if listening_ports(pid)]
    if not targets:
        return f"{kind}: no running job's peer to hit"
    job, pid = aim.choice(targets)
    return hit(kind, job, pid, config)
