"""The int8 and int4 wire formats: per group of 128 elements one binary32 scale, then one code per
element, a byte (int8) or a nibble, two to a byte (int4) (exchange.proto, "Quantized chunks").

This module is the one implementation of that byte layout, as sparse.py is of the sparse one:
`encode` writes a chunk's bytes from its fp32 values rounded to nearest (even), `decode` checks the
scales and returns the fp32 values. What a site does not send stays in its error feedback
(peer/exchange/feedback.py); this module only rounds.

    .venv/bin/python -m pytest tests/unit/test_exchange_quantized.py -q
"""

from __future__ import annotations

import torch

from peer.exchange.finite import is_finite

GROUP = 128
"""Elements per binary32 scale: one scale per 1 MiB chunk would let one outlier zero out a million
4-bit codes; 128 costs 4/128 byte per element (int4: 0.53 byte vs bf16's 2)."""


class QuantizedError(ValueError):
    """Values or bytes the format cannot carry; the codec turns it into its own error."""


class NotFinite(QuantizedError):
    """NaN or Inf in the values to encode."""


class BadScale(QuantizedError):
    """A received group scale that is NaN, Inf or not > 0."""


def qmax(bits: int) -> int:
    """The largest code magnitude of `bits`-bit codes (8 or 4): codes are symmetric around 0."""
    return 127 if bits == 8 else 7


def wire_bytes(elements: int, bits: int) -> int:
    """Bytes of a chunk of `elements` elements, its scales included."""
    groups = -(-elements // GROUP)
    return 4 * groups + (elements if bits == 8 else (elements + 1) // 2)


def encode(values: torch.Tensor, out: torch.Tensor, bits: int) -> None:
    """Writes the codes and group scales of 1-D fp32 `values` into the uint8 `out` (wire_bytes long)."""
    n = values.numel()
    top = qmax(bits)
    groups = -(-n // GROUP)
    padded = torch.zeros(groups * GROUP)
    padded[:n] = values
    grid = padded.view(groups, GROUP)
    scale = grid.abs().amax(dim=1).div_(top)
    if not is_finite(scale):
        raise NotFinite("NaN or Inf in the values to encode")
    scale[scale == 0] = 1.0  # an all-zero group: any positive scale decodes it to zeros
    codes = grid.div(scale[:, None]).round_().clamp_(-top, top).to(torch.int8).view(-1)
    out[: 4 * groups].copy_(scale.view(torch.uint8))
    if bits == 8:
        out[4 * groups :].copy_(codes[:n].view(torch.uint8))
        return
    nibbles = (codes[: n + n % 2] + 8).to(torch.uint8)  # the padded tail is 0 -> nibble 8
    if n % 2:
        nibbles[-1] = 0
    out[4 * groups :].copy_(nibbles[0::2] | (nibbles[1::2] << 4))


def decode(data: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """fp32 values of a chunk of `n` elements (uint8 `data` of wire_bytes(n)); BadScale on a scale
    that is NaN, Inf or not > 0."""
    groups = -(-n // GROUP)
    scale = data[: 4 * groups].clone().view(torch.float32)  # clone: received bytes may be unaligned
    if not (is_finite(scale) and (groups == 0 or float(scale.min()) > 0)):
        raise BadScale("a group scale is NaN, Inf or not > 0")
    body = data[4 * groups :]
    if bits == 8:
        codes = body.view(torch.int8)
    else:
        codes = torch.stack(((body & 15).to(torch.int8) - 8, (body >> 4).to(torch.int8) - 8), dim=1).view(-1)
    values = torch.zeros(groups * GROUP)
    values[:n] = codes[:n]
    values.view(groups, GROUP).mul_(scale[:, None])
    return values[:n]
