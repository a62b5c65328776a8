"""The unit of data accounting: a range of samples of one data block.

Shared by the trainer (which reads and trains ranges), the commit log (which records them) and the
lease protocols (which grant them), so that "which samples" means the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def merge_ranges(ranges: Sequence[SampleRange]) -> list[SampleRange]:
    """Sorted, with adjacent or overlapping ranges of the same block joined (a compact cursor)."""
    out: list[SampleRange] = []
    for r in sorted(ranges):
        if out and out[-1].block_id == r.block_id and r.start <= out[-1].end:
            out[-1] = SampleRange(r.block_id, out[-1].start, max(out[-1].end, r.end))
        else:
            out.append(r)
    return out
