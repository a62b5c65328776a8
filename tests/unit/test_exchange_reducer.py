"""The reducer of peer/exchange/allreduce.py, driven by real threads as the receiving streams drive it:
lockstep hand-over, the exact sum, and how a stop or a failed reduction ends every stream.

    .venv/bin/python -m pytest tests/unit/test_exchange_reducer.py -q
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from peer.exchange import codec, decoding
from peer.exchange.allreduce import Reducer, ReductionStopped, WireSink
from tests.support.exchange import random_model

SIZES = {"w": (40, 30), "b": (7,)}
TOKENS = {"alpha": 100, "bravo": 300, "charlie": 600}
CHUNK = 512  # layout bytes: 128 fp32 elements, 3 chunks
JOIN_S = 10.0


def _encoded() -> dict[str, codec.Encoded]:
    return {s: codec.encode(random_model(i, SIZES), round=1, site=s, tokens=TOKENS[s], chunk_size=CHUNK)
            for i, s in enumerate(TOKENS)}


def _stream(reducer: Reducer, site: str, encoded: codec.Encoded, errors: dict[str, BaseException]) -> threading.Thread:
    """A remote site's receiving thread: hands over its chunks in order, each a copy that it spoils
    once `put` returns (as the bulk plane receives the next chunk into the same buffer)."""

    def run() -> None:
        try:
            for index in range(encoded.manifest.num_chunks):
                buf = bytearray(encoded.chunk(index))
                reducer.put(site, index, memoryview(buf))
                buf[:] = b"\xff" * len(buf)  # NaN in bf16: a reduction still reading it would see NaN
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            errors[site] = err

    thread = threading.Thread(target=run, name=f"stream-{site}", daemon=True)
    thread.start()
    return thread


def _reducer(encoded: dict[str, codec.Encoded], emit: Callable[[int, torch.Tensor], None]) -> Reducer:
    manifests = {s: e.manifest for s, e in encoded.items()}
    return Reducer(manifests, {"alpha": encoded["alpha"]}, 0, manifests["alpha"].num_chunks, emit)


def test_streams_in_lockstep_give_the_exact_token_weighted_sum() -> None:
    encoded = _encoded()
    sums: dict[int, torch.Tensor] = {}
    reducer = _reducer(encoded, lambda i, acc: sums.__setitem__(i, acc.clone()))
    errors: dict[str, BaseException] = {}
    threads = [_stream(reducer, s, encoded[s], errors) for s in ("bravo", "charlie")]
    for t in threads:
        t.join(JOIN_S)
    assert not errors and not any(t.is_alive() for t in threads)
    m = encoded["alpha"].manifest
    assert sorted(sums) == list(range(m.num_chunks))
    total = sum(TOKENS.values())
    for index, got in sums.items():
        want = None
        for site in sorted(TOKENS):  # multiply, then add, in sorted site order
            values, _ = decoding.chunk_values(encoded[site].chunk(index), m.layout.wire, 0, m.chunk_elements(index))
            term = values.float() * (TOKENS[site] / total)
            want = term if want is None else want + term
        assert torch.equal(got, want), index


def test_a_chunk_handed_over_out_of_order_is_refused() -> None:
    encoded = _encoded()
    reducer = _reducer(encoded, lambda i, acc: None)
    with pytest.raises(RuntimeError, match="handed over chunk 1 while chunk 0"):
        reducer.put("bravo", 1, memoryview(bytearray(encoded["bravo"].chunk(1))))


def test_stop_wakes_a_stream_waiting_for_the_others() -> None:
    encoded = _encoded()
    reducer = _reducer(encoded, lambda i, acc: None)
    errors: dict[str, BaseException] = {}
    waiting = _stream(reducer, "bravo", encoded["bravo"], errors)  # charlie never comes
    waiting.join(0.2)
    assert waiting.is_alive()  # it holds chunk 0 until charlie's arrives
    reducer.stop()
    waiting.join(JOIN_S)
    assert not waiting.is_alive() and isinstance(errors["bravo"], ReductionStopped)
    with pytest.raises(ReductionStopped):  # and nothing more is taken
        reducer.put("charlie", 0, memoryview(bytearray(encoded["charlie"].chunk(0))))


def test_a_failed_reduction_stops_the_others_only_once_it_no_longer_reads_their_chunks() -> None:
    """The stream that completes a chunk reduces it; while it does, a stop must not let the other
    streams go (they would reuse the buffers the reduction reads). When it fails, they end with
    ReductionStopped and the reducer keeps the cause."""
    encoded = _encoded()
    inside, release = threading.Event(), threading.Event()

    def emit(index: int, acc: torch.Tensor) -> None:
        inside.set()
        assert release.wait(JOIN_S)
        raise codec.NonFiniteError("chunk 0: made up for the test")

    reducer = _reducer(encoded, emit)
    errors: dict[str, BaseException] = {}
    first = _stream(reducer, "bravo", encoded["bravo"], errors)
    _until(lambda: "bravo" in reducer._held)  # bravo holds chunk 0 and waits
    second = _stream(reducer, "charlie", encoded["charlie"], errors)  # completes chunk 0, reduces it
    assert inside.wait(JOIN_S)
    reducer.stop()
    first.join(0.2)
    assert first.is_alive()  # its chunk is still being read
    release.set()
    for t in (first, second):
        t.join(JOIN_S)
    assert not first.is_alive() and not second.is_alive()
    assert isinstance(errors["charlie"], codec.NonFiniteError)
    assert isinstance(errors["bravo"], ReductionStopped)
    assert reducer.failure is errors["charlie"]


def test_all_contributors_local_are_reduced_without_streams() -> None:
    encoded = _encoded()
    manifests = {s: e.manifest for s, e in encoded.items()}
    local: dict[int, torch.Tensor] = {}
    Reducer(manifests, encoded, 0, manifests["alpha"].num_chunks,
            lambda i, acc: local.__setitem__(i, acc.clone())).reduce_local()
    streamed: dict[int, torch.Tensor] = {}
    reducer = _reducer(encoded, lambda i, acc: streamed.__setitem__(i, acc.clone()))
    errors: dict[str, BaseException] = {}
    for t in [_stream(reducer, s, encoded[s], errors) for s in ("bravo", "charlie")]:
        t.join(JOIN_S)
    assert not errors and sorted(local) == list(range(manifests["alpha"].num_chunks))
    assert all(torch.equal(local[i], streamed[i]) for i in local)


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + JOIN_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_a_wire_sink_gets_the_torch_sum_rounded_to_the_wire_and_its_hash() -> None:
    """For bf16 the reduction rounds in the compiled kernel (kernels.py): the bytes, hash and
    exponent are those of encoding torch's fp32 sum, which all_to_all's Emit receives."""
    encoded = _encoded()
    manifests = {s: e.manifest for s, e in encoded.items()}
    m = manifests["alpha"]
    sums: dict[int, torch.Tensor] = {}
    Reducer(manifests, encoded, 0, m.num_chunks, lambda i, acc: sums.__setitem__(i, acc.clone())).reduce_local()
    got: dict[int, tuple[bytes, bytes, int]] = {}

    def into(index: int) -> torch.Tensor:
        return torch.full((m.layout.wire.wire_bytes(m.chunk_elements(index) * m.layout.wire.itemsize),), 0xFF,
                          dtype=torch.uint8)

    def done(index: int, out: torch.Tensor, digest: bytes, exp: int) -> None:
        got[index] = (bytes(out.numpy()), digest, exp)

    reducer = Reducer(manifests, {"alpha": encoded["alpha"]}, 0, m.num_chunks, WireSink(into, done))
    errors: dict[str, BaseException] = {}
    for t in [_stream(reducer, s, encoded[s], errors) for s in ("bravo", "charlie")]:
        t.join(JOIN_S)
    assert not errors and sorted(got) == list(range(m.num_chunks))
    for index, acc in sums.items():
        want = torch.empty_like(into(index))
        digest, exp = codec.encode_chunk([acc], want, m.layout.wire)
        assert got[index] == (bytes(want.numpy()), digest, exp), index
