"""Which shape the operator loop asks for: the node count whose job trains the most tokens.

A site may list several node counts (`node_options`). A larger job trains faster but may wait
longer in the queue; the loop asks Slurm (`sbatch --test-only`, calibrated by the prediction log as
`ops place` does: ops/placement/predictions.py) when each would start, and takes the shape that
trains the most tokens within one allocation's time from when the job may begin: a job of `nodes`
starting `late` seconds after it may begin trains `tokens_per_s(nodes) x (wall - late)` there. So
a shape that can start by the handover wins over a larger one that would leave the site out for a
while, unless the larger one's speed makes up for it. Ties go to fewer nodes (fewer node-hours).
Pure: the probes come in, one choice and its reason go out.

    .venv/bin/python -m pytest tests/unit/test_autopilot_shapes.py -q
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from ops.placement.config import JobShape


@dataclass(frozen=True)
class ShapeOption:
    """One node count as Slurm's probe saw it."""

    shape: JobShape
    start: float | None
    """When a job of this shape would start (calibrated), seconds since the epoch; None: the probe
    failed (`refused` says why), and the shape is not chosen."""
    tokens_per_s: float
    refused: str = ""


@dataclass(frozen=True)
class ShapeChoice:
    shape: JobShape
    start: float | None
    """The chosen shape's predicted start (None: no probe answered; the configured shape is taken)."""
    reason: str


def choose(options: Sequence[ShapeOption], default: JobShape, now: float, begin: float | None) -> ShapeChoice:
    """The shape to submit at `now` for a job that may begin at `begin` (None: at once)."""
    begin = now if begin is None else max(now, begin)
    answered = [o for o in options if o.start is not None]
    if not answered:
        why = "; ".join(f"{o.shape.nodes} nodes: {o.refused}" for o in options) or "no shapes probed"
        return ShapeChoice(default, None, f"{_nodes(default.nodes)} (configured): no probe answered ({why})")

    def tokens(o: ShapeOption) -> float:
        assert o.start is not None
        return o.tokens_per_s * max(0.0, o.shape.time_s - max(0.0, o.start - begin))

    best = max(answered, key=lambda o: (tokens(o), -o.shape.nodes))
    assert best.start is not None
    others = [f"{_nodes(o.shape.nodes)} {_start(o, begin)}, {tokens(o):.3g} tokens" for o in answered if o is not best]
    others += [f"{_nodes(o.shape.nodes)} refused ({o.refused})" for o in options if o.start is None]
    return ShapeChoice(best.shape, best.start,
                       f"{_nodes(best.shape.nodes)}: predicted start {_start(best, begin)}, {tokens(best):.3g} tokens "
                       f"in its allocation" + (f"; {'; '.join(others)}" if others else ""))


def _start(o: ShapeOption, begin: float) -> str:
    assert o.start is not None
    at = dt.datetime.fromtimestamp(max(o.start, begin), dt.timezone.utc).strftime("%H:%M:%S UTC")
    late = o.start - begin
    return f"{at} ({late:.0f} s after it may begin)" if late > 0 else f"{at} (when it may begin)"


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"
