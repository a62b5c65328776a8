"""Decoding verified chunks into tensors: a chunk's values, where they go, and the NaN/Inf refusal.

A chunk reaches here only after codec.verify_chunk (its index, length and blake3 match the
manifest); what can still be wrong is the sender's doing (NaN or Inf, a bad scale or index) and
refuses the whole object. Each chunk is copied from its wire view straight into the preallocated
destination tensors in one `copy_`; a bf16/fp32 chunk can even be received straight into a
destination in the wire dtype (`chunk_targets`, the bulk plane) and only checked here.

    .venv/bin/python -c "import torch; from peer.exchange import codec, decoding; \\
e = codec.encode({'w': torch.randn(3, 5)}, round=1, site='a', tokens=10); \\
d = {'w': torch.empty(3, 5)}; decoding.decode(e, d); print(d['w'])"
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence

import torch

from peer.exchange import kernels, quantized, sparse
from peer.exchange.codec import (
    PLACEABLE,
    BadEncoding,
    Encoded,
    Layout,
    LayoutMismatch,
    Manifest,
    NonFiniteError,
    ScaleError,
    SparseIndexError,
    WireDtype,
    as_memoryview,
    dtype_name,
    verify_chunk,
)
from peer.exchange.finite import is_finite


def wire_view(data: torch.Tensor | bytes | memoryview, wire: WireDtype | None) -> torch.Tensor:
    """One chunk's bytes seen as wire-dtype elements (None: as uint8), without copying (read it,
    never write it)."""
    if isinstance(data, torch.Tensor):
        raw = data
    elif len(data) == 0:
        raw = torch.empty(0, dtype=torch.uint8)
    else:
        with warnings.catch_warnings():  # a received chunk is read-only bytes; this view is only read
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(data, dtype=torch.uint8)
    return raw if wire is None else raw.view(wire.torch_dtype)


def _dequantize(data: torch.Tensor, wire: WireDtype, n: int, keep: int) -> torch.Tensor:
    """fp32 values of a quantized chunk of `n` elements (uint8 `data` of wire_bytes(n)); ScaleError
    on a scale that is NaN, Inf or not > 0 (sparse: negative), SparseIndexError on bad indices."""
    with _format_refusals():
        if wire is WireDtype.SPARSE:
            return sparse.decode(data, n, keep)
        return quantized.decode(data, n, wire.bits)


def chunk_values(
    data: torch.Tensor | bytes | memoryview, wire: WireDtype, exp: int, elements: int, keep: int = 0
) -> tuple[torch.Tensor, float]:
    """(values, multiplier) of one verified chunk of `elements` elements: element = value * multiplier.
    bf16/fp16/fp32: a zero-copy view and 2^-exp; int8/int4/sparse: fp32 values (BadEncoding on a bad
    scale or index), 1. `keep`: the sparse layout's (Layout.keep)."""
    if not wire.quantized:
        return wire_view(data, wire), 2.0**-exp
    return _dequantize(wire_view(data, None), wire, elements, keep), 1.0


