"""Queue-model simulator: time-to-target of wait-for-all, start-with-any and queue-aware placement.

    scripts/queue_model                       # the three-site preset, 400 seeded trials
    scripts/queue_model --load-scale 2 --json
    ops simulate-queue --trials 100 --seed 7

The model (docs/placement.md has the parameters and why):
- Each site has job shapes (node counts). Every submission of a shape waits in the queue for a
  draw from that shape's wait distribution (log-normal with a median and a sigma, or a recorded
  trace sampled with replacement), then runs for the site's wall-time at tokens/s proportional to
  its nodes, then the site resubmits. Draws are keyed by (seed, site, submission, shape), so every
  policy meets the same queue (common random numbers): differences come from the policy alone.
- gang: every site submits its configured shape; tokens count only while all sites run at once
  (a synchronous run that stops whenever one site's job ends; shown for reference).
- wait-for-all: the same submissions; the run starts once every site is allocated at the same
  time and then goes on elastically (the paper's baseline: "waiting for all sites to be allocated").
- start-with-any: same submissions; tokens count whenever any site runs (sitemesh's elastic rule),
  but nobody looks at the queue.
- queue-aware: before each submission the site probes every shape; a probe reports the real wait
  times a log-normal error (`prediction_sigma`, what is left after calibration) and the planner of
  `ops place` (ops/placement/plan.py) picks the shapes; a site whose predicted start comes after
  the predicted finish is not submitted.
The last line printed is `reduction_vs_wait_for_all=<percent>`: 1 - mean(queue-aware) /
mean(wait-for-all) over the trials.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ops.placement.config import JobShape
from ops.placement.plan import Option, make_plan
from ops.placement.timeline import Counting, Segment, time_to_target, tokens_until

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 sites only
    import tomli as tomllib

HOUR = 3600.0
_MAX_SUBMISSIONS = 2000  # per site and trial; beyond this the target counts as never reached


@dataclass(frozen=True)
class ShapeQueue:
    """One job shape of a site and how long its submissions wait."""

    nodes: int
    wait_median_h: float
    """Median queue wait of this shape, hours."""
    wait_sigma: float = 1.0
    """Log-normal sigma of the wait: 1.0 means a quarter of the waits are over 2x the median."""
    trace_h: tuple[float, ...] = ()
    """Recorded waits (hours) sampled with replacement instead of the log-normal, when given."""

    def __post_init__(self) -> None:
        if (
            self.nodes < 1
            or self.wait_median_h < 0
            or self.wait_sigma < 0
            or any(w < 0 for w in self.trace_h)
        ):
            raise ValueError(f"shape queue {self}: nodes >= 1 and waits, sigma >= 0 required")

    def draw_h(self, rng: random.Random) -> float:
        if self.trace_h:
            return rng.choice(self.trace_h)
        return self.wait_median_h * math.exp(rng.gauss(0.0, self.wait_sigma))


@dataclass(frozen=True)
class SiteModel:
    name: str
    tokens_per_s: float
    """Throughput of `default_nodes`; other shapes scale linearly with their nodes."""
    default_nodes: int
    """The shape naive submission asks for (must be one of `shapes`)."""
    walltime_h: float
    shapes: tuple[ShapeQueue, ...]

    def __post_init__(self) -> None:
        if self.tokens_per_s <= 0 or self.walltime_h <= 0:
            raise ValueError(f"site {self.name}: tokens_per_s and walltime_h must be > 0")
        # The baselines ask for the configured shape; queue-aware may ask for smaller ones only, so
        # any gain comes from reading the queue, not from burning more nodes.
        if self.default_nodes != max(s.nodes for s in self.shapes):
            raise ValueError(
                f"site {self.name}: default_nodes {self.default_nodes} must be its largest shape"
            )

    @property
    def default_index(self) -> int:
        return [s.nodes for s in self.shapes].index(self.default_nodes)

    def job_shape(self, index: int) -> JobShape:
        return JobShape(nodes=self.shapes[index].nodes, time_s=round(self.walltime_h * HOUR))

    def rate(self, index: int) -> float:
        return self.tokens_per_s * self.shapes[index].nodes / self.default_nodes


@dataclass(frozen=True)
class Scenario:
    sites: tuple[SiteModel, ...]
    target_tokens: float
    prediction_sigma: float = 0.5
    """Log-normal error of a calibrated probe: 0.5 means predictions are within 0.6x-1.6x of the
    real wait two times in three."""

    def __post_init__(self) -> None:
        if not self.sites or self.target_tokens <= 0 or self.prediction_sigma < 0:
            raise ValueError("a scenario needs sites, target_tokens > 0 and prediction_sigma >= 0")

    @staticmethod
    def three_sites() -> Scenario:
        """Snellius (H100), LUMI and Frontier (MI250X) with the queues described in docs/placement.md."""
        return Scenario(
            sites=(
                # Snellius gpu_h100: 4 H100/node; modest queue, 24 h jobs (120 h allowed, 24 h is
                # what a typical project asks); small shapes backfill quickly.
                SiteModel(
                    "snellius",
                    640_000.0,
                    4,
                    24.0,
                    (ShapeQueue(1, 0.25), ShapeQueue(2, 0.5), ShapeQueue(4, 2.0)),
                ),
                # LUMI standard-g: 48 h limit, a busy machine: a few hours for 8 nodes.
                SiteModel(
                    "lumi", 768_000.0, 8, 48.0, (ShapeQueue(2, 0.5), ShapeQueue(4, 1.5), ShapeQueue(8, 4.0))
                ),
                # Frontier batch, 1-91 node bin: 2 h limit and low priority for small jobs, so
                # each 2 h job waits about as long as it runs; fewer nodes backfill sooner.
                SiteModel(
                    "frontier",
                    768_000.0,
                    8,
                    2.0,
                    (ShapeQueue(2, 0.5), ShapeQueue(4, 1.0), ShapeQueue(8, 2.0)),
                ),
            ),
            # Full pool (2.18 M tokens/s) needs ~19 h: the length of the paper's 23.8 h run.
            target_tokens=1.5e11,
        )

    def scaled(self, load: float) -> Scenario:
        """Every queue wait multiplied by `load` (2 = twice as busy)."""
        if load < 0:
            raise ValueError(f"load scale must be >= 0, got {load}")
        return replace(
            self,
            sites=tuple(
                replace(
                    site,
                    shapes=tuple(
                        replace(
                            q,
                            wait_median_h=q.wait_median_h * load,
                            trace_h=tuple(w * load for w in q.trace_h),
                        )
                        for q in site.shapes
                    ),
                )
                for site in self.sites
            ),
        )


class Queue:
    """The queue of one trial: true and predicted waits, keyed so every policy sees the same."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed

    def wait_s(self, site: int, submission: int, shape: int) -> float:
        rng = random.Random(f"wait/{self.seed}/{site}/{submission}/{shape}")
        return self.scenario.sites[site].shapes[shape].draw_h(rng) * HOUR

    def predicted_wait_s(self, site: int, submission: int, shape: int) -> float:
        rng = random.Random(f"probe/{self.seed}/{site}/{submission}/{shape}")
        return self.wait_s(site, submission, shape) * math.exp(rng.gauss(0.0, self.scenario.prediction_sigma))


