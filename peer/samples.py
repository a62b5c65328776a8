"""The unit of data accounting: a range of samples of one data block.

Shared by the trainer (which reads and trains ranges), the commit log (which records them) and the
lease protocols (which grant them), so that "which samples" means the same thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class SampleRange:
    """Samples [start, end) of block `block_id`, in the block's own deterministic order."""

    block_id: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"empty or negative sample range {self}")

    @property
    def num_samples(self) -> int:
        return self.end - self.start
