"""The sparse wire format: the chunk layout of exchange.proto ("Sparse chunks"), what it keeps and
how it rounds, its size, and the refusal of every malformed payload (indices out of range,
unsorted or repeated, bad scales, non-zero padding, wrong lengths, unsupported parameters)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.exchange import codec, decoding, protoconv, sparse
from peer.exchange.codec import WireDtype
from tests.support.exchange import decoded, rehashed

SPARSE = WireDtype.SPARSE


def _flat(tensors: dict[str, torch.Tensor], m: codec.Manifest) -> torch.Tensor:
    return torch.cat([tensors[e.name].reshape(-1) for e in m.layout.tensors]) if m.layout.tensors else torch.empty(0)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcde"), st.integers(0, 9000), min_size=1, max_size=3),
    st.integers(1, 300),
    st.sampled_from([4, 1000, 4096, 8192, 1 << 20]),
    st.integers(0, 1000),
)
def test_each_group_sends_its_largest_entries_within_a_third_of_its_scale(sizes, keep, chunk_size, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    src = {n: torch.randn(k, generator=g) for n, k in sizes.items()}
    enc = codec.encode(src, round=2, site="s", tokens=1, wire=SPARSE, chunk_size=chunk_size, keep=keep)
    m = enc.manifest
    assert m.layout.keep == keep
    assert enc.data.numel() == m.wire_nbytes == sum(
        sparse.wire_bytes(b - a, keep) for a, b in map(m.chunk_bounds, range(m.num_chunks)))
    assert protoconv.manifest_from_proto(protoconv.manifest_to_proto(m)) == m
    x, y = _flat(src, m), _flat(decoded(enc), m)
    for i in range(m.num_chunks):  # groups restart at every chunk
        a, b = m.chunk_bounds(i)
        for start in range(a, b, sparse.GROUP):
            xs, ys = x[start : min(start + sparse.GROUP, b)], y[start : min(start + sparse.GROUP, b)]
            k = sparse.kept(xs.numel(), keep)
            sent = ys != 0
            assert int(sent.sum()) == k  # random normals: no kept entry is 0
            # The kept ones are the k largest: none left out is larger than the smallest kept.
            left_out = xs[~sent].abs()
            assert not left_out.numel() or float(left_out.max()) <= float(xs[sent].abs().min())
            scale = float(xs[sent].abs().max())
            assert float((xs[sent] - ys[sent]).abs().max()) <= scale / 3 * (1 + 1e-6)
            assert bool((torch.sign(xs[sent]) == torch.sign(ys[sent])).all())


def test_sixty_four_of_4096_cost_0_227_bits_per_parameter() -> None:
    enc = codec.encode({"w": torch.randn(1 << 20)}, round=1, site="s", tokens=1, wire=SPARSE, keep=64)
    assert enc.data.numel() == 256 * (4 + 96 + 16)
    assert enc.data.numel() * 8 / (1 << 20) == pytest.approx(0.2266, abs=1e-4)


def test_decoding_is_deterministic_and_all_zero_groups_decode_to_zero() -> None:
    src = {"w": torch.cat([torch.zeros(4096), torch.randn(5000)])}
    enc = codec.encode(src, round=1, site="s", tokens=1, wire=SPARSE, keep=10)
    one, two = decoded(enc), decoded(enc)
    assert torch.equal(one["w"], two["w"])
    assert bool((one["w"][:4096] == 0).all())


# ---- malformed payloads: a sender whose hashes are right and whose content is not ----

N = 5000  # one full group of 4096 (keep 64) and a tail of 904 that keeps ceil(64 x 904 / 4096) = 15


def _encoded() -> codec.Encoded:
    return codec.encode({"w": torch.randn(N)}, round=1, site="s", tokens=1, wire=SPARSE, keep=64)


def _indices_at(enc: codec.Encoded) -> tuple[int, int]:
    """Byte offsets of the full group's and the tail group's indices in the (only) chunk."""
    full = 4 * 2
    return full, full + sparse._group_bytes(64)[0]


def _set_indices(enc: codec.Encoded, at: int, idx: list[int]) -> None:
    packed = sparse._pack_indices(torch.tensor([idx], dtype=torch.int32)).reshape(-1)
    enc.chunk(0)[at : at + packed.numel()].copy_(packed)


def _refused(enc: codec.Encoded, error: type[Exception], match: str) -> None:
    enc = rehashed(enc)
    dest = {"w": torch.full((N,), 7.0)}
    with pytest.raises(error, match=match):
        decoding.decode(enc, dest)
    assert bool((dest["w"] == 7.0).all())  # nothing of the chunk was applied


def _current(enc: codec.Encoded, at: int, k: int) -> list[int]:
    raw = enc.chunk(0)[at : at + sparse._group_bytes(k)[0]]
    return sparse._unpack_indices(raw.view(1, -1), k).reshape(-1).tolist()


def test_an_index_outside_its_group_is_refused() -> None:
    enc = _encoded()
    _, tail = _indices_at(enc)
    idx = _current(enc, tail, 15)
    idx[-1] = 950  # the tail group has 904 elements
    _set_indices(enc, tail, idx)
    _refused(enc, codec.SparseIndexError, "outside its group of 904")


@pytest.mark.parametrize("how", ["unsorted", "duplicated"])
def test_unsorted_or_repeated_indices_are_refused(how: str) -> None:
    enc = _encoded()
    full, _ = _indices_at(enc)
    idx = _current(enc, full, 64)
    if how == "unsorted":
        idx[3], idx[4] = idx[4], idx[3]
    else:
        idx[4] = idx[3]
    _set_indices(enc, full, idx)
    _refused(enc, codec.SparseIndexError, "not strictly increasing")


def test_a_non_zero_padding_index_is_refused() -> None:
    enc = _encoded()
    _, tail = _indices_at(enc)
    raw = enc.chunk(0)[tail : tail + sparse._group_bytes(15)[0]]
    raw[-1] = 0x01  # the 16th (padding) index's high bits
    _refused(enc, codec.SparseIndexError, "padding index")


def test_non_zero_code_padding_is_refused() -> None:
    enc = _encoded()
    raw = enc.chunk(0)
    raw[-1] = int(raw[-1]) | 0xC0  # the tail's 15 codes leave the last byte's top two bits as padding
    _refused(enc, codec.SparseIndexError, "padding bits")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_a_bad_scale_is_refused(bad: float) -> None:
    enc = _encoded()
    enc.chunk(0)[4:8].copy_(torch.tensor([bad], dtype=torch.float32).view(torch.uint8))
    _refused(enc, codec.ScaleError, "scale is NaN, Inf or negative")


@pytest.mark.parametrize("delta", [-1, 1])
def test_a_payload_longer_or_shorter_than_its_manifest_says_is_refused(delta: int) -> None:
    enc = _encoded()
    data = bytes(codec.as_memoryview(enc.chunk(0)))
    data = data[:-1] if delta < 0 else data + b"\0"
    with pytest.raises(codec.ChunkError, match="a SPARSE chunk of this manifest has"):
        codec.verify_chunk(enc.manifest, 0, data)


@pytest.mark.parametrize("keep", [0, sparse.GROUP + 1])
def test_a_manifest_with_unsupported_parameters_is_refused(keep: int) -> None:
    msg = protoconv.manifest_to_proto(_encoded().manifest)
    msg.sparse_keep = keep
    with pytest.raises(codec.ManifestError, match=f"sparse_keep {keep}: this peer decodes 1 to 4096"):
        protoconv.manifest_from_proto(msg)
    dense = protoconv.manifest_to_proto(codec.encode({"w": torch.randn(10)}, round=1, site="s", tokens=1).manifest)
    dense.sparse_keep = 64
    with pytest.raises(codec.ManifestError, match="only sparse keeps entries"):
        protoconv.manifest_from_proto(dense)


def test_non_finite_input_is_refused_at_encode() -> None:
    with pytest.raises(codec.NonFiniteError):
        codec.encode({"w": torch.tensor([1.0, math.nan])}, round=1, site="s", tokens=1, wire=SPARSE, keep=1)
