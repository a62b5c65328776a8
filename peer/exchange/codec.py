"""Pseudo-gradient codec: named fp32 tensors <-> a manifest plus blake3-hashed chunks of wire bytes.

The byte layout (tensors sorted by name, row-major, no padding, little-endian bf16/fp16/fp32) and
the chunk and root hash rules are specified in `protos/sitemesh/v1/exchange.proto`; this module is
the one implementation of them (peer/exchange/protoconv.py converts manifests to and from protos).

Here: the object's layout and manifest, the chunk hashes, encoding and checking a received chunk
against its manifest. Decoding into tensors is decoding.py's; the int8/int4 and sparse byte formats
are quantized.py's and sparse.py's.

Encoding writes straight from the source tensors (any device) into one preallocated uint8 buffer
with `copy_`, which converts dtype and device in one pass; decoding copies one verified chunk at a
time from its wire view straight into the preallocated destination tensors (again one `copy_`), so
neither side builds an intermediate full copy. bf16 has no numpy dtype: buffers are torch uint8 tensors, viewed
as the wire dtype for arithmetic and as a memoryview for hashing and sockets (no `tobytes()`).

    .venv/bin/python -c "import torch; from peer.exchange import codec; \
e = codec.encode({'w': torch.randn(3, 5)}, round=1, site='a', tokens=10); print(e.manifest)"
"""

from __future__ import annotations

import bisect
import enum
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import blake3
import torch

from peer.exchange import quantized, sparse
from peer.exchange.finite import is_finite, magnitude
from peer.gen.sitemesh.v1 import exchange_pb2 as pb

# 1 MiB streamed fastest on loopback (2 MiB: -15 %, 4 MiB: -43 %): docs/decisions/exchange-chunk-size.md.
DEFAULT_CHUNK_BYTES = 1 << 20
# Half of the transport's 8 MiB message limit: a Chunk message always fits with room to spare.
MAX_CHUNK_BYTES = 4 << 20
HASH_BYTES = 32
FP16_MAX = 65504.0
# Layout bytes per chunk of a sparse object: 4 MiB of elements are 116 KiB on the wire at keep 64, and
# a quarter of the chunks let an all-gather of 3 x 128 M elements through the WAN emulation in 1.49 s
# instead of 1.64 s (fewer chunk hand-overs): docs/decisions/exchange-sparse-wire.md.
SPARSE_CHUNK_BYTES = MAX_CHUNK_BYTES


class CodecError(ValueError):
    """Input refused by the codec; the message says what and where."""


class ManifestError(CodecError):
    """A manifest that breaks the layout or chunk rules of exchange.proto."""


class ChunkError(CodecError):
    """A chunk that does not match its manifest (length or hash): re-fetch it."""


class NonFiniteError(CodecError):
    """NaN or Inf in a pseudo-gradient: the object is refused, not re-fetched (the sender made it)."""


class LayoutMismatch(CodecError):
    """Destination or peer tensors whose names, shapes or dtypes differ from the manifest's layout."""


class BadEncoding(NonFiniteError):
    """A verified int8/int4/sparse chunk whose bytes break its format: refused, not re-fetched (the
    sender made it), nothing of it applied."""


class ScaleError(BadEncoding):
    """A quantized chunk whose scale is NaN, Inf or not > 0."""


class SparseIndexError(BadEncoding):
    """A sparse chunk whose indices are out of range, unsorted or duplicated, or whose padding is not 0."""


