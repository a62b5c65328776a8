"""ChunkBuffers: receive buffers a sink gives back are taken again, and nothing else enters the pool."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peer.exchange.buffers import ChunkBuffers
from peer.exchange.codec import as_memoryview


def test_a_given_back_buffer_is_taken_again_and_the_view_is_writable() -> None:
    pool = ChunkBuffers(1024)
    first = pool.take(1000)
    assert len(first) == 1000 and not first.readonly
    first[:3] = b"abc"
    pool.give(first)
    again = pool.take(10)
    assert again.obj is first.obj  # the same memory, no new allocation
    assert pool.take(10).obj is not again.obj  # taken: the next one is new


def test_foreign_memory_never_enters_the_pool() -> None:
    pool = ChunkBuffers(1024)
    pool.give(b"x" * 1024)  # a gRPC message's bytes
    pool.give(memoryview(np.empty(512, dtype=np.uint8)))  # another size
    pool.give(memoryview(np.empty(2048, dtype=np.uint8))[:1024])  # a slice of larger memory
    pool.give(as_memoryview(torch.empty(1024, dtype=torch.uint8)))  # a tensor's memory (not owned by numpy)
    fresh = [pool.take(1024).obj for _ in range(2)]
    assert all(isinstance(a, np.ndarray) and a.nbytes == 1024 and a.flags.owndata for a in fresh)
    assert fresh[0] is not fresh[1]


def test_a_chunk_larger_than_the_buffers_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        ChunkBuffers(1024).take(1025)
