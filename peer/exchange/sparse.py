"""The sparse wire format: per group of 4096 elements, the `keep` largest by magnitude, as 12-bit
indices and 2-bit codes with one binary32 scale (exchange.proto, "Sparse chunks").

This module is the one implementation of that byte layout: `encode` writes a chunk's bytes from its
fp32 values, `decode` checks every rule a receiver enforces and returns the dense values (zeros
where nothing was sent). What a site does not send stays in its error feedback
(peer/exchange/feedback.py); this module only rounds.

Why these numbers (docs/decisions/exchange-sparse-wire.md): 4096 elements per group is
SparseLoCo's chunk, small enough for 12-bit indices; at keep=64 (1.56 %) a group costs
4 + 96 + 16 = 116 bytes, 0.227 bits per parameter.

    .venv/bin/python -m pytest tests/unit/test_exchange_sparse.py -q
"""

from __future__ import annotations

import torch

GROUP = 4096
"""Elements per group: each group keeps its own top entries, so one large tensor cannot take a
small one's share, and an index fits 12 bits."""
DEFAULT_KEEP = 64
"""Entries kept per group where a run names no density: SparseLoCo's 1.56 %."""
# The value of code c is LEVELS[c] x the group's scale: a symmetric 4-level grid without zero (a kept
# entry is one of the group's largest, never 0 unless the whole group is).
LEVELS = torch.tensor([-1.0, -1.0 / 3.0, 1.0 / 3.0, 1.0])


class SparseError(ValueError):
    """A sparse chunk whose bytes break the format; the codec turns it into a refusal of the object
    (the sender made it)."""


class BadScale(SparseError):
    """A group scale that is NaN, Inf or negative."""


class BadIndex(SparseError):
    """Indices out of their group, not strictly increasing, or padding that is not 0."""