class WireDtype(enum.Enum):
    """Element encoding on the wire; the value is the proto enum number."""

    BF16 = pb.WIRE_DTYPE_BF16
    FP16 = pb.WIRE_DTYPE_FP16
    FP32 = pb.WIRE_DTYPE_FP32
    INT8 = pb.WIRE_DTYPE_INT8
    INT4 = pb.WIRE_DTYPE_INT4
    SPARSE = pb.WIRE_DTYPE_SPARSE

    @classmethod
    def named(cls, name: str) -> WireDtype:
        """"bf16", "int4", ... (the config spelling) -> WireDtype; CodecError lists the known ones."""
        try:
            return cls[name.upper()]
        except KeyError:
            raise CodecError(f"unknown wire format {name!r}; one of {[w.name.lower() for w in cls]}") from None

    # The properties below read attributes set once per member (after the class): a dict keyed by
    # the member would run Enum.__hash__, a Python function, several times per chunk.
    _quantized: bool
    _torch_dtype: torch.dtype | None
    _itemsize: int

    @property
    def quantized(self) -> bool:
        """Lossy codes with scales (exchange.proto, "Quantized chunks" and "Sparse chunks"): one
        layout byte per element, never placeable, sent with error feedback."""
        return self._quantized

    @property
    def torch_dtype(self) -> torch.dtype:
        """The float dtype of the elements on the wire (not for quantized formats)."""
        if self._torch_dtype is None:
            raise KeyError(self)
        return self._torch_dtype

    @property
    def itemsize(self) -> int:
        """Layout bytes per element (addressing); a quantized chunk's wire bytes: `wire_bytes`."""
        return self._itemsize

    @property
    def bits(self) -> int:
        """Bits per code of an int8/int4 chunk (quantized.py)."""
        return 8 if self is WireDtype.INT8 else 4

    @property
    def qmax(self) -> int:
        return quantized.qmax(self.bits)

    def wire_bytes(self, layout_bytes: int, keep: int = 0) -> int:
        """Bytes on the wire of a chunk of `layout_bytes` layout bytes (scales included); `keep`:
        a sparse layout's entries per group (Layout.keep)."""
        if not self.quantized:
            return layout_bytes
        if self is WireDtype.SPARSE:
            return sparse.wire_bytes(layout_bytes, keep)
        return quantized.wire_bytes(layout_bytes, self.bits)


for _wire, (_q, _dtype, _size) in {
    WireDtype.BF16: (False, torch.bfloat16, 2), WireDtype.FP16: (False, torch.float16, 2),
    WireDtype.FP32: (False, torch.float32, 4), WireDtype.INT8: (True, None, 1), WireDtype.INT4: (True, None, 1),
    WireDtype.SPARSE: (True, None, 1),
}.items():
    _wire._quantized, _wire._torch_dtype, _wire._itemsize = _q, _dtype, _size
del _wire, _q, _dtype, _size


class ObjectKind(enum.Enum):
    PSEUDO_GRADIENT = pb.OBJECT_KIND_PSEUDO_GRADIENT
    MEAN_SHARD = pb.OBJECT_KIND_MEAN_SHARD
    GLOBAL_STATE = pb.OBJECT_KIND_GLOBAL_STATE


@dataclass(frozen=True)
class ObjectKey:
    round: int
    site: str
    kind: ObjectKind = ObjectKind.PSEUDO_GRADIENT

    def __str__(self) -> str:
        return f"round {self.round} site {self.site!r} {self.kind.name.lower()}"


