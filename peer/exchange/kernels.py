"""Compiled loops for the bf16 wire's hot path: the token-weighted reduction and the finite check.

torch runs the reduction of one 1 MiB bf16 chunk over three sites as ~150 calls (a widening copy, a
multiply and an add per site and 64 Ki block, the fp32 finite check, the rounding copy), each a pass
over memory and a trip through the interpreter: 650 us per chunk on this machine. One numba loop
does the same arithmetic per element in registers, in one pass, with the GIL released: 180 us
(docs/decisions/exchange-fused-bf16-kernels.md).

Bit for bit what torch computes (invariant I7; tests/unit/test_exchange_kernels.py compares them):
each bf16 value widens exactly to fp32, is multiplied by its factor rounded to fp32 (as torch rounds
a Python scalar for an fp32 tensor), and added in the sites' order: a multiply and an add, each
rounded, never a fused multiply-add (numba leaves floating-point contraction off unless fastmath is
asked for). The fp32 sum rounds to bf16 to nearest, ties to even, as torch's conversion does.

Values travel as uint16 arrays (bf16's bits): numba has no bf16 type.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np
import torch

# Elements per pass: the fp32 partial sums of a block (8 KiB) stay in L1 through every site's pass.
_BLOCK = 2048
_SHIFT = np.uint32(16)
_EXPONENT = np.uint16(0x7F80)  # a bf16 whose exponent bits are all set is Inf or NaN
_MAGNITUDE = np.uint16(0x7FFF)

# cache=True keeps the machine code beside the module (__pycache__) so that a process compiles
# each kernel once per machine, not once per start (~0.3 s each).
_jit = numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")


@numba.njit(nogil=True, cache=True, inline="always")
def _widen(bits):
    return np.uint32(np.uint32(bits) << _SHIFT).view(np.float32)


@_jit
def _first(x, factor, acc, a, m):
    # Slices, not x[a + j]: an index that may be negative makes numba check it, which stops LLVM
    # from vectorising the loop (4x slower).
    xs = x[a : a + m]
    for j in range(m):
        acc[j] = _widen(xs[j]) * factor


@_jit
def _add(x, factor, acc, a, m):
    xs = x[a : a + m]
    for j in range(m):
        acc[j] = acc[j] + _widen(xs[j]) * factor


@_jit
def _round(acc, out, a, m):
    top = np.uint16(0)
    outs = out[a : a + m]
    for j in range(m):
        u = np.float32(acc[j]).view(np.uint32)
        r = np.uint16(np.uint32(u + np.uint32(0x7FFF) + ((u >> _SHIFT) & np.uint32(1))) >> _SHIFT)
        outs[j] = r
        top = max(top, np.uint16(r & _MAGNITUDE))
    return top


@_jit
def _weighted_sum(values, factors, out):
    n = out.shape[0]
    acc = np.empty(_BLOCK, np.float32)
    top = np.uint16(0)
    for a in range(0, n, _BLOCK):
        m = min(_BLOCK, n - a)
        _first(values[0], factors[0], acc, a, m)
        for k in range(1, len(values)):
            _add(values[k], factors[k], acc, a, m)
        top = max(top, _round(acc, out, a, m))
    return top < _EXPONENT


@_jit
def _finite(x):
    top = np.uint16(0)
    for j in range(x.shape[0]):
        top = max(top, np.uint16(x[j] & _MAGNITUDE))
    return top < _EXPONENT


Bf16 = torch.Tensor | memoryview | bytes | bytearray
"""bf16 values: a 1-D contiguous CPU tensor of them (or of their bytes, uint8), or a buffer of their bytes."""


def bits(data: Bf16) -> np.ndarray:
    """The uint16 bits of bf16 values, shared with `data` (no copy)."""
    if not isinstance(data, torch.Tensor):
        return np.frombuffer(data, np.uint16)
    if data.dtype not in (torch.bfloat16, torch.uint8) or data.dim() != 1 or not data.is_contiguous() \
            or data.device.type != "cpu":
        raise ValueError(f"expected a 1-D contiguous bf16 CPU tensor, got {data.dtype} {tuple(data.shape)} "
                         f"on {data.device}")
    return data.numpy().view(np.uint16) if data.dtype == torch.uint8 else data.view(torch.int16).numpy().view(np.uint16)


def bf16_weighted_sum(values: Sequence[Bf16], factors: Sequence[float], out: Bf16) -> bool:
    """out (bf16) = sum over k of values[k] x factors[k], computed in fp32 in this order and rounded
    once to bf16; all of one length. Returns whether every result is finite (a NaN or Inf term, or
    a sum that overflows bf16, makes it False; `out` then holds no defined values)."""
    if not values:
        raise ValueError("a weighted sum needs at least one term")
    terms, into = tuple(_read_only(bits(v)) for v in values), bits(out)
    n = into.shape[0]
    if any(t.shape[0] != n for t in terms) or len(factors) != len(terms):
        raise ValueError(f"{len(terms)} terms of lengths {[t.shape[0] for t in terms]} and {len(factors)} "
                         f"factors for an output of {n}")
    return bool(_weighted_sum(terms, np.asarray(factors, dtype=np.float32), into))


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view: numba types the terms as one tuple type only if they agree on this (bytes
    received over gRPC are read-only, buffers of the bulk plane and local chunks are not)."""
    view = a.view()
    view.flags.writeable = False
    return view


def bf16_finite(data: Bf16) -> bool:
    """No NaN or Inf among the bf16 values `data`: an exact test, in one pass over their bits."""
    return bool(_finite(bits(data)))
