"""The outer step's settings: what `peer serve --outer-lr/--outer-momentum` and a run file set.

Kept apart from the step itself (peer/outer.py) so that reading a run file (peer/config.py) loads
neither torch nor grpc.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OuterConfig:
    # Plain averaging by default: at 12 and 33 rounds (H=10, 3 sites, 4 seeds) it came within 3-6 %
    # of one trainer on the same tokens, where DiLoCo's 0.7/0.9 was 56 % worse and 1.0/0.5 33 %
    # (docs/decisions/outer-defaults.md; longer runs not measured yet).
    lr: float = 1.0
    """Outer (Nesterov) learning rate η."""
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


SPARSE_OUTER = OuterConfig(lr=1.3, momentum=0.0)
"""The outer step with the sparse wire (SparseLoCo): no momentum, each site's decayed error feedback
stands in for it, and a step of 1.3 makes up for the mass the decay drops: 0.976 of plain dense
averaging's perplexity over 4 seeds at 33 rounds, where lr 1.0 gave 1.026
(docs/decisions/exchange-sparse-wire.md)."""
