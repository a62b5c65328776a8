"""A receiver streams a 192 MB pseudo-gradient into its destination without a full extra copy.

Sender and receiver are separate processes (RSS is per process); the receiver preallocates its
destination, resets its RSS high-water mark, fetches, and reports how far the peak rose above the
RSS it started with. Materialising the object anywhere (a buffer of received chunks, an fp32 copy)
would add at least 1x the tensor bytes; streaming adds only what is in flight.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from pathlib import Path
from typing import Any

ELEMENTS = 96 * 1024 * 1024  # bf16 on the wire: 192 MiB; the destination is bf16 too
SHAPES = {"a": (ELEMENTS // 2 - 5,), "b": (ELEMENTS // 2 + 5,)}


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _sender(queue: Any, done: Any) -> None:
    import torch

    from peer.exchange import codec
    from tests.support.exchange import serving

    async def main() -> None:
        from peer.exchange.store import ExchangeStore

        store = ExchangeStore()
        model = {n: torch.full(s, 0.5, dtype=torch.bfloat16) for n, s in SHAPES.items()}
        await store.publish(codec.encode(model, round=1, site="s", tokens=1))
        async with serving(store) as address:
            queue.put(address)
            await asyncio.to_thread(done.wait, 60)

    asyncio.run(main())


def _receiver(address: str, queue: Any) -> None:
    import torch

    from peer.exchange import codec
    from peer.exchange.client import ExchangeClient, FetchPolicy, fetch_into

    async def main() -> tuple[int, bool]:
        client = ExchangeClient(address)
        manifest = await client.get_manifest(codec.ObjectKey(1, "s"), wait_s=10)
        assert manifest is not None
        dest = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in SHAPES.items()}  # pages touched
        Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
        before = _rss("VmRSS")
        await fetch_into(manifest, [client], dest, FetchPolicy.local_test())
        growth = _rss("VmHWM") - before
        await client.close()
        return growth, all(bool((t == 0.5).all()) for t in dest.values())

    queue.put(asyncio.run(main()))


def test_receiver_peak_rss_stays_far_below_a_second_copy() -> None:
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    sender = ctx.Process(target=_sender, args=(queue, done))
    sender.start()
    try:
        address = queue.get(timeout=60)
        receiver = ctx.Process(target=_receiver, args=(address, queue))
        receiver.start()
        growth, exact = queue.get(timeout=120)
        receiver.join(30)
    finally:
        done.set()
        sender.join(30)
        if sender.is_alive():
            sender.kill()
    tensor_bytes = ELEMENTS * 2
    print(f"receiver peak RSS growth: {growth / tensor_bytes:.3f}x the tensor bytes")
    assert exact
    assert growth < 0.5 * tensor_bytes, f"receiver RSS grew {growth / tensor_bytes:.2f}x the tensor bytes"
