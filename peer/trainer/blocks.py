"""Data blocks: stable IDs, per-block sample order, and sample ranges (the per-sample cursor).

A block is a run of `block_samples` consecutive packed samples of one shard (the last block of a
shard may be shorter). Its ID is a uint64 (the `SampleRange.block_id` of protos/consensus.proto):

    bits 63..48  fingerprint of (shards by content, tokenizer, seq_len, block_samples, held-out rule,
                 seed): peer.core.agreement.data_tag, never a local path
    bits 47..24  shard index
    bits 23..0   block index inside the shard

so every site derives the same IDs from the data config and seed alone, whatever the number of
sites and wherever its copy of the corpus lies, an ID from a different config is recognised as foreign, and reading block X needs only X's
shard (a memory-mapped slice), never the blocks before it. Inside a block, samples are visited in a
permutation seeded by (seed, block ID); `SampleRange(block_id, start, end)` names positions
[start, end) of that order, which is what leases grant and what a round reports it trained.

Try it:
    .venv/bin/python -c "from peer.trainer.blocks import BlockIndex; from peer.trainer.config import DataConfig; b=BlockIndex(DataConfig.shipped()); print(len(b.blocks), b.blocks[0])"
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from peer.core.samples import SampleRange, merge_ranges  # noqa: F401 - merge_ranges: the trainer's name for it
from peer.trainer.config import DataConfig
from peer.trainer.data import Corpus
from peer.trainer.identity import data_tag
from peer.trainer.tokenizer import TextTokenizer

_SHARD_BITS = 24
_INDEX_BITS = 24


@dataclass(frozen=True)
class BlockInfo:
    block_id: int
    shard: int
    index: int
    """Block number inside its shard."""
    num_samples: int

    def full_range(self) -> SampleRange:
        return SampleRange(self.block_id, 0, self.num_samples)


def config_fingerprint(cfg: DataConfig, tokenizer: TextTokenizer) -> int:
    """16-bit tag of everything that changes which tokens a block ID denotes; the shards count by
    content, so the same corpus under another path has the same tag (peer/trainer/identity.py)."""
    return data_tag(cfg, tokenizer)


def make_block_id(fingerprint: int, shard: int, index: int) -> int:
    if not (0 <= shard < 1 << _SHARD_BITS and 0 <= index < 1 << _INDEX_BITS):
        raise ValueError(f"shard {shard} / block {index} out of range for a block ID")
    return (fingerprint << (_SHARD_BITS + _INDEX_BITS)) | (shard << _INDEX_BITS) | index


def split_block_id(block_id: int) -> tuple[int, int, int]:
    """(fingerprint, shard, index) of a block ID."""
    mask = (1 << _INDEX_BITS) - 1
    return block_id >> (_SHARD_BITS + _INDEX_BITS), (block_id >> _INDEX_BITS) & mask, block_id & mask


class BlockIndex:
    """The epoch's blocks for one `DataConfig`, and random access to their samples."""

    def __init__(self, cfg: DataConfig, corpus: Corpus | None = None) -> None:
        self.cfg = cfg
        self.corpus = corpus or Corpus(cfg)
        self.fingerprint = config_fingerprint(cfg, self.corpus.tokenizer)
        self._blocks: list[BlockInfo] | None = None

    @property
    def blocks(self) -> list[BlockInfo]:
        """All blocks of the epoch in (shard, index) order. Tokenizes every shard on first use."""
        if self._blocks is None:
            out = []
            for shard in range(len(self.cfg.shards)):
                n, b = self.corpus.num_samples(shard), self.cfg.block_samples
                for index in range((n + b - 1) // b):
                    out.append(BlockInfo(make_block_id(self.fingerprint, shard, index), shard, index,
                                         min(b, n - index * b)))
            self._blocks = out
        return self._blocks

    def epoch_order(self) -> list[BlockInfo]:
        """A seeded shuffle of the blocks: the order a single trainer (or the lease owner) hands them out."""
        perm = np.random.default_rng([self.cfg.seed, 0xB10C]).permutation(len(self.blocks))
        return [self.blocks[i] for i in perm]

    def info(self, block_id: int) -> BlockInfo:
        """The block with this ID, computed from its shard alone."""
        fp, shard, index = split_block_id(block_id)
        if fp != self.fingerprint or shard >= len(self.cfg.shards):
            raise KeyError(f"block {block_id:#x} does not belong to this data config")
        n, b = self.corpus.num_samples(shard), self.cfg.block_samples
        if index * b >= n:
            raise KeyError(f"block {block_id:#x}: shard {shard} has only {(n + b - 1) // b} blocks")
        return BlockInfo(block_id, shard, index, min(b, n - index * b))

    def sample_order(self, info: BlockInfo) -> np.ndarray:
        """Shard-level sample indices of the block, in the block's training order."""
        rng = np.random.default_rng([self.cfg.seed, info.block_id >> 32, info.block_id & 0xFFFFFFFF])
        return info.index * self.cfg.block_samples + rng.permutation(info.num_samples)

    def read(self, r: SampleRange) -> torch.Tensor:
        """Samples [start, end) of a block as a [n, seq_len] int64 tensor."""
        info = self.info(r.block_id)
        if r.end > info.num_samples:
            raise IndexError(f"{r} exceeds the block's {info.num_samples} samples")
        return self.corpus.samples(info.shard, self.sample_order(info)[r.start:r.end])

    def read_ranges(self, ranges: Iterable[SampleRange]) -> torch.Tensor:
        return torch.cat([self.read(r) for r in ranges])


def take_samples(queue: list[SampleRange], n: int) -> tuple[list[SampleRange], list[SampleRange]]:
    """Split off the first `n` samples of a queue of ranges: (taken, rest). Splits a range if needed."""
    taken: list[SampleRange] = []
    rest = list(queue)
    while n > 0 and rest:
        r = rest.pop(0)
        if r.num_samples <= n:
            taken.append(r)
            n -= r.num_samples
        else:
            taken.append(SampleRange(r.block_id, r.start, r.start + n))
            rest.insert(0, SampleRange(r.block_id, r.start + n, r.end))
            n = 0
    return taken, rest


def subtract_ranges(queue: Sequence[SampleRange], done: Iterable[SampleRange]) -> list[SampleRange]:
    """The samples of `queue` (kept in its order) that are not in `done`: what is left to train
    after a restart, given the cursor of a checkpoint."""
    trained = {(r.block_id, i) for r in done for i in range(r.start, r.end)}
    out: list[SampleRange] = []
    for r in queue:
        start = None
        for i in range(r.start, r.end + 1):
            free = i < r.end and (r.block_id, i) not in trained
            if free and start is None:
                start = i
            elif not free and start is not None:
                out.append(SampleRange(r.block_id, start, i))
                start = None
    return out
