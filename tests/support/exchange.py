"""Exchange servers on loopback for tests: a real servicer on port 0, torn down on exit.

    async with serving(store) as address: client = ExchangeClient(address)
    async with serving_bulk(store) as (address, bulk): ...   # with a bulk data plane on bulk.port
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import torch

from peer.exchange import codec, decoding
from peer.exchange.bulk import BulkServer
from peer.exchange.service import ExchangeServicer, register_servicer
from peer.exchange.store import ExchangeStore
from peer.transport import channels


@contextlib.asynccontextmanager
async def serving(
    store: ExchangeStore, servicer: ExchangeServicer | None = None, bulk: bool = True
) -> AsyncIterator[str]:
    """Serves `store` (or a custom servicer, e.g. a misbehaving test double) on 127.0.0.1:port,
    with a bulk data plane unless `bulk` is False (clients then fall back to FetchChunks)."""
    async with serving_bulk(store, servicer, BulkServer(store) if bulk else None) as (address, _):
        yield address


@contextlib.asynccontextmanager
async def serving_bulk(
    store: ExchangeStore,
    servicer: ExchangeServicer | None = None,
    bulk: BulkServer | None = None,
    creds: channels.Credentials = channels.PLAINTEXT,
) -> AsyncIterator[tuple[str, BulkServer | None]]:
    """`serving` with `bulk` (a BulkServer not yet started, or None: no bulk plane) as its bulk data
    plane, yielding it too (its port, to put a proxy before it)."""
    servicer = servicer or ExchangeServicer(store)
    if bulk is not None:
        bulk.start()
    servicer.bulk = bulk
    server = channels.new_server()
    register_servicer(server, servicer)
    port = channels.bind(server, "127.0.0.1:0", creds)
    await server.start()
    try:
        yield f"127.0.0.1:{port}", bulk
    finally:
        await server.stop(None)
        if bulk is not None:
            bulk.close()


def random_model(seed: int, sizes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in sizes.items()}


def decoded(encoded: codec.Encoded) -> dict[str, torch.Tensor]:
    """What a receiver must end up with: the local decode of the published object."""
    out = {e.name: torch.empty(e.shape) for e in encoded.manifest.layout.tensors}
    decoding.decode(encoded, out)
    return out


def rehashed(encoded: codec.Encoded) -> codec.Encoded:
    """`encoded` with its manifest rebuilt from its (possibly tampered) bytes: what a sender with a
    bug, not a flaky link, would publish. Transport checks pass; only the content can be refused."""
    m = encoded.manifest
    hashes = [codec.chunk_hash(codec.as_memoryview(encoded.chunk(i))) for i in range(m.num_chunks)]
    manifest = codec.build_manifest(m.key, m.layout, m.range_start, m.range_end, m.chunk_size, hashes,
                                    m.scale_exps, m.tokens, m.contributors)  # fmt: skip
    return codec.Encoded(manifest, encoded.data)
