"""Thin gRPC servicer of sitemesh.v1.Exchange: decodes requests, reads the store, streams chunks.

Every refusal is a status with the reason (NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION,
OUT_OF_RANGE) and touches nothing, so a bad request never stops the server serving others. The node
registers it on the peer's server:

    server = channels.new_server(); add_exchange_service(server, store); channels.bind(server, addr)
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from peer.exchange import codec
from peer.exchange.store import ExchangeStore
from peer.gen.sitemesh.v1 import common_pb2, exchange_pb2, exchange_pb2_grpc

# A long poll never holds a server stream longer than this, whatever the client asks.
MAX_WAIT_S = 60.0


class ExchangeServicer(exchange_pb2_grpc.ExchangeServicer):
    def __init__(self, store: ExchangeStore) -> None:
        self._store = store

    async def Announce(self, request: exchange_pb2.Manifest, context: grpc.aio.ServicerContext) -> common_pb2.Accepted:
        try:
            manifest = codec.manifest_from_proto(request)
        except codec.ManifestError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"manifest refused: {err}")
        await self._store.record_announcement(manifest)
        return common_pb2.Accepted()

    async def GetManifest(
        self, request: exchange_pb2.ManifestRequest, context: grpc.aio.ServicerContext
    ) -> exchange_pb2.Manifest:
        key = await _key(request.key, context)
        encoded = await self._store.wait_for(key, min(request.wait_ms / 1000, MAX_WAIT_S))
        if encoded is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no {key} here")
        return codec.manifest_to_proto(encoded.manifest)

    async def FetchChunks(
        self, request: exchange_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[exchange_pb2.Chunk]:
        key = await _key(request.key, context)
        encoded = self._store.get(key)
        if encoded is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no {key} here")
        manifest = encoded.manifest
        if request.root_hash != manifest.root_hash:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"{key}: root hash differs from the object held here"
            )
        if not request.first_chunk <= request.end_chunk <= manifest.num_chunks:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"{key}: chunks [{request.first_chunk}, {request.end_chunk}) outside [0, {manifest.num_chunks})",
            )
        for index in range(request.first_chunk, request.end_chunk):
            # bytes(): protobuf needs its own copy; one chunk at a time, never the whole object.
            yield exchange_pb2.Chunk(index=index, data=bytes(codec.as_memoryview(encoded.chunk(index))))


async def _key(msg: exchange_pb2.ObjectKey, context: grpc.aio.ServicerContext) -> codec.ObjectKey:
    try:
        return codec.key_from_proto(msg)
    except codec.ManifestError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        raise  # unreachable: abort raises; keeps type checkers from seeing an implicit None


def add_exchange_service(server: grpc.aio.Server, store: ExchangeStore) -> ExchangeServicer:
    """Registers the Exchange service on `server` (before it starts); returns the servicer."""
    servicer = ExchangeServicer(store)
    exchange_pb2_grpc.add_ExchangeServicer_to_server(servicer, server)
    return servicer
