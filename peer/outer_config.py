"""The outer step's settings: what `peer serve --outer-lr/--outer-momentum` and a run file set.

Kept apart from the step itself (peer/outer.py) so that reading a run file (peer/config.py) loads
neither torch nor grpc.
"""

from __future__ import annotations

import math
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


LONG_RUN_LR = 0.6
"""The outer lr of a long run: at 33, 98 and 326 rounds within 1 % of one trainer on the same tokens
(4 seeds each), where 0.8 and the plain mean were 5-13 % off and 0.45 no better (98 rounds)."""
SHORT_RUN_ROUNDS = 16
"""Runs of up to this many rounds take the sites' plain mean (lr 1): the demo's 16 and the measured 12."""
LONG_RUN_ROUNDS = 22
"""Runs of this many rounds and more take LONG_RUN_LR (at 22 rounds 0.6 read 1.046 of one trainer,
the plain mean 1.069 and 0.816 1.072); between the two the lr falls log-linearly."""


def lr_for(rounds: int) -> float:
    """The default outer lr of a run expected to last `rounds` rounds: 1 (the sites' plain token-
    weighted mean, no momentum) up to SHORT_RUN_ROUNDS, LONG_RUN_LR from LONG_RUN_ROUNDS on, and in
    between falling linearly in log(rounds).

    Measured with scripts/bench_quality (tiny Qwen3, 3 sites, 4 seeds; docs/decisions/
    outer-defaults.md): in a short run every round's progress counts and damping the mean only
    leaves θ short (lr 0.6 was 4 % worse than 1 at 12 rounds), while in a long one damping it in
    every round keeps the sites' drift down (0.6 read 0.99-1.00 of one trainer at 33, 98 and 326
    rounds, where the plain mean read 1.06-1.13). Nothing between 12 and 22 rounds was measured.
    Damping only the late rounds was worse than both (a linear cool-down at 98 rounds). The rule is
    a function of the run's length alone, which every peer derives from the same --total-steps and
    --inner-steps, so every peer takes the same step (I7)."""
    if rounds <= SHORT_RUN_ROUNDS:
        return 1.0
    if rounds >= LONG_RUN_ROUNDS:
        return LONG_RUN_LR
    share = math.log(rounds / SHORT_RUN_ROUNDS) / math.log(LONG_RUN_ROUNDS / SHORT_RUN_ROUNDS)
    return 1.0 + (LONG_RUN_LR - 1.0) * share


SPARSE_OUTER = OuterConfig(lr=1.3, momentum=0.0)
"""The outer step with the sparse wire (SparseLoCo): no momentum, each site's decayed error feedback
stands in for it, and a step of 1.3 makes up for the mass the decay drops: 0.976 of plain dense
averaging's perplexity over 4 seeds at 33 rounds, where lr 1.0 gave 1.026
(docs/decisions/exchange-sparse-wire.md)."""