# Parameter dtypes a layout may name (TensorLayout.dtype): the floating types a model trains in.
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16", "float64"})


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    # First byte of the tensor in the flat layout.
    offset: int
    # The parameter's dtype at the sender ("float32", ...): a destination's (check_destination).
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Layout:
    """Where every tensor's elements sit in the flat wire byte string."""

    wire: WireDtype
    tensors: tuple[TensorEntry, ...]
    total_bytes: int
    keep: int = 0
    """Sparse: entries kept per group of sparse.GROUP elements (Manifest.sparse_keep); else 0."""

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor], wire: WireDtype,
           dtypes: Mapping[str, torch.dtype] | None = None, keep: int = 0) -> Layout:
        """The layout of `tensors`; `dtypes`: the parameters' dtypes where the tensors are not in them
        (a pseudo-gradient the trainer handed over in the wire dtype); `keep`: see Layout.keep."""
        entries, offset = [], 0
        for name in sorted(tensors):
            shape = tuple(int(d) for d in tensors[name].shape)
            dtype = tensors[name].dtype if dtypes is None else dtypes.get(name)
            if dtype is None:
                raise LayoutMismatch(f"{name}: no parameter dtype given for it (the model has no such tensor)")
            entries.append(TensorEntry(name, shape, offset, dtype_name(dtype)))
            offset += math.prod(shape) * wire.itemsize
        return cls(wire, tuple(entries), offset, keep)

    def wire_bytes(self, layout_bytes: int) -> int:
        """Bytes on the wire of a chunk of `layout_bytes` layout bytes in this layout's format."""
        return self.wire.wire_bytes(layout_bytes, self.keep)

    @functools.cached_property
    def _ends(self) -> list[int]:
        """Layout byte where each tensor ends, in layout order (non-decreasing)."""
        return [e.offset + e.numel * self.wire.itemsize for e in self.tensors]

    def pieces(self, start: int, end: int) -> Iterator[tuple[TensorEntry, int, int]]:
        """(tensor, first element, end element) of every tensor overlapping layout bytes [start, end)."""
        size, ends = self.wire.itemsize, self._ends
        # Bisect to the first tensor ending after `start`: a scan from the first tensor for every
        # chunk was 15 % of encoding a 310-tensor model (1144 chunks).
        for k in range(bisect.bisect_right(ends, start), len(ends)):
            entry = self.tensors[k]
            if entry.offset >= end:
                break
            if entry.numel:
                yield entry, (max(entry.offset, start) - entry.offset) // size, (min(ends[k], end) - entry.offset) // size

    def check_tensors(self, tensors: Mapping[str, torch.Tensor], what: str, *, dtypes: bool = True) -> None:
        """Raises LayoutMismatch unless `tensors` has exactly this layout's names and shapes (and
        dtypes, unless `dtypes` is False)."""
        names = sorted(tensors)
        expected = [e.name for e in self.tensors]
        if names != expected:
            missing, extra = sorted(set(expected) - set(names)), sorted(set(names) - set(expected))
            raise LayoutMismatch(f"{what}: tensor names differ from the layout (missing {missing}, extra {extra})")
        for entry in self.tensors:
            t = tensors[entry.name]
            if tuple(t.shape) != entry.shape:
                raise LayoutMismatch(f"{what}: {entry.name} has shape {tuple(t.shape)}, layout says {entry.shape}")
            if dtypes and dtype_name(t.dtype) != entry.dtype:
                raise LayoutMismatch(f"{what}: {entry.name} has dtype {dtype_name(t.dtype)}, layout says {entry.dtype}")


