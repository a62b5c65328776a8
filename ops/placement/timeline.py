"""Time-to-target of a set of site allocations, for elastic and for gang-scheduled training.

    python -c "from ops.placement.timeline import Counting, Segment, time_to_target as t; \
print(t([[Segment(0, 10, 1.0)], [Segment(5, 20, 2.0)]], 20.0, Counting.ELASTIC))"

Each site contributes segments `[start, end)` (seconds from now) during which it trains at a
constant `tokens_per_s`. How tokens count is a `Counting` rule: ELASTIC (sitemesh: a round commits
with any subset of live sites), AFTER_ALL (the wait-for-all baseline: the run starts only once every
site is allocated at the same time, then continues elastically) or GANG (a synchronous run: tokens
count only while every site runs). Pure functions of their inputs: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Counting(Enum):
    """Which running sites' tokens count towards the target."""

    ELASTIC = "elastic"
    """Every running site, from the first start on."""
    AFTER_ALL = "after-all"
    """Nothing until every site runs at once; from then on every running site."""
    GANG = "gang"
    """Only while every site runs."""


@dataclass(frozen=True)
class Segment:
    """One allocation of one site: trains at `tokens_per_s` from `start_s` to `end_s`."""

    start_s: float
    end_s: float
    tokens_per_s: float

    def __post_init__(self) -> None:
        if not self.end_s >= self.start_s:
            raise ValueError(f"segment ends ({self.end_s}) before it starts ({self.start_s})")
        if self.tokens_per_s < 0:
            raise ValueError(f"tokens_per_s must be >= 0, got {self.tokens_per_s}")


def periodic_segments(
    first_start_s: float,
    first_end_s: float,
    walltime_s: float,
    wait_s: float,
    tokens_per_s: float,
    horizon_s: float,
) -> list[Segment]:
    """A site that resubmits whenever its job ends and waits `wait_s` each time, up to `horizon_s`."""
    if walltime_s <= 0:
        raise ValueError(f"walltime must be > 0, got {walltime_s}")
    out = [Segment(first_start_s, first_end_s, tokens_per_s)]
    start = first_end_s + wait_s
    while start < horizon_s:
        out.append(Segment(start, start + walltime_s, tokens_per_s))
        start += walltime_s + wait_s
    return out


def time_to_target(sites: Sequence[Sequence[Segment]], target_tokens: float, counting: Counting) -> float:
    """When the tokens counted under `counting` reach `target_tokens` (math.inf if never)."""
    if target_tokens <= 0:
        return 0.0
    # Sweep over segment boundaries in time order, keeping the summed rate and how many segments of
    # each site are running; between two boundaries the rate is constant.
    events = sorted(
        (t, sign, i, seg.tokens_per_s)
        for i, segs in enumerate(sites)
        for seg in segs
        if seg.end_s > seg.start_s
        for t, sign in ((seg.start_s, 1), (seg.end_s, -1))
    )
    running = [0] * len(sites)
    up = 0  # sites with at least one running segment
    rate_sum = 0.0
    done = 0.0
    started = counting is Counting.ELASTIC
    prev = events[0][0] if events else 0.0
    for t, sign, i, rate in events:
        started = started or up == len(sites)
        counted = rate_sum if started and (counting is not Counting.GANG or up == len(sites)) else 0.0
        if counted > 0 and done + counted * (t - prev) >= target_tokens:
            return prev + (target_tokens - done) / counted
        done += counted * (t - prev)
        prev = t
        up += (running[i] == 0) if sign > 0 else -(running[i] == 1)
        running[i] += sign
        rate_sum += sign * rate
    return math.inf


def tokens_until(segments: Sequence[Segment], t: float) -> float:
    """Tokens one site's segments train before time `t`."""
    return sum(s.tokens_per_s * max(0.0, min(t, s.end_s) - s.start_s) for s in segments)
