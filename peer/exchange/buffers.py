"""Receive buffers that a chunk sink hands back once it is done with them.

A fetch whose sink holds chunks after it returns (the reducer's window) cannot receive every chunk
into one buffer, and a fresh buffer per chunk is fresh memory: on the VMs measured, faulting in
and zeroing those pages cost more than the exchange's hashing (docs/decisions/exchange-buffer-reuse.md).
The sink gives each buffer back after use and the receiving threads take it again.

    pool = ChunkBuffers(chunk_bytes)
    view = pool.take(n)        # in a receiving thread: n <= chunk_bytes writable bytes
    pool.give(view)            # by the sink, once nothing reads `view` any more
"""

from __future__ import annotations

import threading

import numpy as np


class ChunkBuffers:
    """A free list of equal buffers, shared by the threads that take and give (thread-safe)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> memoryview:
        """`n` writable bytes (n <= nbytes): a given-back buffer if there is one, else a new one."""
        if n > self.nbytes:
            raise ValueError(f"a {n}-byte chunk does not fit this pool's {self.nbytes}-byte buffers")
        with self._lock:
            array = self._free.pop() if self._free else np.empty(self.nbytes, dtype=np.uint8)
        return array.data[:n]

    def give(self, view: memoryview | bytes) -> None:
        """Hands back a view `take` returned. Anything else is ignored: a gRPC message's bytes, a view
        of memory that is not a whole buffer of this size."""
        array = view.obj if isinstance(view, memoryview) else None
        if isinstance(array, np.ndarray) and array.flags.owndata and array.nbytes == self.nbytes:
            with self._lock:
                self._free.append(array)
