"""Time-to-target of a set of site allocations, for elastic and for gang-scheduled training.

    python -c "from ops.placement.timeline import Segment, time_to_target as t; \
print(t([[Segment(0, 10, 1.0)], [Segment(5, 20, 2.0)]], 20.0, gang=False))"

Each site contributes segments `[start, end)` (seconds from now) during which it trains at a
constant `tokens_per_s`. Elastic training (sitemesh's rule: a round commits with any subset of
live sites) counts every running site; gang training (the wait-for-all baseline) counts tokens only
while every site runs at once. Pure functions of their inputs: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


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
    first_start_s: float, first_end_s: float, walltime_s: float, wait_s: float, tokens_per_s: float, horizon_s: float
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


def time_to_target(sites: Sequence[Sequence[Segment]], target_tokens: float, gang: bool) -> float:
    """When the cumulative tokens reach `target_tokens` (math.inf if the segments never get there).

    `gang`: tokens count only while every site in `sites` has a running segment.
    """
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
    prev = events[0][0] if events else 0.0
    for t, sign, i, rate in events:
        counted = rate_sum if not gang or up == len(sites) else 0.0
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
