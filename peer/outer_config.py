"""The outer step's settings: what `peer serve --outer-lr/--outer-momentum` and a run file set.

Kept apart from the step itself (peer/outer.py) so that reading a run file (peer/config.py) loads
neither torch nor grpc.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OuterConfig:
    lr: float = 1.0
    """Outer (Nesterov) learning rate η; `peer serve` takes `lr_for` its run's expected rounds."""
    momentum: float = 0.0
    """Outer momentum μ (0: none; DiLoCo's own runs of hundreds of rounds use 0.9 with lr 0.7)."""
    checkpoint_every: int = 0
    """Write a Hugging Face checkpoint every N committed rounds (0: only on request)."""
    eval_every: int = 0
    """The leader evaluates θ on the held-out set every N committed rounds and the last (0: never;
    peer/heldout.py)."""

    def __post_init__(self) -> None:
        if self.eval_every < 0:
            raise ValueError(f"eval_every={self.eval_every}: give a number of rounds, or 0 for never")


LONG_RUN_LR = 0.8
"""The outer lr of a long run: measured best of 0.8, 1.0 and 1.25 at 98 rounds (H=10, 3 sites)."""
SHORT_RUN_ROUNDS = 16
"""Runs of up to this many rounds take the sites' plain mean (lr 1): the demo's 16 and the measured 12."""


def lr_for(rounds: int) -> float:
    """The default outer lr of a run expected to last `rounds` rounds: 1 (the sites' plain token-weighted
    mean, no momentum) up to SHORT_RUN_ROUNDS, then down towards LONG_RUN_LR as 1/rounds.

    Measured with scripts/bench_quality (tiny Qwen3, 3 sites, H=10, 4 seeds; docs/decisions/
    outer-defaults.md): in a short run every round's progress counts and damping the mean only
    leaves θ short (lr 0.8 was 2.6 % worse than 1 at 12 rounds), while in a long one damping it in
    every round keeps the sites' drift down (0.8 was 3.5 % better at 98 rounds, 1.25 worse).
    Damping only the late rounds was worse than both (a linear cool-down to 0.8 at 98 rounds).
    The rule is a function of the run's length alone, which every peer derives from the same
    --total-steps and --inner-steps, so every peer takes the same step (I7)."""
    return LONG_RUN_LR + (1.0 - LONG_RUN_LR) * min(1.0, SHORT_RUN_ROUNDS / max(1, rounds))


SPARSE_OUTER = OuterConfig(lr=1.3, momentum=0.0)
"""The outer step with the sparse wire (SparseLoCo): no momentum, each site's decayed error feedback
stands in for it, and a step of 1.3 makes up for the mass the decay drops: 0.976 of plain dense
averaging's perplexity over 4 seeds at 33 rounds, where lr 1.0 gave 1.026
(docs/decisions/exchange-sparse-wire.md)."""
