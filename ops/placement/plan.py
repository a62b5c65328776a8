"""The placement planner: which sites to ask for which job shape, minimising time-to-target.

    ops place --config examples/run.toml

Input per site: candidate options (a job shape, its calibrated predicted start from a probe, its
throughput and wall-time) and the default option (the configured shape). The model is the elastic
rule of sitemesh: training starts as soon as one site runs and every running site adds its
tokens/s; a site resubmits when its wall-time ends and waits as long again as its probe predicted.
The planner tries every combination of options (a few sites with a few shapes each: tens to
hundreds of combinations) and keeps the one that reaches the target first; among combinations
within 0.1% of the best it keeps the one that burns the fewest node-hours. A site whose predicted
start comes after the target is reached is not asked at all. Every decision carries its reason.
Pure: no clock, no Slurm; `commands.py` feeds it probes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ops.placement.config import JobShape, PlacementConfigError
from ops.placement.timeline import Counting, Segment, periodic_segments, time_to_target
from ops.durations import duration

_MAX_HORIZON_S = 10 * 365 * 86400.0  # past ten years the target is "never"
_SLOWDOWN = 100.0  # ...and past 100x the time at full speed (gang runs whose jobs rarely overlap)
_TIE = 1e-3  # relative time-to-target difference treated as a tie (then fewer node-hours win)


@dataclass(frozen=True)
class Option:
    """One way a site can take part: a shape, when it would start, how fast it trains."""

    site: str
    shape: JobShape
    start_s: float
    """Calibrated predicted start, seconds from now (0 = now)."""
    tokens_per_s: float
    resubmit_wait_s: float
    """Expected queue wait of each later resubmission (the probe's wait: the queue as it is now)."""
    first_end_s: float | None = None
    """End of the first allocation if it is not start + wall-time (a job already running)."""
    existing_job: str = ""
    """Slurm job id when this option is a job already submitted (then nothing new is submitted)."""

    def __post_init__(self) -> None:
        if self.start_s < 0 or self.resubmit_wait_s < 0 or self.tokens_per_s < 0:
            raise ValueError(f"option for {self.site}: start, wait and tokens_per_s must be >= 0")

    @property
    def end_s(self) -> float:
        return self.first_end_s if self.first_end_s is not None else self.start_s + self.shape.time_s

    def segments(self, horizon_s: float) -> list[Segment]:
        return periodic_segments(
            self.start_s, self.end_s, self.shape.time_s, self.resubmit_wait_s, self.tokens_per_s, horizon_s
        )


def evaluate(options: Sequence[Option], target_tokens: float, counting: Counting = Counting.ELASTIC) -> float:
    """Time-to-target (s) of `options` together; math.inf if never (see _SLOWDOWN)."""
    total = sum(o.tokens_per_s for o in options)
    if total <= 0 or not options:
        return math.inf
    # Horizon: long enough for the whole pool at full speed, doubled until the target is inside it;
    # a target more than _SLOWDOWN times further away than at full speed counts as never reached.
    full_speed = max(o.end_s for o in options) + target_tokens / total
    horizon, cap = 2 * full_speed, min(_MAX_HORIZON_S, _SLOWDOWN * full_speed)
    while horizon <= 2 * cap:
        ttt = time_to_target([o.segments(horizon) for o in options], target_tokens, counting)
        if ttt <= horizon:
            return ttt if ttt <= cap else math.inf
        horizon *= 2
    return math.inf


def node_seconds(options: Sequence[Option], until_s: float) -> float:
    """Node-seconds of allocation the options burn before `until_s` (the cost of a plan)."""
    if math.isinf(until_s):
        return math.inf
    return sum(
        o.shape.nodes * max(0.0, min(until_s, s.end_s) - s.start_s)
        for o in options
        for s in o.segments(until_s)
    )


@dataclass(frozen=True)
class Decision:
    """What to do at one site, and why."""

    site: str
    submit: bool
    """True: submit `option.shape` now. False: submit nothing (see reason)."""
    option: Option | None
    reason: str


@dataclass(frozen=True)
class Plan:
    target_tokens: float
    time_to_target_s: float
    """Predicted time-to-target of this plan (elastic)."""
    start_with_any_s: float
    """Elastic training with every site's configured shape (naive submission)."""
    wait_for_all_s: float
    """Every site's configured shape, training only from when all sites run at once."""
    decisions: tuple[Decision, ...]

    @property
    def training_starts_s(self) -> float:
        starts = [
            d.option.start_s
            for d in self.decisions
            if d.option is not None and (d.submit or d.option.existing_job)
        ]
        return min(starts, default=math.inf)

    def expected_runs(self, d: Decision) -> list[list[float]]:
        """When the plan expects the site to train, [start, end] in seconds from now, up to the
        target: its first job and the resubmissions after it (empty if it is not asked)."""
        if d.option is None or not (d.submit or d.option.existing_job) or math.isinf(self.time_to_target_s):
            return []
        until = self.time_to_target_s
        return [
            [round(seg.start_s, 3), round(min(seg.end_s, until), 3)]
            for seg in d.option.segments(until)
            if seg.start_s < until
        ]

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if math.isinf(x) else round(x, 3)

        return {
            "target_tokens": self.target_tokens,
            "time_to_target_s": num(self.time_to_target_s),
            "training_starts_s": num(self.training_starts_s),
            "start_with_any_s": num(self.start_with_any_s),
            "wait_for_all_s": num(self.wait_for_all_s),
            "sites": [
                {
                    "site": d.site,
                    "submit": d.submit,
                    "existing_job": d.option.existing_job if d.option else "",
                    "shape": d.option.shape.to_json() if d.option else None,
                    "predicted_start_s": num(d.option.start_s) if d.option else None,
                    "tokens_per_s": d.option.tokens_per_s if d.option else None,
                    "expected_runs_s": self.expected_runs(d),
                    "reason": d.reason,
                }
                for d in self.decisions
            ],
        }


def after(seconds: float) -> str:
    """A time from now for people: +45s, +12m, +5h07m, +3d04h, never."""
    return "never" if math.isinf(seconds) else "+" + duration(seconds)


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def make_plan(
    candidates: Mapping[str, Sequence[Option]],
    defaults: Mapping[str, Option],
    target_tokens: float,
    max_combinations: int = 20_000,
) -> Plan:
    """The best combination of one option per site (see the module docstring)."""
    sites = sorted(candidates)
    useful = {s: [o for o in candidates[s] if o.tokens_per_s > 0] for s in sites}
    skipped = {
        s: "no throughput known: set [sites.NAME].tokens_per_s or pass --tokens-per-s"
        for s in sites
        if not useful[s]
    }
    active = [s for s in sites if useful[s]]
    n_combos = math.prod(len(useful[s]) for s in active)
    if n_combos > max_combinations:
        raise PlacementConfigError(
            f"{n_combos} shape combinations exceed {max_combinations}: list fewer node_options"
        )
    best: tuple[float, float, tuple[Option, ...]] | None = None
    for combo in itertools.product(*(useful[s] for s in active)):
        ttt = evaluate(combo, target_tokens)
        if best is None or ttt < best[0] * (1 - _TIE):
            best = (ttt, node_seconds(combo, ttt), combo)
        elif ttt <= best[0] * (1 + _TIE):
            cost = node_seconds(combo, ttt)
            if cost < best[1]:
                best = (min(ttt, best[0]), cost, combo)
    chosen = dict(zip(active, best[2])) if best else {}
    ttt = evaluate(list(chosen.values()), target_tokens)
    default_list = [defaults[s] for s in active]
    decisions = []
    for s in sites:
        if s in skipped:
            decisions.append(Decision(s, False, None, skipped[s]))
            continue
        opt = chosen[s]
        if opt.existing_job:
            decisions.append(
                Decision(
                    s, False, opt, f"job {opt.existing_job} already submitted; starts {after(opt.start_s)}"
                )
            )
            continue
        if opt.start_s >= ttt:
            decisions.append(
                Decision(
                    s,
                    False,
                    opt,
                    f"predicted start {after(opt.start_s)} is after the target is reached ({after(ttt)})",
                )
            )
            continue
        alternatives = []
        for alt in useful[s]:
            if alt is not opt:
                alt_ttt = evaluate([alt if o is opt else o for o in chosen.values()], target_tokens)
                alternatives.append(
                    f"{_nodes(alt.shape.nodes)} (start {after(alt.start_s)}) -> target {after(alt_ttt)}"
                )
        why = f"{_nodes(opt.shape.nodes)} from {after(opt.start_s)}: target {after(ttt)}"
        decisions.append(
            Decision(s, True, opt, why + ("; instead of " + ", ".join(alternatives) if alternatives else ""))
        )
    return Plan(
        target_tokens=target_tokens,
        time_to_target_s=ttt,
        start_with_any_s=evaluate(default_list, target_tokens),
        wait_for_all_s=evaluate(default_list, target_tokens, Counting.AFTER_ALL),
        decisions=tuple(decisions),
    )