@dataclass(frozen=True)
class Manifest:
    """Python form of exchange.proto's Manifest; `validate()` enforces every rule written there."""

    key: ObjectKey
    layout: Layout
    range_start: int
    range_end: int
    chunk_size: int
    chunk_hashes: tuple[bytes, ...]
    # Power-of-two exponent per chunk; all zero except for scaled fp16 chunks.
    scale_exps: tuple[int, ...]
    root_hash: bytes
    tokens: int
    contributors: tuple[str, ...] = ()
    # Mean shards: the root hash of each contributor's pseudo-gradient, in `contributors` order.
    contributor_roots: tuple[bytes, ...] = ()

    @property
    def nbytes(self) -> int:
        return self.range_end - self.range_start

    @property
    def num_chunks(self) -> int:
        return -(-self.nbytes // self.chunk_size)

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """Layout bytes [start, end) of chunk `index`."""
        start = self.range_start + index * self.chunk_size
        return start, min(start + self.chunk_size, self.range_end)

    def chunk_elements(self, index: int) -> int:
        start, end = self.chunk_bounds(index)
        return (end - start) // self.layout.wire.itemsize

    def wire_bounds(self, index: int) -> tuple[int, int]:
        """Bytes [start, end) of chunk `index` in the object's wire bytes (Encoded.data)."""
        start, end = self.chunk_bounds(index)
        first = index * self.layout.wire_bytes(self.chunk_size)
        return first, first + self.layout.wire_bytes(end - start)

    @property
    def wire_nbytes(self) -> int:
        """All wire bytes of the object (for bf16/fp16/fp32, its layout bytes)."""
        return self.wire_bounds(self.num_chunks - 1)[1] if self.num_chunks else 0

    def validate(self) -> None:
        """Raises ManifestError with the first broken rule."""
        lay, cs = self.layout, self.chunk_size
        if not self.key.site:
            raise ManifestError("empty site")
        if cs <= 0 or cs % 4 or cs > MAX_CHUNK_BYTES:
            raise ManifestError(f"chunk_size {cs} must be a positive multiple of 4 up to {MAX_CHUNK_BYTES}")
        offset, names = 0, set()
        for e in lay.tensors:
            if e.name in names or not e.name:
                raise ManifestError(f"empty or duplicate tensor name {e.name!r}")
            if e.dtype not in FLOAT_DTYPES:
                raise ManifestError(f"tensor {e.name} has dtype {e.dtype!r}, not one of {sorted(FLOAT_DTYPES)}")
            names.add(e.name)
            if e.offset != offset:
                raise ManifestError(f"tensor {e.name} at offset {e.offset}, expected {offset} (no padding)")
            offset += e.numel * lay.wire.itemsize
        if [e.name for e in lay.tensors] != sorted(names):
            raise ManifestError("tensors are not sorted by name")
        if lay.total_bytes != offset:
            raise ManifestError(f"layout_bytes {lay.total_bytes} != sum of tensor bytes {offset}")
        if lay.wire is WireDtype.SPARSE and not 1 <= lay.keep <= sparse.GROUP:
            raise ManifestError(f"sparse_keep {lay.keep}: this peer decodes 1 to {sparse.GROUP} entries per "
                                f"group of {sparse.GROUP}")
        if lay.wire is not WireDtype.SPARSE and lay.keep:
            raise ManifestError(f"sparse_keep {lay.keep} with wire dtype {lay.wire.name}: only sparse keeps entries")
        if not 0 <= self.range_start <= self.range_end <= lay.total_bytes or self.range_start % cs:
            raise ManifestError(f"range [{self.range_start}, {self.range_end}) not chunk-aligned inside the layout")
        if self.range_end % cs and self.range_end != lay.total_bytes:
            raise ManifestError(f"range_end {self.range_end} is neither chunk-aligned nor the layout end")
        if len(self.chunk_hashes) != self.num_chunks or any(len(h) != HASH_BYTES for h in self.chunk_hashes):
            raise ManifestError(f"need {self.num_chunks} chunk hashes of {HASH_BYTES} bytes")
        if len(self.scale_exps) != self.num_chunks:
            raise ManifestError(f"need {self.num_chunks} scale exponents, got {len(self.scale_exps)}")
        if any(e > 0 or e < -126 or (e and lay.wire is not WireDtype.FP16) for e in self.scale_exps):
            raise ManifestError("scale exponents must be in [-126, 0], and non-zero only for fp16")
        if self.contributor_roots and len(self.contributor_roots) != len(self.contributors):
            raise ManifestError(f"{len(self.contributor_roots)} contributor roots for {len(self.contributors)} contributors")
        if root_hash(self.chunk_hashes, self.scale_exps) != self.root_hash:
            raise ManifestError("root_hash does not match the chunk hashes")


def root_hash(chunk_hashes: Sequence[bytes], scale_exps: Sequence[int]) -> bytes:
    h = blake3.blake3()
    for digest, exp in zip(chunk_hashes, scale_exps, strict=True):
        h.update(digest)
        h.update(exp.to_bytes(4, "little", signed=True))
    return h.digest()


def chunk_hash(data: memoryview | bytes) -> bytes:
    return blake3.blake3(data).digest()


def as_memoryview(buf: torch.Tensor) -> memoryview:
    """Zero-copy bytes of a contiguous CPU uint8 tensor (for hashing and sockets)."""
    return memoryview(buf.numpy()).cast("B")


def _quantize(values: torch.Tensor, out: torch.Tensor, wire: WireDtype, keep: int) -> None:
    """Writes int8/int4/sparse codes and group scales of 1-D fp32 `values` into `out` (exchange.proto).
    Rounds to nearest (even); what a site does not send is its error feedback's business."""
    if wire is WireDtype.SPARSE:
        if not is_finite(values):
            raise NonFiniteError("NaN or Inf in the values to encode")
        sparse.encode(values, out, keep)
        return
    try:
        quantized.encode(values, out, wire.bits)
    except quantized.NotFinite as err:
        raise NonFiniteError(str(err)) from None


def encode_chunk(
    pieces: Sequence[torch.Tensor], out: torch.Tensor, wire: WireDtype, *, known_finite: bool = False, keep: int = 0
) -> tuple[bytes, int]:
    """Encodes the concatenation of `pieces` (1-D, any float dtype and device) into the uint8 `out`
    (wire_bytes of the pieces' elements).

    Returns (blake3 of the chunk, scale exponent). fp16 chunks whose largest magnitude exceeds 65504
    are scaled by a power of two (exactly invertible) instead of overflowing to Inf; the exponent is
    reported in the manifest. int8/int4 chunks carry their scales in their bytes. Raises
    NonFiniteError on NaN or Inf, in the input or after conversion, unless the caller vouches for
    the input (`known_finite`, e.g. a mean it has just checked). `keep`: a sparse layout's.
    """
    if wire.quantized:
        values = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in pieces]) if pieces else torch.empty(0)
        _quantize(values, out, wire, keep)
        return chunk_hash(as_memoryview(out)), 0
    exp = 0
    if wire is WireDtype.FP16:  # the magnitude is needed for the scale: check the input
        amax = max((magnitude(p) for p in pieces), default=0.0, key=lambda v: (math.isnan(v), v))
        if not math.isfinite(amax):
            raise NonFiniteError("NaN or Inf in the values to encode")
        if amax > FP16_MAX:
            # fp32's largest finite value needs 2^-112 at most, so the exponent stays in range.
            exp = -math.ceil(math.log2(amax / FP16_MAX))
    dst, pos = out.view(wire.torch_dtype), 0
    for p in pieces:
        n = p.numel()
        if exp or not _in_place(p, dst, pos):
            dst[pos : pos + n].copy_(p if exp == 0 else p * 2.0**exp)
        pos += n
    # bf16 and fp32: check the output, which is smaller than an fp32 input and also catches bf16's
    # rounding of fp32 values near 3.4e38 up to Inf. Scaled fp16 cannot overflow.
    if wire is not WireDtype.FP16 and not known_finite and not is_finite(dst):
        raise NonFiniteError("NaN or Inf in the values to encode")
    return chunk_hash(as_memoryview(out)), exp


