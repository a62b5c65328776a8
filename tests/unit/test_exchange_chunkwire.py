"""chunkwire writes and reads exactly the protobuf encoding of sitemesh.v1.Chunk."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peer.exchange import chunkwire
from peer.gen.sitemesh.v1 import exchange_pb2

indexes = st.integers(0, 2**32 - 1)
payloads = st.binary(max_size=300)


@given(indexes, payloads)
def test_serialize_matches_the_generated_class(index: int, data: bytes) -> None:
    wire = chunkwire.serialize(chunkwire.WireChunk(index, memoryview(data)))
    assert wire == exchange_pb2.Chunk(index=index, data=data).SerializeToString()


@given(indexes, payloads)
def test_parse_reads_what_the_generated_class_writes(index: int, data: bytes) -> None:
    parsed = chunkwire.parse(exchange_pb2.Chunk(index=index, data=data).SerializeToString())
    assert (parsed.index, bytes(parsed.data)) == (index, data)


def test_parse_follows_protobuf_rules_for_order_repeats_and_unknown_fields() -> None:
    first = exchange_pb2.Chunk(index=3, data=b"old").SerializeToString()
    unknown = b"\x18\x07" + b"\x22\x02hi" + b"\x2d\x01\x02\x03\x04" + b"\x31" + bytes(8)  # fields 3-6
    data_first = exchange_pb2.Chunk(data=b"new").SerializeToString() + exchange_pb2.Chunk(index=9).SerializeToString()
    raw = first + unknown + data_first
    reference = exchange_pb2.Chunk.FromString(raw)
    assert (reference.index, reference.data) == (9, b"new")
    parsed = chunkwire.parse(raw)
    assert (parsed.index, bytes(parsed.data)) == (9, b"new")


@pytest.mark.parametrize(
    "raw",
    [
        b"\x08",  # varint cut off
        b"\x12\x05abc",  # data longer than the message
        b"\x08" + b"\xff" * 11,  # varint longer than 64 bits
        b"\x0b",  # group wire type (3): not in proto3
        b"\x2d\x01",  # fixed32 cut off
    ],
)
def test_malformed_messages_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        chunkwire.parse(raw)
