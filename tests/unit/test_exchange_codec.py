"""Codec: round trips over shapes and wire dtypes, manifest rules, refusal of bad input."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.exchange import codec, decoding, finite, protoconv
from peer.exchange.codec import WireDtype
from tests.support.exchange import rehashed

shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)
models = st.dictionaries(st.text("abcxyz._", min_size=1, max_size=6), shapes, min_size=0, max_size=5)


def _model(shape_by_name: dict[str, tuple[int, ...]], seed: int, magnitude: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * magnitude for n, s in shape_by_name.items()}


def _expected(t: torch.Tensor, wire: WireDtype, exp: int) -> torch.Tensor:
    """The value the wire format promises for `t` encoded with scale exponent `exp`."""
    return (t * 2.0**exp).to(wire.torch_dtype).float() * 2.0**-exp


@settings(max_examples=60, deadline=None)
@given(
    models,
    st.sampled_from([w for w in WireDtype if not w.quantized]),  # int8/int4: test_exchange_quantized.py
    st.integers(1, 16).map(lambda k: 4 * k),
    st.integers(0, 2**16),
    st.sampled_from([1e-3, 1.0, 1e5, 1e30]),
)
def test_round_trip_matches_the_wire_dtype(shape_by_name, wire, chunk_size, seed, magnitude) -> None:
    src = _model(shape_by_name, seed, magnitude)
    enc = codec.encode(src, round=3, site="s", tokens=5, wire=wire, chunk_size=chunk_size)
    m = enc.manifest
    assert m.layout.total_bytes == sum(t.numel() for t in src.values()) * wire.itemsize
    assert m.num_chunks == math.ceil(m.layout.total_bytes / chunk_size)
    assert protoconv.manifest_from_proto(protoconv.manifest_to_proto(m)) == m
    dest = {n: torch.full_like(t, float("nan")) for n, t in src.items()}
    decoding.decode(enc, dest)
    for entry in m.layout.tensors:
        flat_src, flat_dst = src[entry.name].reshape(-1), dest[entry.name].reshape(-1)
        for i in range(entry.numel):  # per element: the scale is per chunk, elements may span chunks
            exp = m.scale_exps[(entry.offset + i * wire.itemsize) // chunk_size]
            assert flat_dst[i] == _expected(flat_src[i], wire, exp), (entry.name, i)
        assert bool(torch.isfinite(flat_dst).all())
    if wire is not WireDtype.FP16:
        assert enc.scaled_chunks == 0


def test_layout_is_sorted_by_name_row_major_without_padding() -> None:
    src = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.tensor(7.0), "c": torch.zeros(0, 4)}
    enc = codec.encode(src, round=1, site="s", tokens=1, wire=WireDtype.FP32, chunk_size=8)
    assert [(e.name, e.offset) for e in enc.manifest.layout.tensors] == [("a", 0), ("b", 4), ("c", 28)]
    values = enc.data.view(torch.float32).tolist()
    assert values == [7.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert [len(enc.chunk(i)) for i in range(enc.manifest.num_chunks)] == [8, 8, 8, 4]


def test_fp16_scales_large_chunks_instead_of_overflowing_and_reports_it() -> None:
    src = {"big": torch.tensor([1e6, -3e5, 1.0, 2.0]), "small": torch.tensor([0.5, 0.25, 1.0, 3.0])}
    enc = codec.encode(src, round=1, site="s", tokens=1, wire=WireDtype.FP16, chunk_size=8)
    assert enc.manifest.scale_exps == (-4, 0)  # 1e6 / 2^4 = 62500 <= 65504 < 1e6 / 2^3
    assert enc.scaled_chunks == 1
    dest = {n: torch.empty_like(t) for n, t in src.items()}
    decoding.decode(enc, dest)
    assert torch.equal(dest["small"], src["small"])
    assert torch.allclose(dest["big"], src["big"], rtol=2**-10)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("wire", list(WireDtype))
def test_non_finite_pseudo_gradient_is_refused_at_encode(bad: float, wire: WireDtype) -> None:
    with pytest.raises(codec.NonFiniteError, match=r"\['w'\]"):
        codec.encode({"v": torch.ones(8), "w": torch.tensor([1.0, bad])}, round=1, site="s", tokens=1, wire=wire)


def test_bf16_overflow_to_inf_is_refused() -> None:
    # Finite in fp32 but rounds up to Inf in bf16: caught after conversion, not silently sent.
    with pytest.raises(codec.NonFiniteError, match=r"\['w'\] overflow BF16"):
        codec.encode({"w": torch.tensor([3.4e38])}, round=1, site="s", tokens=1)


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float64]),
    size=st.integers(0, 3000),
    specials=st.lists(st.tuples(st.integers(0, 2999), st.sampled_from(["nan", "inf", "-inf", "max", "-max"])),
                      max_size=4),
)
def test_is_finite_agrees_with_an_element_by_element_check(dtype: torch.dtype, size: int,
                                                           specials: list[tuple[int, str]]) -> None:
    # The fast path sums: a sum of huge finite values overflows ("max") and must not read as Inf,
    # and one NaN or Inf among thousands must never sum to something finite.
    t = torch.randn(size, generator=torch.Generator().manual_seed(size)).to(dtype)
    biggest = torch.finfo(dtype).max
    for index, what in specials:
        if index < size:
            t[index] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "max": biggest, "-max": -biggest}[what]
    assert finite.is_finite(t) == bool(torch.isfinite(t).all())


def test_is_finite_of_finite_values_whose_sum_overflows() -> None:
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        huge = torch.full((4096,), torch.finfo(dtype).max, dtype=dtype)
        assert finite.is_finite(huge)
        huge[4000] = math.nan
        assert not finite.is_finite(huge)


def _malicious_nan_object() -> codec.Encoded:
    """What a broken sender could publish: correct hashes over a NaN."""
    enc = codec.encode({"w": torch.ones(4)}, round=1, site="s", tokens=1, chunk_size=4)
    enc.data.view(torch.bfloat16)[3] = float("nan")
    return rehashed(enc)


def test_non_finite_decoded_chunk_is_refused() -> None:
    enc = _malicious_nan_object()
    enc.manifest.validate()  # the transport is fine: only the content is bad
    with pytest.raises(codec.NonFiniteError, match="chunk 1"):
        decoding.decode(enc, {"w": torch.empty(4)})


def test_chunk_verification_catches_length_and_content() -> None:
    enc = codec.encode({"w": torch.randn(10)}, round=1, site="s", tokens=1, chunk_size=8)
    good = bytes(codec.as_memoryview(enc.chunk(1)))
    codec.verify_chunk(enc.manifest, 1, good)
    flipped = bytes([good[0] ^ 1]) + good[1:]
    for index, data, reason in [(1, flipped, "hash"), (1, good[:-2], "bytes"), (2, good, "bytes"), (9, good, "index")]:
        with pytest.raises(codec.ChunkError, match=reason):
            codec.verify_chunk(enc.manifest, index, data)


def test_chunk_verification_of_the_pieces_a_chunk_was_received_into() -> None:
    # The bulk plane receives a chunk straight into the destination tensors it spans (chunk_targets).
    enc = codec.encode({"w": torch.randn(10)}, round=1, site="s", tokens=1, chunk_size=16)
    good = bytes(codec.as_memoryview(enc.chunk(0)))
    pieces = [memoryview(good[:3]), memoryview(good[3:5]), memoryview(good[5:])]
    codec.verify_chunk(enc.manifest, 0, pieces)
    flipped = [memoryview(bytes([good[0] ^ 1]) + good[1:3]), *pieces[1:]]
    for data, reason in [(flipped, "hash"), (pieces[:2], "bytes"), ([*pieces[1:], pieces[0]], "hash")]:
        with pytest.raises(codec.ChunkError, match=reason):
            codec.verify_chunk(enc.manifest, 0, data)


@pytest.mark.parametrize(
    "dest, reason",
    [
        ({"w": torch.empty(4, 3)}, "shape"),
        ({"w": torch.empty(3, 4), "x": torch.empty(1)}, "extra"),
        ({}, "missing"),
        ({"w": torch.empty(3, 4, dtype=torch.int32)}, "dtype int32, layout says float32"),
        ({"w": torch.empty(3, 4, dtype=torch.float64)}, "dtype float64, layout says float32"),
        ({"w": torch.empty(3, 4, dtype=torch.float16)}, r"dtype float16, layout says float32 \(or the wire's bfloat16\)"),
        ({"w": torch.empty(4, 3).t()}, "contiguous"),
    ],
)
def test_destination_must_match_the_layout(dest: dict[str, torch.Tensor], reason: str) -> None:
    enc = codec.encode({"w": torch.randn(3, 4)}, round=1, site="s", tokens=1)
    with pytest.raises(codec.LayoutMismatch, match=reason):
        decoding.decode(enc, dest)


def test_a_destination_in_the_wire_dtype_holds_the_wire_values_exactly() -> None:
    src = {"w": torch.randn(3, 4) * 1e3}
    dest = {"w": torch.full((3, 4), float("nan"), dtype=torch.bfloat16)}
    decoding.decode(codec.encode(src, round=1, site="s", tokens=1), dest)
    assert torch.equal(dest["w"], src["w"].bfloat16())
    # fp16 chunks may carry a scale their values exceed fp16 by: decoded into the parameter's dtype only.
    fp16 = codec.encode(src, round=1, site="s", tokens=1, wire=codec.WireDtype.FP16)
    with pytest.raises(codec.LayoutMismatch, match="dtype float16, layout says float32$"):
        decoding.decode(fp16, {"w": torch.empty(3, 4, dtype=torch.float16)})


def test_decode_writes_into_the_destination_in_place() -> None:
    src = {"w": torch.randn(5, 7, dtype=torch.float64)}
    enc = codec.encode(src, round=1, site="s", tokens=1, chunk_size=12)
    assert enc.manifest.layout.tensors[0].dtype == "float64"
    dest = {"w": torch.zeros(5, 7, dtype=torch.float64)}
    before = dest["w"].data_ptr()
    decoding.decode(enc, dest)
    assert dest["w"].data_ptr() == before
    assert torch.equal(dest["w"], src["w"].to(torch.bfloat16).double())


def _tampered() -> list[tuple[str, dict[str, object]]]:
    return [
        ("chunk_size", {"chunk_size": 6}),
        ("chunk_size", {"chunk_size": codec.MAX_CHUNK_BYTES + 4}),
        ("chunk hashes", {"chunk_hashes": ()}),
        ("root_hash", {"root_hash": b"\0" * 32}),
        ("scale", {"scale_exps": (-3, 0, 0)}),  # bf16 never scales
        ("range", {"range_start": 4}),
        ("range", {"range_end": 10_000}),
        ("empty site", {"key": codec.ObjectKey(1, "")}),
    ]


@pytest.mark.parametrize("reason, change", _tampered())
def test_manifest_rules_are_enforced(reason: str, change: dict[str, object]) -> None:
    enc = codec.encode({"a": torch.randn(2), "b": torch.randn(3)}, round=1, site="s", tokens=1, chunk_size=8)
    with pytest.raises(codec.ManifestError, match=reason):
        dataclasses.replace(enc.manifest, **change).validate()  # type: ignore[arg-type]


def test_manifest_layout_rules_are_enforced_on_the_proto() -> None:
    enc = codec.encode({"a": torch.randn(2), "b": torch.randn(3)}, round=1, site="s", tokens=1, chunk_size=8)
    for mutate, reason in [
        (lambda p: setattr(p.tensors[1], "offset", 6), "offset"),
        (lambda p: setattr(p.tensors[1], "name", "a"), "duplicate"),
        (lambda p: p.tensors[0].shape.append(2), "offset"),
        (lambda p: setattr(p, "layout_bytes", 12), "layout_bytes"),
        (lambda p: setattr(p, "wire_dtype", 0), "wire dtype"),
        (lambda p: setattr(p.key, "kind", 9), "kind"),
        (lambda p: setattr(p.tensors[0], "dtype", "int8"), "dtype"),
    ]:
        msg = protoconv.manifest_to_proto(enc.manifest)
        mutate(msg)
        with pytest.raises(codec.ManifestError, match=reason):
            protoconv.manifest_from_proto(msg)


def test_encoding_reads_non_contiguous_sources_correctly() -> None:
    base = torch.randn(6, 4)
    enc = codec.encode({"t": base.t()}, round=1, site="s", tokens=1, wire=WireDtype.FP32, chunk_size=8)
    dest = {"t": torch.empty(4, 6)}
    decoding.decode(enc, dest)
    assert torch.equal(dest["t"], base.t())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA/ROCm device here")
@pytest.mark.parametrize("wire", list(WireDtype))
def test_accelerator_tensors_encode_and_decode_in_place(wire: WireDtype) -> None:
    src = {"w": torch.randn(1000, 3, device="cuda") * 1e5, "b": torch.randn(7, device="cuda")}
    enc = codec.encode(src, round=1, site="s", tokens=1, wire=wire, chunk_size=64)
    assert enc.data.device.type == "cpu"
    dest = {n: torch.empty_like(t) for n, t in src.items()}
    decoding.decode(enc, dest)
    on_cpu = {n: t.cpu() for n, t in src.items()}
    want = {n: torch.empty_like(t) for n, t in on_cpu.items()}
    decoding.decode(codec.encode(on_cpu, round=1, site="s", tokens=1, wire=wire, chunk_size=64), want)
    for n in src:
        assert dest[n].device.type == "cuda" and torch.equal(dest[n].cpu(), want[n])