def _in_place(piece: torch.Tensor, dst: torch.Tensor, pos: int) -> bool:
    """`piece` already is elements [pos, ...) of `dst`: a source laid out in the wire format inside
    the buffer it is encoded into (codec.encode's `out`), which needs no copy."""
    return (piece.device.type == "cpu" and piece.dtype == dst.dtype
            and piece.data_ptr() == dst.data_ptr() + pos * dst.element_size())


def _at_its_place(t: torch.Tensor, entry: TensorEntry, buffer: torch.Tensor, wire: WireDtype) -> bool:
    """`t` is contiguous CPU memory of `buffer` at `entry`'s place in `wire`'s layout, in the wire
    dtype (an empty tensor has no address: the dtype is all it can match)."""
    return (not wire.quantized and t.dtype == wire.torch_dtype and t.device.type == "cpu" and t.is_contiguous()
            and (t.numel() == 0 or t.data_ptr() == buffer.data_ptr() + entry.offset))


def laid_out_in(tensors: Mapping[str, torch.Tensor], buffer: torch.Tensor, wire: WireDtype) -> bool:
    """Every tensor already lies in `buffer` (CPU uint8) at its place in `wire`'s layout, in the wire
    dtype: `encode(tensors, out=buffer)` then copies nothing (the trainer's file, mapped)."""
    if wire.quantized or buffer.dtype != torch.uint8 or buffer.device.type != "cpu":
        return False
    layout = Layout.of(tensors, wire)
    return layout.total_bytes <= buffer.numel() and all(
        _at_its_place(tensors[e.name], e, buffer, wire) for e in layout.tensors
    )


