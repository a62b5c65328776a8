"""int8/int4 wire formats: the chunk layout of exchange.proto, the rounding bound, and refusal of
bad input (wrong length, NaN/Inf/0 scales, a format this peer does not know)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.exchange import codec, decoding, protoconv
from peer.exchange.codec import WireDtype
from peer.exchange.quantized import GROUP as QUANT_GROUP
from peer.gen.sitemesh.v1 import exchange_pb2 as pb
from tests.support.exchange import decoded, rehashed

QUANTIZED = [WireDtype.INT8, WireDtype.INT4]


def _model(sizes: dict[str, int], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(k, generator=g) * 1e-3 for n, k in sizes.items()}


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcde"), st.integers(0, 700), min_size=1, max_size=4),
    st.sampled_from(QUANTIZED),
    st.integers(1, 200).map(lambda k: 4 * k),
    st.integers(0, 1000),
)
def test_round_trip_is_within_half_a_step_of_each_group(sizes, wire, chunk_size, seed) -> None:
    src = _model(sizes, seed)
    enc = codec.encode(src, round=2, site="s", tokens=1, wire=wire, chunk_size=chunk_size)
    m = enc.manifest
    assert m.layout.total_bytes == sum(sizes.values())
    assert enc.data.numel() == m.wire_nbytes == sum(
        wire.wire_bytes(b - a) for a, b in map(m.chunk_bounds, range(m.num_chunks)))
    assert protoconv.manifest_from_proto(protoconv.manifest_to_proto(m)) == m
    out = decoded(enc)
    flat_src = torch.cat([src[e.name] for e in m.layout.tensors]) if m.layout.tensors else torch.empty(0)
    flat_out = torch.cat([out[e.name] for e in m.layout.tensors]) if m.layout.tensors else torch.empty(0)
    for i in range(m.num_chunks):  # groups restart at every chunk
        a, b = m.chunk_bounds(i)
        for g in range(a, b, QUANT_GROUP):
            x, y = flat_src[g : min(g + QUANT_GROUP, b)], flat_out[g : min(g + QUANT_GROUP, b)]
            step = float(x.abs().max()) / wire.qmax
            assert float((x - y).abs().max()) <= step / 2 * (1 + 1e-5) + 1e-30


@pytest.mark.parametrize("wire", QUANTIZED)
def test_bytes_per_element_as_the_proto_says(wire: WireDtype) -> None:
    enc = codec.encode({"w": torch.randn(1 << 16)}, round=1, site="s", tokens=1, wire=wire)
    per_element = enc.data.numel() / (1 << 16)
    assert per_element == (1 if wire is WireDtype.INT8 else 0.5) + 4 / QUANT_GROUP


@pytest.mark.parametrize("wire", QUANTIZED)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_bad_scale_is_refused_and_nothing_is_applied(wire: WireDtype, bad: float) -> None:
    enc = codec.encode({"w": torch.randn(1000)}, round=1, site="s", tokens=1, wire=wire, chunk_size=512)
    scale = torch.tensor([bad], dtype=torch.float32).view(torch.uint8)
    enc.chunk(1)[4:8].copy_(scale)  # the second group's scale of chunk 1
    enc = rehashed(enc)  # a buggy sender: the hashes are right, the content is not
    dest = {"w": torch.full((1000,), 7.0)}
    with pytest.raises(codec.ScaleError, match="chunk 1: a group scale is NaN, Inf or not > 0"):
        decoding.decode(enc, dest)
    assert bool((dest["w"][512:] == 7.0).all())  # the bad chunk wrote nothing


@pytest.mark.parametrize("wire", QUANTIZED)
def test_a_chunk_of_another_format_is_refused(wire: WireDtype) -> None:
    other = WireDtype.INT4 if wire is WireDtype.INT8 else WireDtype.INT8
    src = {"w": torch.randn(1000)}
    mine = codec.encode(src, round=1, site="s", tokens=1, wire=wire, chunk_size=512)
    theirs = codec.encode(src, round=1, site="s", tokens=1, wire=other, chunk_size=512)
    with pytest.raises(codec.ChunkError, match=f"a {wire.name} chunk of this manifest has"):
        codec.verify_chunk(mine.manifest, 0, codec.as_memoryview(theirs.chunk(0)))
    bf16 = codec.encode(src, round=1, site="s", tokens=1, chunk_size=512)
    with pytest.raises(codec.ChunkError, match="another wire format"):
        codec.verify_chunk(mine.manifest, 0, codec.as_memoryview(bf16.chunk(0)))


def test_a_format_this_peer_does_not_know_is_refused_with_the_known_ones() -> None:
    enc = codec.encode({"w": torch.randn(10)}, round=1, site="s", tokens=1, wire=WireDtype.INT4)
    msg = protoconv.manifest_to_proto(enc.manifest)
    msg.wire_dtype = 9
    with pytest.raises(codec.ManifestError, match=r"unsupported wire dtype 9: this peer decodes \['bf16'.*'int4', 'sparse'\]"):
        protoconv.manifest_from_proto(msg)
    assert pb.WIRE_DTYPE_INT4 == WireDtype.INT4.value
    with pytest.raises(codec.CodecError, match="unknown wire format 'int3'"):
        WireDtype.named("int3")


@pytest.mark.parametrize("wire", QUANTIZED)
def test_non_finite_input_is_refused_at_encode(wire: WireDtype) -> None:
    with pytest.raises(codec.NonFiniteError):
        codec.encode({"w": torch.tensor([1.0, math.nan])}, round=1, site="s", tokens=1, wire=wire)


def test_zero_groups_decode_to_zero_with_a_positive_scale() -> None:
    enc = codec.encode({"w": torch.zeros(300)}, round=1, site="s", tokens=1, wire=WireDtype.INT4)
    assert bool((decoded(enc)["w"] == 0).all())