def sparse_entries(data: torch.Tensor | bytes | memoryview, elements: int, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(element indices, fp32 values) of one verified sparse chunk of `elements` elements, the
    indices strictly increasing; BadEncoding as chunk_values. For a reduction that adds only what
    was sent instead of a dense chunk of zeros per site."""
    with _format_refusals():
        return sparse.entries(wire_view(data, None), elements, keep)


@contextlib.contextmanager
def _format_refusals() -> Iterator[None]:
    """The byte formats' errors as the codec's: a bad scale is a ScaleError, a bad sparse index a
    SparseIndexError."""
    try:
        yield
    except (sparse.BadScale, quantized.BadScale) as err:
        raise ScaleError(str(err)) from None
    except sparse.BadIndex as err:
        raise SparseIndexError(str(err)) from None


def scatter_values(
    layout: Layout, start: int, values: torch.Tensor, dest: Mapping[str, torch.Tensor], scale: float = 1.0
) -> None:
    """Writes `values` (the elements of layout bytes [start, ...), any float dtype) times `scale` into
    the destination tensors in place; `copy_` converts dtype and device in the same pass."""
    end, pos = start + values.numel() * layout.wire.itemsize, 0
    for entry, a, b in layout.pieces(start, end):
        target = dest[entry.name].view(-1)[a:b]
        target.copy_(values[pos : pos + b - a])
        if scale != 1.0:  # a power of two for fp16 chunks: exact
            target.mul_(scale)
        pos += b - a


def check_destination(layout: Layout, dest: Mapping[str, torch.Tensor], *, wire_dtype: bool = True) -> None:
    """LayoutMismatch unless `dest` has the layout's names and shapes, contiguous, each tensor in the
    parameter's dtype or, for a bf16/fp32 wire and `wire_dtype`, in the wire dtype, which holds the
    wire's values exactly (a mean that the bulk plane receives straight into place: `chunk_targets`).
    `wire_dtype` False: for a caller that writes other values than the wire's (an fp32 mean)."""
    layout.check_tensors(dest, "destination", dtypes=False)
    in_wire = dtype_name(layout.wire.torch_dtype) if wire_dtype and layout.wire in PLACEABLE else None
    for entry in layout.tensors:
        t = dest[entry.name]
        if dtype_name(t.dtype) not in (entry.dtype, in_wire):
            raise LayoutMismatch(f"destination: {entry.name} has dtype {dtype_name(t.dtype)}, layout says {entry.dtype}"
                                 + (f" (or the wire's {in_wire})" if in_wire else ""))
        if not t.is_contiguous():
            raise LayoutMismatch(f"destination: {entry.name} is not contiguous (decode writes into it in place)")


def chunk_targets(manifest: Manifest, index: int, dest: Mapping[str, torch.Tensor]) -> list[memoryview] | None:
    """The bytes of `dest` that chunk `index` fills, in order, where its wire bytes can go there as
    they are (a bf16/fp32 wire, every tensor the chunk touches in the wire dtype on the CPU); else
    None. The bulk plane receives such a chunk straight into them: no buffer, no copy."""
    wire = manifest.layout.wire
    if wire not in PLACEABLE:
        return None
    start, end = manifest.chunk_bounds(index)
    targets = []
    for entry, a, b in manifest.layout.pieces(start, end):
        t = dest[entry.name]
        if t.dtype != wire.torch_dtype or t.device.type != "cpu":
            return None
        targets.append(as_memoryview(t.view(-1)[a:b].view(torch.uint8)))
    return targets


def check_placed(manifest: Manifest, index: int, targets: Sequence[memoryview]) -> None:
    """The finite check decode_verified_chunk makes, for a verified chunk received into `targets`."""
    wire = manifest.layout.wire
    if wire is WireDtype.BF16:  # the bits straight from the buffers (no tensor per piece)
        finite = all(kernels.bf16_finite(t) for t in targets)
    else:
        finite = all(is_finite(wire_view(t, None).view(wire.torch_dtype)) for t in targets if len(t))
    if not finite:
        raise NonFiniteError(f"{manifest.key}: NaN or Inf in chunk {index}; the object is refused")


def decode_verified_chunk(
    manifest: Manifest, index: int, data: bytes | memoryview, dest: Mapping[str, torch.Tensor]
) -> None:
    """Decodes chunk `index` (already checked by verify_chunk) into `dest`; NonFiniteError on NaN/Inf."""
    try:
        values, multiplier = chunk_values(data, manifest.layout.wire, manifest.scale_exps[index],
                                          manifest.chunk_elements(index), manifest.layout.keep)
    except BadEncoding as err:
        raise type(err)(f"{manifest.key}: chunk {index}: {err}; the object is refused") from None
    if not is_finite(values):
        raise NonFiniteError(f"{manifest.key}: NaN or Inf in chunk {index}; the object is refused")
    start = manifest.chunk_bounds(index)[0]
    scatter_values(manifest.layout, start, values, dest, multiplier)


def decode(encoded: Encoded, dest: Mapping[str, torch.Tensor], *, made_here: bool = False) -> None:
    """Decodes a whole local object into preallocated `dest` (names and shapes of the layout).

    `made_here`: this process encoded the object (a mean shard it reduced), so its bytes need no
    second hash (at 1.2 GB, 0.4 GB of blake3 per peer per round). The decoded values are still
    checked: an int8/int4 mean near the float32 limit can decode to Inf, which every other peer
    refuses, and so must this one."""
    check_destination(encoded.manifest.layout, dest)
    for i in range(encoded.manifest.num_chunks):
        data = as_memoryview(encoded.chunk(i))
        if not made_here:
            verify_chunk(encoded.manifest, i, data)
        decode_verified_chunk(encoded.manifest, i, data, dest)