def _check_overlap(flat: Mapping[str, torch.Tensor], layout: Layout, data: torch.Tensor) -> None:
    """LayoutMismatch for a source tensor inside the encode buffer anywhere but at its own place in
    the layout in the wire dtype: encoding an earlier chunk would overwrite it before it is read."""
    lo, hi = data.data_ptr(), data.data_ptr() + data.numel()
    for entry in layout.tensors:
        t = flat[entry.name]
        if t.device.type != "cpu" or t.numel() == 0:
            continue
        start = t.data_ptr()
        if start < hi and lo < start + t.numel() * t.element_size() and not _at_its_place(t, entry, data, layout.wire):
            raise LayoutMismatch(f"{entry.name} lies inside the encode buffer, not at its place in the "
                                 f"{layout.wire.name} layout: encoding would overwrite it before reading it")


@dataclass
class Encoded:
    """An encoded object: its manifest and the wire bytes it serves (CPU uint8, range bytes).

    Whoever reads `data` holds this object while it reads: the node reuses the memory once the object
    is collected (buffers.EncodeBuffers), so a reader keeping only a view of the bytes could see them
    rewritten."""

    manifest: Manifest
    data: torch.Tensor
    # Chunks that fp16 had to scale to avoid overflow (always 0 for bf16/fp32).
    scaled_chunks: int = 0

    def chunk(self, index: int) -> torch.Tensor:
        start, end = self.manifest.wire_bounds(index)
        return self.data[start:end]


