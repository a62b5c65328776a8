"""ChunkBuffers: receive buffers a sink gives back are taken again, and nothing else enters the pool;
EncodeBuffers: an encode buffer is used again only once the object encoded into it is gone."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from peer.exchange.buffers import ChunkBuffers, EncodeBuffers
from peer.exchange.codec import WireDtype, as_memoryview, encode, encoded_nbytes


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


def _tensors() -> dict[str, torch.Tensor]:
    return {"a": torch.randn(300, 7), "b": torch.randn(1000)}


def test_encoded_nbytes_is_what_encode_writes() -> None:
    for wire in WireDtype:
        encoded = encode(_tensors(), round=1, site="s", tokens=1, wire=wire, chunk_size=1024)
        assert encoded_nbytes(_tensors(), wire, 1024) == encoded.data.numel()


def test_an_encode_buffer_is_reused_only_once_its_object_is_gone() -> None:
    buffers = EncodeBuffers()
    nbytes = encoded_nbytes(_tensors(), WireDtype.BF16)
    first = buffers.take(nbytes)
    encoded = encode(_tensors(), round=1, site="s", tokens=1, out=first)
    buffers.lend(first, encoded)
    second = buffers.take(nbytes)
    assert second.data_ptr() != first.data_ptr()  # round 1's object is still held (the store, a fetch)
    del encoded
    gc.collect()
    assert buffers.take(nbytes).data_ptr() == first.data_ptr()
    assert buffers.take(nbytes).data_ptr() not in (first.data_ptr(), second.data_ptr())


def test_a_free_encode_buffer_too_small_for_the_layout_is_not_used() -> None:
    buffers = EncodeBuffers()
    small = buffers.take(100)
    encoded = encode({"a": torch.randn(10)}, round=1, site="s", tokens=1, out=small)
    buffers.lend(small, encoded)
    del encoded
    assert buffers.take(1000).numel() == 1000