@dataclass
class Trial:
    """What one simulated run has done so far (mutable: the simulation advances it)."""

    queue: Queue
    segments: list[list[Segment]]
    """Each site's allocations so far, the last one possibly still in the future."""
    submissions: list[int]
    """Submissions made per site (the key of the next queue draw)."""
    shapes: list[int | None]
    """Shape index of each site's last submission (None: never submitted)."""
    nodes: list[list[int]]
    """Nodes of each segment in `segments` (for the node-hours a policy burns)."""
    believed_start: list[float]
    """When the probe said each site's last submission would start: what a planner knows of a job
    still pending (the true start stays hidden until it happens)."""

    def node_hours(self, until_s: float) -> float:
        return sum(
            n * max(0.0, min(until_s, seg.end_s) - seg.start_s) / HOUR
            for segs, nodes in zip(self.segments, self.nodes)
            for seg, n in zip(segs, nodes)
        )


# A policy picks, at time `now`, a shape index for each deciding site (None: do not submit).
Chooser = Callable[[Trial, float, Sequence[int]], dict[int, "int | None"]]


def naive(trial: Trial, now: float, deciding: Sequence[int]) -> dict[int, int | None]:
    """Every site asks for its configured shape, always."""
    return {i: trial.queue.scenario.sites[i].default_index for i in deciding}


