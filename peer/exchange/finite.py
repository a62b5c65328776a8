"""NaN and Inf checks of element values: the cheapest exact pass for each dtype.

A pseudo-gradient with a NaN or Inf is refused wherever it is met (encoding, decoding, reducing):
these are the checks the codec, the quantized formats and the reducer share.

    .venv/bin/python -m pytest tests/unit/test_exchange_kernels.py -q
"""

from __future__ import annotations

import math

import torch

from peer.exchange import kernels


def magnitude(t: torch.Tensor) -> float:
    """Largest |value| of `t` (0 when empty); NaN or Inf when `t` holds one.

    One aminmax pass: ~10x faster on CPU than `isfinite(t).all()`, which materialises a bool tensor.
    """
    if t.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(t)
    return max(abs(float(lo)), abs(float(hi)), key=lambda v: (math.isnan(v), v))


# Dtypes checked by a sum first (a finite sum proves every element finite). Not fp16: the sum of a
# 1 MiB chunk of ordinary values overflows its 65504, so nearly every chunk would need aminmax too.
_SUM_CHECKED = frozenset({torch.bfloat16, torch.float32, torch.float64})


def is_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in `t`. A bf16 chunk (the wire's default) is checked exactly on its bits in one
    compiled pass (kernels.bf16_finite, 1.7x faster than its sum). Otherwise a sum first: it is NaN
    or Inf whenever an element is (IEEE arithmetic never turns either back into a finite value), and
    runs ~2.3x faster than aminmax on a 1 MiB chunk; a sum that is not finite only because finite
    values overflowed takes the exact aminmax pass."""
    if t.dtype == torch.bfloat16 and t.dim() == 1 and t.is_contiguous() and t.device.type == "cpu":
        return kernels.bf16_finite(t)
    if t.dtype in _SUM_CHECKED and math.isfinite(float(t.sum())):
        return True
    return math.isfinite(magnitude(t))