def kept(elements: int, keep: int) -> int:
    """Entries a group of `elements` (<= GROUP) keeps: its share of `keep`, at least 1 and at most all."""
    return min(elements, max(1, -(-keep * elements // GROUP))) if elements else 0


def _group_bytes(k: int) -> tuple[int, int]:
    """(index bytes, code bytes) of a group keeping k entries: two 12-bit indices per 3 bytes, four
    2-bit codes per byte."""
    return 3 * (-(-k // 2)), -(-k // 4)


def _groups(n: int, keep: int) -> list[tuple[int, int, int]]:
    """The chunk's groups as (count, elements each, kept each): the full groups, then the tail."""
    full, tail = divmod(n, GROUP)
    out = [(full, GROUP, kept(GROUP, keep))] if full else []
    return out + [(1, tail, kept(tail, keep))] if tail else out


def wire_bytes(n: int, keep: int) -> int:
    """Bytes of a sparse chunk of `n` elements keeping `keep` per full group (scales included)."""
    total = 0
    for count, _, k in _groups(n, keep):
        idx, codes = _group_bytes(k)
        total += count * (4 + idx + codes)
    return total


def encode(values: torch.Tensor, out: torch.Tensor, keep: int) -> None:
    """Writes the sparse encoding of 1-D fp32 CPU `values` into uint8 `out` (wire_bytes long).

    Layout: every group's binary32 scale, then every group's indices, then every group's codes, the
    groups in order (exchange.proto). Rounding to the nearest level; the caller checks finiteness."""
    n = values.numel()
    groups = _groups(n, keep)
    ngroups = sum(c for c, _, _ in groups)
    scales, idx_parts, code_parts, pos = [], [], [], 0
    for count, m, k in groups:
        grid = values[pos : pos + count * m].view(count, m)
        pos += count * m
        # topk's order among equal magnitudes is the sender's business: the receiver only requires
        # the indices it gets to be sorted and distinct.
        idx = grid.abs().topk(k, dim=1, sorted=False).indices.sort(dim=1).values
        picked = grid.gather(1, idx)
        scale = picked.abs().amax(dim=1)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = picked.div(safe[:, None]).mul_(1.5).add_(1.5).round_().clamp_(0, 3).to(torch.uint8)
        scales.append(scale)
        idx_parts.append(_pack_indices(idx))
        code_parts.append(_pack_codes(codes))
    head = 4 * ngroups
    out[:head].copy_(torch.cat(scales).view(torch.uint8) if scales else out[:0])
    body = torch.cat([p.reshape(-1) for p in idx_parts + code_parts]) if groups else out[:0]
    out[head:].copy_(body)


def decode(data: torch.Tensor, n: int, keep: int) -> torch.Tensor:
    """The dense fp32 values of a sparse chunk of `n` elements (uint8 `data` of wire_bytes): zeros
    where `entries` names nothing. Raises what `entries` raises."""
    where, values = entries(data, n, keep)
    out = torch.zeros(n)
    out[where] = values
    return out


def entries(data: torch.Tensor, n: int, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(element indices in the chunk, strictly increasing; their fp32 values) of a sparse chunk of
    `n` elements. Raises SparseError on a scale that is NaN, Inf or negative, an index out of its
    group, indices not strictly increasing (unsorted or duplicated), or non-zero padding."""
    groups = _groups(n, keep)
    ngroups = sum(c for c, _, _ in groups)
    scales = data[: 4 * ngroups].clone().view(torch.float32)  # clone: received bytes may be unaligned
    if ngroups and not (bool(torch.isfinite(scales).all()) and float(scales.min()) >= 0):
        raise BadScale("a group scale is NaN, Inf or negative")
    pos, g0 = 4 * ngroups, 0
    indices = []
    for count, _, k in groups:
        nbytes = _group_bytes(k)[0]
        indices.append(_unpack_indices(data[pos : pos + count * nbytes].view(count, nbytes), k))
        pos += count * nbytes
    where, values, e0 = [], [], 0
    for (count, m, k), idx in zip(groups, indices, strict=True):
        nbytes = _group_bytes(k)[1]
        codes = _unpack_codes(data[pos : pos + count * nbytes].view(count, nbytes), k)
        pos += count * nbytes
        if k and int(idx.max()) >= m:
            raise BadIndex(f"an index is outside its group of {m} elements")
        if k > 1 and not bool((idx[:, 1:] > idx[:, :-1]).all()):
            raise BadIndex("indices of a group are not strictly increasing (unsorted or duplicated)")
        values.append(LEVELS[codes.long()].mul_(scales[g0 : g0 + count, None]).view(-1))
        # Group j of this run starts at element e0 + j m of the chunk.
        where.append((idx.long() + (e0 + m * torch.arange(count))[:, None]).view(-1))
        g0, e0 = g0 + count, e0 + count * m
    if not where:
        return torch.empty(0, dtype=torch.long), torch.empty(0)
    return torch.cat(where), torch.cat(values)


def _pack_indices(idx: torch.Tensor) -> torch.Tensor:
    """[g, k] indices < 4096 -> [g, 3 ceil(k/2)] bytes: a pair (a, b) is a's low 8 bits, a's high 4
    bits | b's low 4 bits << 4, b's high 8 bits; an odd k is padded with a 0 index."""
    g, k = idx.shape
    padded = torch.zeros(g, k + k % 2, dtype=torch.int32)
    padded[:, :k] = idx
    a, b = padded[:, 0::2], padded[:, 1::2]
    packed = torch.stack((a & 0xFF, (a >> 8) | ((b & 0xF) << 4), b >> 4), dim=2)
    return packed.to(torch.uint8).reshape(g, -1)


def _unpack_indices(raw: torch.Tensor, k: int) -> torch.Tensor:
    g = raw.shape[0]
    trio = raw.reshape(g, -1, 3).to(torch.int32)
    a = trio[:, :, 0] | ((trio[:, :, 1] & 0xF) << 8)
    b = (trio[:, :, 1] >> 4) | (trio[:, :, 2] << 4)
    idx = torch.stack((a, b), dim=2).reshape(g, -1)
    if idx.shape[1] > k and bool(idx[:, k:].any()):
        raise BadIndex("the padding index of an odd group is not 0")
    return idx[:, :k]


def _pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """[g, k] codes in 0..3 -> [g, ceil(k/4)] bytes, the first code in the lowest two bits; padding 0."""
    g, k = codes.shape
    padded = torch.zeros(g, -(-k // 4) * 4, dtype=torch.uint8)
    padded[:, :k] = codes
    q = padded.view(g, -1, 4)
    return q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)


def _unpack_codes(raw: torch.Tensor, k: int) -> torch.Tensor:
    g = raw.shape[0]
    codes = torch.stack([(raw >> s) & 3 for s in (0, 2, 4, 6)], dim=2).reshape(g, -1)
    if codes.shape[1] > k and bool(codes[:, k:].any()):
        raise BadIndex("the padding bits after a group's last code are not 0")
    return codes[:, :k]