def queue_aware(trial: Trial, now: float, deciding: Sequence[int]) -> dict[int, int | None]:
    """The planner of `ops place` over probed predictions; sites not deciding are held fixed."""
    queue, sc = trial.queue, trial.queue.scenario
    done = sum(tokens_until(s, now) for s in trial.segments)
    candidates: dict[str, list[Option]] = {}
    for i, site in enumerate(sc.sites):
        subs = trial.submissions[i]
        if i in deciding:
            candidates[site.name] = [
                Option(site.name, site.job_shape(j), w, site.rate(j), w)
                for j in range(len(site.shapes))
                for w in [queue.predicted_wait_s(i, subs, j)]
            ]
        elif (j := trial.shapes[i]) is not None and trial.segments[i][-1].end_s > now:
            # Running (its start is known) or pending (only the predicted start is); afterwards it
            # resubmits, and the planner expects the wait a probe of its shape predicts now.
            last = trial.segments[i][-1]
            start = last.start_s if last.start_s <= now else trial.believed_start[i]
            candidates[site.name] = [
                Option(
                    site.name,
                    site.job_shape(j),
                    max(0.0, start - now),
                    last.tokens_per_s,
                    queue.predicted_wait_s(i, subs, j),
                    max(0.0, start - now) + site.walltime_h * HOUR,
                )
            ]
    plan = make_plan(candidates, {n: o[0] for n, o in candidates.items()}, sc.target_tokens - done)
    names = [s.name for s in sc.sites]
    out: dict[int, int | None] = {}
    for d in plan.decisions:
        i = names.index(d.site)
        if i in deciding:
            chosen = d.option.shape.nodes if d.submit and d.option else None
            out[i] = None if chosen is None else [q.nodes for q in sc.sites[i].shapes].index(chosen)
    return out


def simulate(scenario: Scenario, seed: int, choose: Chooser, counting: Counting) -> tuple[float, float]:
    """One trial: sites submit at 0 and resubmit when each job ends. Returns the time-to-target
    (s) and the node-hours allocated until then (idle waiting for others included)."""
    n = len(scenario.sites)
    trial = Trial(
        Queue(scenario, seed), [[] for _ in range(n)], [0] * n, [None] * n, [[] for _ in range(n)], [0.0] * n
    )
    events: list[tuple[float, int]] = []

    def submit(now: float, deciding: Sequence[int]) -> None:
        for i, j in choose(trial, now, deciding).items():
            if j is None:
                continue  # not asked: this site takes no further part
            site = scenario.sites[i]
            start = now + trial.queue.wait_s(i, trial.submissions[i], j)
            trial.believed_start[i] = now + trial.queue.predicted_wait_s(i, trial.submissions[i], j)
            trial.segments[i].append(Segment(start, start + site.walltime_h * HOUR, site.rate(j)))
            trial.nodes[i].append(site.shapes[j].nodes)
            trial.submissions[i] += 1
            trial.shapes[i] = j
            heapq.heappush(events, (trial.segments[i][-1].end_s, i))

    submit(0.0, range(n))
    while True:
        # Every future segment starts after the next event, so a target reached before it is final.
        ttt = time_to_target(trial.segments, scenario.target_tokens, counting)
        if not events or ttt <= events[0][0]:
            return ttt, trial.node_hours(ttt)
        now, i = heapq.heappop(events)
        if trial.submissions[i] >= _MAX_SUBMISSIONS:
            return math.inf, math.inf
        submit(now, [i])


POLICIES: dict[str, tuple[Chooser, Counting]] = {
    "gang": (naive, Counting.GANG),
    "wait-for-all": (naive, Counting.AFTER_ALL),
    "start-with-any": (naive, Counting.ELASTIC),
    "queue-aware": (queue_aware, Counting.ELASTIC),
}


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    hours: tuple[float, ...]
    """Time-to-target of each trial, hours (inf: not reached)."""
    node_hours: tuple[float, ...]
    """Node-hours allocated until the target in each trial."""

    @property
    def mean_h(self) -> float:
        return statistics.fmean(self.hours)

    def quantile_h(self, q: float) -> float:
        ordered = sorted(self.hours)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(scenario: Scenario, trials: int, seed: int) -> list[PolicyResult]:
    out = []
    for name, (choose, counting) in POLICIES.items():
        runs = [simulate(scenario, seed + t, choose, counting) for t in range(trials)]
        out.append(PolicyResult(name, tuple(s / HOUR for s, _ in runs), tuple(nh for _, nh in runs)))
    return out