def flat_views(tensors: Mapping[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """1-D views of contiguous tensors (a non-contiguous source is copied once, here)."""
    return {e.name: tensors[e.name].detach().contiguous().view(-1) for e in layout.tensors}


def build_manifest(
    key: ObjectKey,
    layout: Layout,
    start: int,
    end: int,
    chunk_size: int,
    hashes: Sequence[bytes],
    exps: Sequence[int],
    tokens: int,
    contributors: Sequence[str] = (),
    contributor_roots: Sequence[bytes] = (),
) -> Manifest:
    return Manifest(
        key, layout, start, end, chunk_size, tuple(hashes), tuple(exps), root_hash(hashes, exps), tokens,
        tuple(contributors), tuple(contributor_roots),
    )  # fmt: skip


def encode(
    tensors: Mapping[str, torch.Tensor],
    *,
    round: int,
    site: str,
    tokens: int,
    wire: WireDtype = WireDtype.BF16,
    chunk_size: int = DEFAULT_CHUNK_BYTES,
    out: torch.Tensor | None = None,
    kind: ObjectKind = ObjectKind.PSEUDO_GRADIENT,
    param_dtypes: Mapping[str, torch.dtype] | None = None,
    keep: int = 0,
) -> Encoded:
    """Encodes a pseudo-gradient (named float tensors on any device) into an Encoded object.

    `out`, if given, is a contiguous CPU uint8 buffer of at least the layout's bytes to encode into:
    one reused across rounds (no page faults on fresh memory). The tensors may already lie in it,
    each at its place in the layout in the wire dtype (the trainer's file, mapped: see
    trainer.process.map_state): those are hashed and checked where they are, not copied. Otherwise
    fresh memory is allocated. `param_dtypes`: the parameters' dtypes, which the layout names, where
    the tensors are in another one (the wire dtype). `keep`: entries per group for the sparse wire.
    """
    layout = Layout.of(tensors, wire, param_dtypes, _keep(wire, keep))
    layout.check_tensors(tensors, f"pseudo-gradient of {site}", dtypes=param_dtypes is None)
    flat = flat_views(tensors, layout)
    key = ObjectKey(round, site, kind)
    probe = build_manifest(key, layout, 0, layout.total_bytes, chunk_size, [], [], tokens)
    nbytes = probe.wire_nbytes
    if out is None:
        data = torch.empty(nbytes, dtype=torch.uint8)
    elif out.dtype != torch.uint8 or out.device.type != "cpu" or not out.is_contiguous() or out.numel() < nbytes:
        raise LayoutMismatch(f"encode buffer must be contiguous CPU uint8 of >= {nbytes} bytes")
    else:
        data = out[:nbytes]
        _check_overlap(flat, layout, data)
    hashes, exps = [], []
    for i in range(probe.num_chunks):
        start, end = probe.chunk_bounds(i)
        spans = list(layout.pieces(start, end))
        pieces = [flat[e.name][a:b] for e, a, b in spans]
        w0, w1 = probe.wire_bounds(i)
        try:
            digest, exp = encode_chunk(pieces, data[w0:w1], wire, keep=layout.keep)
        except NonFiniteError:
            bad = [e.name for (e, _, _), p in zip(spans, pieces) if not is_finite(p)]
            what = f"NaN or Inf in {bad}" if bad else f"{[e.name for e, _, _ in spans]} overflow {wire.name}"
            raise NonFiniteError(f"pseudo-gradient of {site}, round {round}: {what}") from None
        hashes.append(digest)
        exps.append(exp)
    manifest = build_manifest(key, layout, 0, layout.total_bytes, chunk_size, hashes, exps, tokens)
    return Encoded(manifest, data, sum(1 for e in exps if e))


def _keep(wire: WireDtype, keep: int) -> int:
    """`keep`, or for the sparse wire without one, sparse.DEFAULT_KEEP."""
    return keep or sparse.DEFAULT_KEEP if wire is WireDtype.SPARSE else keep


def encoded_nbytes(tensors: Mapping[str, torch.Tensor], wire: WireDtype, chunk_size: int = DEFAULT_CHUNK_BYTES,
                   keep: int = 0) -> int:
    """The bytes `encode` writes for `tensors` (what its `out` buffer must hold at least)."""
    layout = Layout.of(tensors, wire, keep=_keep(wire, keep))
    return build_manifest(ObjectKey(0, ""), layout, 0, layout.total_bytes, chunk_size, [], [], 0).wire_nbytes


def verify_chunk(manifest: Manifest, index: int, data: bytes | bytearray | memoryview | Sequence[memoryview]) -> None:
    """Raises ChunkError unless `data` is exactly chunk `index` of `manifest`: its bytes, or the
    pieces they were received into, in order (chunk_targets)."""
    if not 0 <= index < manifest.num_chunks:
        raise ChunkError(f"{manifest.key}: chunk index {index} outside [0, {manifest.num_chunks})")
    pieces = data if isinstance(data, Sequence) and not isinstance(data, (bytes, bytearray, memoryview)) else (data,)
    start, end = manifest.wire_bounds(index)
    if (nbytes := sum(len(p) for p in pieces)) != end - start:
        raise ChunkError(f"{manifest.key}: chunk {index} has {nbytes} bytes, a {manifest.layout.wire.name} "
                         f"chunk of this manifest has {end - start} (a chunk of another wire format?)")
    h = blake3.blake3()
    for p in pieces:
        h.update(p)
    if h.digest() != manifest.chunk_hashes[index]:
        raise ChunkError(f"{manifest.key}: chunk {index} hash mismatch")


# Wire formats whose chunks a destination in the wire dtype can receive as they are: fp16 chunks may
# carry a scale that takes their values beyond fp16, int8/int4 must be dequantized.
PLACEABLE = frozenset({WireDtype.BF16, WireDtype.FP32})

