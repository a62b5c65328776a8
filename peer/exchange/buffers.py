"""Memory the exchange reuses: receive buffers a chunk sink hands back, and encode buffers.

A stream whose sink runs in its thread (the reducer, decoding into a destination) receives every
chunk into one buffer, taken from a pool for the connection and given back at its end; a sink on
the event loop may hold a chunk after the stream moved on, so it gets a buffer of the pool per
chunk and gives it back after use. Fresh memory instead: on the VMs measured, faulting in and
zeroing those pages cost more than the exchange's hashing (docs/decisions/exchange-buffer-reuse.md).

    pool = ChunkBuffers(chunk_bytes)
    view = pool.take(n)        # in a receiving thread: n <= chunk_bytes writable bytes
    pool.give(view)            # by the sink, once nothing reads `view` any more

    buffers = EncodeBuffers()  # a site's pseudo-gradients, round after round
    out = buffers.take(codec.encoded_nbytes(delta, wire)); encoded = codec.encode(delta, ..., out=out)
    buffers.lend(out, encoded)  # free again once `encoded` is gone

    memory = ExchangeMemory()  # one per peer: what its mean exchanges reuse, round after round
    reduce_scatter_mean(..., memory=memory)
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch


class ChunkBuffers:
    """A free list of equal buffers, shared by the threads that take and give (thread-safe)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.made = 0
        """Buffers allocated so far (the rest of the takes were served by given-back ones)."""

    def take(self, n: int) -> memoryview:
        """`n` writable bytes (n <= nbytes): a given-back buffer if there is one, else a new one."""
        if n > self.nbytes:
            raise ValueError(f"a {n}-byte chunk does not fit this pool's {self.nbytes}-byte buffers")
        with self._lock:
            if self._free:
                array = self._free.pop()
            else:
                array = np.empty(self.nbytes, dtype=np.uint8)
                self.made += 1
        return array.data[:n]

    def give(self, view: memoryview | bytes) -> None:
        """Hands back a view `take` returned. Anything else is ignored: a gRPC message's bytes, a view
        of memory that is not a whole buffer of this size."""
        array = view.obj if isinstance(view, memoryview) else None
        if isinstance(array, np.ndarray) and array.flags.owndata and array.nbytes == self.nbytes:
            with self._lock:
                self._free.append(array)


class EncodeBuffers:
    """Buffers a site encodes its pseudo-gradients into, each used again once the object last
    encoded into it is gone: dropped from the store and read by no fetch any more (every reader, the
    bulk server, the gRPC servicer and the reducer, holds the Encoded object while it reads).
    Encoding every round into fresh memory faulted in a model's bytes each round (exchange-buffer-reuse.md)."""

    def __init__(self) -> None:
        self._lent: list[tuple[torch.Tensor, weakref.ref[object]]] = []
        self._free: list[torch.Tensor] = []

    def take(self, nbytes: int) -> torch.Tensor:
        """A CPU uint8 buffer of >= nbytes that no live object was encoded into (free ones too small
        for this layout are let go), else a new one."""
        self._free += [b for b, owner in self._lent if owner() is None]
        self._lent = [(b, owner) for b, owner in self._lent if owner() is not None]
        self._free = [b for b in self._free if b.numel() >= nbytes]
        return self._free.pop() if self._free else torch.empty(nbytes, dtype=torch.uint8)

    def lend(self, buffer: torch.Tensor, owner: object) -> None:
        """`owner` (the Encoded) now lives in `buffer`: it is free again when `owner` is collected."""
        self._lent.append((buffer, weakref.ref(owner)))


class ExchangeMemory:
    """What one peer's mean exchanges reuse from round to round: the receive buffers of the
    reductions' streams (a pool per chunk size) and the memory its mean shards are encoded into.
    A pool made per round was fresh memory every round: 16 % of the reduce phase went to zeroing
    its pages at 1200 MB (exchange-buffer-reuse.md). The pools keep what was in use at the peak for
    the life of the peer: one chunk per stream of the reductions running at once."""

    def __init__(self) -> None:
        self.shards = EncodeBuffers()
        self._chunks: dict[int, ChunkBuffers] = {}
        self._lock = threading.Lock()  # reducers of concurrent reductions ask from their own tasks

    def chunks(self, nbytes: int) -> ChunkBuffers:
        """The pool of `nbytes` receive buffers, shared by every reduction that asks for that size."""
        with self._lock:
            return self._chunks.setdefault(nbytes, ChunkBuffers(nbytes))
