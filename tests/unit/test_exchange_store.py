"""Exchange store: publish is immutable per key, waits wake on publish, old rounds are dropped."""

from __future__ import annotations

import asyncio

import pytest
import torch

from peer.exchange import codec
from peer.exchange.store import ExchangeStore


def _enc(round_: int, site: str, seed: int = 0) -> codec.Encoded:
    g = torch.Generator().manual_seed(seed)
    return codec.encode({"w": torch.randn(10, generator=g)}, round=round_, site=site, tokens=3, chunk_size=8)


def test_publish_is_idempotent_but_never_replaces_content() -> None:
    async def scenario() -> None:
        store = ExchangeStore()
        first = _enc(1, "a", seed=0)
        await store.publish(first)
        await store.publish(first)
        with pytest.raises(ValueError, match="another root hash"):
            await store.publish(_enc(1, "a", seed=1))
        assert store.get(first.manifest.key) is first

    asyncio.run(scenario())


def test_wait_for_returns_at_once_when_held_and_wakes_on_publish() -> None:
    async def scenario() -> None:
        store = ExchangeStore()
        held, later = _enc(1, "a"), _enc(2, "a")
        await store.publish(held)
        assert await store.wait_for(held.manifest.key, 0.0) is held
        assert await store.wait_for(later.manifest.key, 0.0) is None
        waiter = asyncio.ensure_future(store.wait_for(later.manifest.key, 5.0))
        await asyncio.sleep(0)
        assert not waiter.done()
        await store.publish(later)
        assert await waiter is later
        await store.record_announcement(later.manifest)
        assert await store.wait_announced(later.manifest.key, 0.0) == later.manifest

    asyncio.run(scenario())


def test_drop_rounds_before_forgets_only_older_rounds() -> None:
    async def scenario() -> None:
        store = ExchangeStore()
        for r in (1, 2, 3):
            await store.publish(_enc(r, "a"))
        await store.record_announcement(_enc(1, "b").manifest)
        assert store.drop_rounds_before(3) == 3
        assert store.get(codec.ObjectKey(3, "a")) is not None
        assert store.get(codec.ObjectKey(2, "a")) is None and store.announced(codec.ObjectKey(1, "b")) is None

    asyncio.run(scenario())


def _shard(inputs: tuple[tuple[str, str, bytes], ...], seed: int = 0) -> codec.Encoded:
    e = _enc(1, "a", seed)
    m = e.manifest
    key = codec.ObjectKey(1, "a", codec.ObjectKind.MEAN_SHARD)
    manifest = codec.build_manifest(key, m.layout, m.range_start, m.range_end, m.chunk_size, m.chunk_hashes,
                                    m.scale_exps, 3, [s for s, _, _ in inputs], [r for _, _, r in inputs])
    return codec.Encoded(manifest, e.data)


def test_a_mean_shard_waiter_takes_only_a_shard_reduced_over_its_inputs() -> None:
    old = (("a", "", b"1" * 32), ("b", "x:1", b"2" * 32))
    new = (("a", "", b"1" * 32), ("b", "x:1", b"3" * 32))  # b retrained the round: another root

    async def scenario() -> None:
        from peer.exchange.store import reduced_over

        store = ExchangeStore()
        await store.publish(_shard(old))
        key = codec.ObjectKey(1, "a", codec.ObjectKind.MEAN_SHARD)
        assert await store.wait_for(key, 0.05, lambda e: reduced_over(e.manifest, new)) is None
        waiter = asyncio.ensure_future(store.wait_for(key, 5.0, lambda e: reduced_over(e.manifest, new)))
        await asyncio.sleep(0.01)
        await store.publish(_shard(new, seed=1), replace=True)  # a re-reduction replaces the old shard
        got = await waiter
        assert got is not None and reduced_over(got.manifest, new)

    asyncio.run(scenario())
