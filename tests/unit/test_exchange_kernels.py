"""The compiled bf16 kernels of peer/exchange/kernels.py against torch: the same bits (invariant I7),
and an exact finite check.

    .venv/bin/python -m pytest tests/unit/test_exchange_kernels.py -q
"""

from __future__ import annotations

import pytest
import torch

from peer.exchange import finite, kernels
from peer.exchange.allreduce import REDUCE_BLOCK, weighted_sum


def _torch_mean(values: list[torch.Tensor], factors: list[float]) -> torch.Tensor:
    """What the reduction computed before the kernel: torch's multiply, then add, in fp32, rounded to bf16."""
    acc = torch.empty(values[0].numel())
    weighted_sum(list(zip(values, factors)), acc, torch.empty(min(acc.numel(), REDUCE_BLOCK)))
    return acc.to(torch.bfloat16)


@pytest.mark.parametrize("sites", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [1, 2047, 2048, 2049, 70_001])
def test_the_weighted_sum_has_torchs_bits(sites: int, n: int) -> None:
    g = torch.Generator().manual_seed(sites * 100_003 + n)
    for magnitude in (1e-30, 1e-3, 1.0, 1e4, 1e30):
        values = [(torch.randn(n, generator=g) * magnitude).to(torch.bfloat16) for _ in range(sites)]
        tokens = torch.randint(1, 10_000, (sites,), generator=g).tolist()
        factors = [t / sum(tokens) for t in tokens]  # doubles: both round them to fp32
        out = torch.empty(n, dtype=torch.bfloat16)
        assert kernels.bf16_weighted_sum(values, factors, out)
        want = _torch_mean(values, factors)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), magnitude


def test_rounding_ties_go_to_even_as_torch_rounds() -> None:
    # bf16 keeps 8 significant bits: 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7 (a tie),
    # and 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6.
    a = torch.tensor([1.0, 1.0, 1.0 + 2**-7, -1.0], dtype=torch.bfloat16)
    b = torch.tensor([2**-8, 3 * 2**-8, 2**-8, -(2**-8)], dtype=torch.bfloat16)
    out = torch.empty(4, dtype=torch.bfloat16)
    assert kernels.bf16_weighted_sum([a, b], [1.0, 1.0], out)
    assert torch.equal(out.view(torch.int16), _torch_mean([a, b], [1.0, 1.0]).view(torch.int16))
    assert out.tolist() == [1.0, 1.0 + 2**-6, 1.0 + 2**-6, -1.0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_term_makes_the_sum_not_finite(bad: float) -> None:
    values = [torch.ones(5000, dtype=torch.bfloat16) for _ in range(3)]
    values[1][4321] = bad
    assert not kernels.bf16_weighted_sum(values, [0.2, 0.3, 0.5], torch.empty(5000, dtype=torch.bfloat16))


def test_a_sum_that_overflows_bf16_is_not_finite() -> None:
    big = torch.full((10,), 3.0e38, dtype=torch.bfloat16)
    out = torch.empty(10, dtype=torch.bfloat16)
    assert not kernels.bf16_weighted_sum([big, big], [1.0, 1.0], out)
    assert kernels.bf16_weighted_sum([big, big], [0.5, 0.5], out)


def test_the_finite_check_is_exact_on_every_bf16_value() -> None:
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    finite = torch.isfinite(every)
    assert int((~finite).sum()) == 2 * (2**7 + 1) - 2  # +-Inf and the NaNs (all exponent bits set)
    for i in range(every.numel()):
        assert kernels.bf16_finite(every[i : i + 1]) == bool(finite[i]), hex(int(every.view(torch.int16)[i]))
    assert not kernels.bf16_finite(every) and kernels.bf16_finite(every[finite])
    assert kernels.bf16_finite(torch.empty(0, dtype=torch.bfloat16))


def test_codec_checks_bf16_chunks_with_the_kernel() -> None:
    x = torch.randn(10_000).to(torch.bfloat16)
    assert finite.is_finite(x)
    x[7777] = float("nan")
    assert not finite.is_finite(x)
    assert finite.is_finite(x[::2]) and not finite.is_finite(x[1::2])  # strided: torch's sum, same answer


def test_bad_arguments_are_refused_with_what_is_wrong() -> None:
    bf = torch.zeros(4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        kernels.bf16_finite(torch.zeros(4))
    with pytest.raises(ValueError, match="contiguous"):
        kernels.bf16_finite(torch.zeros(8, dtype=torch.bfloat16)[::2])
    with pytest.raises(ValueError, match="lengths"):
        kernels.bf16_weighted_sum([bf, torch.zeros(5, dtype=torch.bfloat16)], [1.0, 1.0], bf)
    with pytest.raises(ValueError, match="at least one"):
        kernels.bf16_weighted_sum([], [], bf)


def test_terms_from_any_buffer_mix_read_only_bytes_with_tensors() -> None:
    """A chunk received over gRPC is read-only bytes, one received on the bulk plane a writable
    buffer, a local one a uint8 tensor: one sum takes them together, with the tensors' bits."""
    g = torch.Generator().manual_seed(5)
    values = [torch.randn(3000, generator=g).to(torch.bfloat16) for _ in range(3)]
    as_bytes = bytes(values[0].view(torch.uint8).numpy())
    as_buffer = memoryview(bytearray(values[1].view(torch.uint8).numpy()))
    out = torch.empty(6000, dtype=torch.uint8)
    assert kernels.bf16_weighted_sum([as_bytes, as_buffer, values[2].view(torch.uint8)], [0.2, 0.3, 0.5], out)
    want = _torch_mean(values, [0.2, 0.3, 0.5])
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert kernels.bf16_finite(as_bytes) and kernels.bf16_finite(as_buffer)
