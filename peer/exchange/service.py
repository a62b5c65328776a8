"""Thin gRPC servicer of sitemesh.v1.Exchange: decodes requests, reads the store, streams chunks.

Every refusal is a status with the reason (NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION,
OUT_OF_RANGE, RESOURCE_EXHAUSTED) and touches nothing, so a bad request never stops the server serving others. The node
registers it on the peer's server:

    server = channels.new_server(); add_exchange_service(server, store); channels.bind(server, addr)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import grpc

from peer.exchange import chunkwire, codec, protoconv
from peer.exchange.store import AnnouncementRefused, ExchangeStore, MeanInputs, reduced_over
from peer.gen.sitemesh.v1 import common_pb2, exchange_pb2, exchange_pb2_grpc

SERVICE = "sitemesh.v1.Exchange"
# A long poll never holds a server stream longer than this, whatever the client asks.
MAX_WAIT_S = 60.0


class BulkTickets(Protocol):
    """What OpenBulk needs of a data plane: a ticket for one connection to it. bulk.BulkServer is
    one; declared here because the plane imports this module (Refusal, resolve_fetch), not the
    other way round."""

    def ticket(self) -> exchange_pb2.BulkTicket:
        """A one-connection ticket; Refusal when none can be issued now."""
        ...


class ExchangeServicer(exchange_pb2_grpc.ExchangeServicer):
    def __init__(self, store: ExchangeStore, bulk: BulkTickets | None = None) -> None:
        self._store = store
        self.bulk = bulk
        """This peer's bulk data plane (OpenBulk hands out its tickets), None: FetchChunks only."""

    async def Announce(self, request: exchange_pb2.Manifest, context: grpc.aio.ServicerContext) -> common_pb2.Accepted:
        try:
            manifest = protoconv.manifest_from_proto(request)
        except codec.ManifestError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"manifest refused: {err}")
        try:
            await self._store.record_announcement(manifest)
        except AnnouncementRefused as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        return common_pb2.Accepted()

    async def GetManifest(
        self, request: exchange_pb2.ManifestRequest, context: grpc.aio.ServicerContext
    ) -> exchange_pb2.Manifest:
        key = await _key(request.key, context)
        inputs: MeanInputs = tuple(sorted((c.site, c.address, c.root_hash) for c in request.contributors))
        accept = None
        if inputs:
            if key.kind is not codec.ObjectKind.MEAN_SHARD:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{key}: contributors name a mean shard's inputs")

            def accept(held: codec.Encoded) -> bool:
                return reduced_over(held.manifest, inputs)

            held = self._store.get(key)
            if (held is None or not accept(held)) and self._store.on_mean_request is not None:
                self._store.on_mean_request(key.round, inputs)
        newer = self._store.superseded_by(key)
        if newer is not None:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, f"{key} is superseded here by the state of round {newer}")
        encoded = await self._store.wait_for(key, min(request.wait_ms / 1000, MAX_WAIT_S), accept)
        if encoded is None:
            what = f" reduced over {[s for s, _, _ in inputs]}" if inputs else ""
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no {key}{what} here")
            raise AssertionError("unreachable: context.abort raises")
        return protoconv.manifest_to_proto(encoded.manifest)

    async def FetchChunks(
        self, request: exchange_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[chunkwire.WireChunk]:
        try:
            encoded = resolve_fetch(self._store, request)
        except Refusal as err:
            await context.abort(err.code, err.message)
            return  # unreachable: context.abort raises
        kind = encoded.manifest.key.kind.name.lower()
        for index in range(request.first_chunk, request.end_chunk):
            # A view, not a copy: chunkwire.serialize copies it once into the message.
            view = codec.as_memoryview(encoded.chunk(index))
            self._store.sent_bytes[kind] = self._store.sent_bytes.get(kind, 0) + view.nbytes
            yield chunkwire.WireChunk(index, view)

    async def OpenBulk(self, request: exchange_pb2.BulkRequest, context: grpc.aio.ServicerContext
                       ) -> exchange_pb2.BulkTicket:
        if self.bulk is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this peer serves no bulk data plane: fetch with FetchChunks")
            raise AssertionError("unreachable: context.abort raises")
        try:
            return self.bulk.ticket()
        except Refusal as err:
            await context.abort(err.code, err.message)
            raise AssertionError("unreachable: context.abort raises") from None


class Refusal(Exception):
    """A request refused with a status and a one-line reason (gRPC aborts with it; the bulk plane
    sends it as an error frame)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code, self.message = code, message


def resolve_fetch(store: ExchangeStore, request: exchange_pb2.FetchRequest) -> codec.Encoded:
    """The object a FetchRequest may stream from `store`, or Refusal saying why not (both planes)."""
    try:
        key = protoconv.key_from_proto(request.key)
    except codec.ManifestError as err:
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
    encoded = store.get(key)
    if encoded is None:
        raise Refusal(grpc.StatusCode.NOT_FOUND, f"no {key} here")
    manifest = encoded.manifest
    if request.root_hash != manifest.root_hash:
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"{key}: root hash differs from the object held here")
    if not request.first_chunk <= request.end_chunk <= manifest.num_chunks:
        raise Refusal(grpc.StatusCode.OUT_OF_RANGE,
                      f"{key}: chunks [{request.first_chunk}, {request.end_chunk}) outside [0, {manifest.num_chunks})")
    return encoded


async def _key(msg: exchange_pb2.ObjectKey, context: grpc.aio.ServicerContext) -> codec.ObjectKey:
    try:
        return protoconv.key_from_proto(msg)
    except codec.ManifestError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        raise  # unreachable: abort raises; keeps type checkers from seeing an implicit None


def add_exchange_service(
    server: grpc.aio.Server, store: ExchangeStore, bulk: BulkTickets | None = None
) -> ExchangeServicer:
    """Registers the Exchange service on `server` (before it starts); returns the servicer.
    `bulk`: a started BulkServer whose tickets OpenBulk hands out (None: FetchChunks only).

    The generated add_ExchangeServicer_to_server, except that chunks are serialised by chunkwire
    (the same bytes with one copy fewer, see that module).
    """
    return register_servicer(server, ExchangeServicer(store, bulk))


def register_servicer(server: grpc.aio.Server, servicer: ExchangeServicer) -> ExchangeServicer:
    """Registers `servicer` (an ExchangeServicer or a test double deriving from it) on `server`."""
    handlers = {
        "Announce": grpc.unary_unary_rpc_method_handler(
            servicer.Announce,
            request_deserializer=exchange_pb2.Manifest.FromString,
            response_serializer=common_pb2.Accepted.SerializeToString,
        ),
        "GetManifest": grpc.unary_unary_rpc_method_handler(
            servicer.GetManifest,
            request_deserializer=exchange_pb2.ManifestRequest.FromString,
            response_serializer=exchange_pb2.Manifest.SerializeToString,
        ),
        "FetchChunks": grpc.unary_stream_rpc_method_handler(
            servicer.FetchChunks,
            request_deserializer=exchange_pb2.FetchRequest.FromString,
            response_serializer=chunkwire.serialize,
        ),
        "OpenBulk": grpc.unary_unary_rpc_method_handler(
            servicer.OpenBulk,
            request_deserializer=exchange_pb2.BulkRequest.FromString,
            response_serializer=exchange_pb2.BulkTicket.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
    return servicer