def reduction(results: Sequence[PolicyResult], policy: str = "queue-aware") -> float:
    """1 - mean(policy) / mean(wait-for-all), in percent."""
    by = {r.policy: r for r in results}
    return 100.0 * (1.0 - by[policy].mean_h / by["wait-for-all"].mean_h)


def load_scenario(path: Path) -> Scenario:
    """A scenario from TOML: target_tokens, prediction_sigma, and [[sites]] with [[sites.shapes]]."""
    doc = tomllib.loads(path.read_text())
    try:
        sites = tuple(
            SiteModel(
                s["name"],
                float(s["tokens_per_s"]),
                int(s["default_nodes"]),
                float(s["walltime_h"]),
                tuple(
                    ShapeQueue(
                        int(q["nodes"]),
                        float(q.get("wait_median_h", 0.0)),
                        float(q.get("wait_sigma", 1.0)),
                        tuple(q.get("trace_h", ())),
                    )
                    for q in s["shapes"]
                ),
            )
            for s in doc["sites"]
        )
        return Scenario(sites, float(doc["target_tokens"]), float(doc.get("prediction_sigma", 0.5)))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: not a queue-model scenario: {err!r}") from err


def _table(results: Sequence[PolicyResult]) -> str:
    lines = [
        f"{'policy':<16}{'mean_h':>9}{'p10_h':>9}{'p50_h':>9}{'p90_h':>9}{'node_h':>9}{'vs_wait_for_all':>17}"
    ]
    for r in results:
        change = 0.0 - reduction(results, r.policy)  # 0.0 - x: no "-0.0" for the baseline itself
        lines.append(
            f"{r.policy:<16}{r.mean_h:>9.2f}{r.quantile_h(0.1):>9.2f}{r.quantile_h(0.5):>9.2f}"
            f"{r.quantile_h(0.9):>9.2f}{statistics.fmean(r.node_hours):>9.0f}{change:>+16.1f}%"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=400, help="seeded trials per policy (default 400)")
    p.add_argument("--seed", type=int, default=0, help="first trial's seed; trial t uses seed + t")
    p.add_argument(
        "--load-scale", type=float, default=1.0, help="multiply every queue wait (2 = twice as busy)"
    )
    p.add_argument("--scenario", type=Path, help="a scenario TOML (default: the three-site preset)")
    p.add_argument(
        "--prediction-sigma",
        type=float,
        help="log-normal error of calibrated probes (default: the scenario's)",
    )
    p.add_argument("--json", action="store_true", help="per-policy statistics as JSON (before the last line)")


def main_args(args: argparse.Namespace) -> int:
    if args.trials < 1:
        print("error: --trials must be >= 1", file=sys.stderr)
        return 2
    try:
        base = load_scenario(args.scenario) if args.scenario else Scenario.three_sites()
        scenario = base.scaled(args.load_scale)
        if args.prediction_sigma is not None:
            scenario = replace(scenario, prediction_sigma=args.prediction_sigma)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = run(scenario, args.trials, args.seed)
    if args.json:
        print(
            json.dumps(
                {
                    "trials": args.trials,
                    "seed": args.seed,
                    "load_scale": args.load_scale,
                    "target_tokens": scenario.target_tokens,
                    "prediction_sigma": scenario.prediction_sigma,
                    "policies": {
                        r.policy: {
                            "mean_h": r.mean_h,
                            "p10_h": r.quantile_h(0.1),
                            "p50_h": r.quantile_h(0.5),
                            "p90_h": r.quantile_h(0.9),
                            "mean_node_h": statistics.fmean(r.node_hours),
                            "reduction_vs_wait_for_all": reduction(results, r.policy),
                        }
                        for r in results
                    },
                },
                indent=2,
                sort_keys=True,
            )
        )
    else:
        print(
            f"queue model: {len(scenario.sites)} sites, target {scenario.target_tokens:.3g} tokens, "
            f"{args.trials} trials from seed {args.seed}, load x{args.load_scale:g}"
        )
        print(_table(results))
    print(f"reduction_vs_wait_for_all={reduction(results):.1f}")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("simulate-queue", help="compare placement policies in the queue model")
    add_arguments(p)
    p.set_defaults(func=main_args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="queue_model", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return main_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
