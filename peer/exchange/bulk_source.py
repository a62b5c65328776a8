"""Chunks over the bulk data plane: one TCP connection per attempt, a chunk source (sources.py).

The connection is opened, read and verified in a thread of its own (bulk.receive), not in the
default executor: an InThread sink may wait there for other streams (the reducer's lockstep). Each
chunk must arrive within the attempt's stall_s and the whole attempt within its timeout.

    .venv/bin/python -m pytest tests/integration/test_exchange_bulk.py -q
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
import time
from collections.abc import Callable

from peer.exchange import bulk, codec, protoconv
from peer.exchange.sources import FATAL, Attempt, Fault, FetchError, InThread, Retry
from peer.gen.sitemesh.v1 import exchange_pb2

# How a failed connection is counted (a FetchStats field); the first match wins (Truncated,
# Misplaced, socket.timeout and ssl.SSLError are OSErrors too).
_FAULTS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], Fault], ...] = (
    (socket.timeout, "stalls"),
    (bulk.Truncated, "truncated_streams"),
    (bulk.Misplaced, "misplaced_chunks"),
    (codec.ChunkError, "corrupt_chunks"),
    ((OSError, concurrent.futures.CancelledError), "transport_errors"),
)
_RETRIED = (OSError, codec.ChunkError, concurrent.futures.CancelledError)


class BulkSource:
    """`target`: the ticket's connection; `address`: the peer's gRPC address, for messages;
    `reached(reached, fault)`: told after the attempt whether its first frame arrived (the peer's
    plane choice falls back to gRPC when connections keep failing before it)."""

    def __init__(self, target: bulk.BulkTarget, address: str, reached: Callable[[bool, str], None]) -> None:
        self._target, self._address, self._reached = target, address, reached

    async def read(self, attempt: Attempt) -> None:
        manifest, end, sink = attempt.manifest, attempt.end, attempt.sink
        loop = asyncio.get_running_loop()
        request = exchange_pb2.FetchRequest(key=protoconv.key_to_proto(manifest.key), root_hash=manifest.root_hash,
                                            first_chunk=attempt.next, end_chunk=end)
        deadline = time.monotonic() + max(attempt.timeout_s, 0.001)
        done: asyncio.Future[None] = loop.create_future()
        reached = threading.Event()  # the first frame arrived: the plane can be reached from here
        held: list[socket.socket] = []

        def settle(err: BaseException | None) -> None:
            if not done.done():
                done.set_result(None) if err is None else done.set_exception(err)

        def run() -> None:
            err: BaseException | None = None
            try:
                sock = bulk.connect(self._target, request,
                                    min(attempt.stall_s, max(deadline - time.monotonic(), 0.001)))
                held.append(sock)
                if attempt.stopped.is_set():
                    return
                bulk.receive(sock, manifest, attempt.next, end, loop,
                             attempt.deliver_here if isinstance(sink, InThread) else attempt.deliver, attempt.stopped,
                             stall_s=attempt.stall_s, deadline=deadline, reached=reached, buffers=attempt.buffers,
                             into=sink.into if isinstance(sink, InThread) and sink.placed is not None else None,
                             placed=attempt.placed)
            except BaseException as caught:  # noqa: BLE001 - handed to the loop, raised there
                err = caught
            finally:
                for sock in held:
                    sock.close()
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(settle, err)

        # Cancelled, nobody reads what the thread ended with (the sink's own CancelledError, a refused
        # connect): mark it read, or the collector logs it as "Future exception was never retrieved".
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        threading.Thread(target=run, name=f"bulk-fetch-{manifest.key}", daemon=True).start()
        due = attempt.next
        try:
            await asyncio.shield(done)  # a cancellation must leave `done` to the thread, awaited below
            self._reached(True, "")
        except asyncio.CancelledError:
            attempt.stop()  # a coroutine sink's task is cancelled: the thread waiting for it ends too
            for sock in held:  # wakes the thread's recv; it exits without delivering more
                bulk.shutdown(sock)
            # The thread may be inside the sink still: the fetch is over when it is, however often it is
            # cancelled meanwhile (a stopping node cancels again). Bounded: its socket is shut and the
            # sink's task cancelled, so the thread ends within one sink call, provided a sink that waits
            # for other streams is woken by its owner (the reducer's stop, called by allreduce._all).
            while held and not done.done():
                with contextlib.suppress(BaseException):
                    await asyncio.shield(done)
            raise
        except bulk.ErrorFrame as err:
            self._reached(True, "")
            if err.code in FATAL:
                raise FetchError(f"{manifest.key} from {self._address} (bulk): {err}", manifest.key) from err
            raise Retry("transport_errors", f"bulk {err}") from None
        except _RETRIED as err:
            counter = next(name for kinds, name in _FAULTS if isinstance(err, kinds))
            if isinstance(err, socket.timeout):
                fault = (f"bulk: chunk {attempt.next} not in within {attempt.stall_s} s"
                         if time.monotonic() < deadline else f"bulk: the fetch deadline passed at chunk {attempt.next}")
            else:
                fault = f"bulk connection from chunk {due}: {type(err).__name__}: {err}"
            self._reached(reached.is_set(), fault)
            raise Retry(counter, fault) from None
