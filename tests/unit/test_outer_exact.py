"""I7 for the outer step, exactly: `torch.equal` against separately rounded fp32 operations, and a
fixed hash of the result of a fixed input (tests/fixtures/outer_step_golden.json).

peer/outer.py promises bit-identical θ on any machine because it uses only separately rounded
elementwise multiplies and adds. A tolerance test cannot see a fused multiply-add (`addcmul`,
`add(alpha=)`, `lerp`), which rounds once instead of twice; these tests can. The reference below is
NumPy float32, one ufunc per operation of the documented formula, so each intermediate is rounded to
fp32 exactly as IEEE-754 prescribes, independently of torch's kernels.

The inputs are integers scaled by a power of two (exact in fp32), not `torch.randn`, so that the
input itself does not depend on the machine's libm. Regenerate the golden hash (only after a
deliberate change of the arithmetic, which breaks I7 between old and new peers) with

    SITEMESH_REGEN_FIXTURES=1 .venv/bin/python -m pytest -q tests/unit/test_outer_exact.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from peer.outer import outer_step, state_dict_hash

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "outer_step_golden.json"
REGEN = os.environ.get("SITEMESH_REGEN_FIXTURES") == "1"
# Wide enough for the vectorised kernels and their scalar tails; odd sizes on purpose.
SHAPES = {"big": (257, 129), "b.bias": (5,), "c": (2, 3, 7)}
TOKENS = [1000, 3037, 17]
LR, MU = 0.7, 0.9


def exact_state(seed: int, bits: int) -> dict[str, torch.Tensor]:
    """Values k * 2**-bits with |k| < 2**20: exact in fp32, the same bits on every machine."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randint(-(2**20), 2**20, s, generator=g, dtype=torch.int64).to(torch.float32) * 2.0**-bits
            for n, s in SHAPES.items()}


def inputs() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[tuple[dict[str, torch.Tensor], int]]]:
    params, momentum = exact_state(1, 20), exact_state(2, 24)
    contributions = [(exact_state(10 + i, 27), n) for i, n in enumerate(TOKENS)]
    return params, momentum, contributions


def numpy_reference(params, momentum, contributions, lr, mu):  # type: ignore[no-untyped-def]
    """Δ̄ = Σ w_s Δ_s (w_s = fp32(n_s / Σn), summed in list order); m ← μ·m + Δ̄; θ ← θ − η·(Δ̄ + μ·m),
    every multiply and add its own fp32-rounded NumPy operation."""
    f32 = np.float32
    total = sum(n for _, n in contributions)
    weights = [f32(n / total) for _, n in contributions]
    mu32, lr32 = f32(mu), f32(lr)
    new_p, new_m = {}, {}
    for name in sorted(params):
        mean = None
        for (delta, _), w in zip(contributions, weights):
            term = np.multiply(delta[name].numpy(), w, dtype=f32)
            mean = term if mean is None else np.add(mean, term, dtype=f32)
        m = np.add(np.multiply(momentum[name].numpy(), mu32, dtype=f32), mean, dtype=f32)
        step = np.add(mean, np.multiply(m, mu32, dtype=f32), dtype=f32)
        new_p[name] = torch.from_numpy(np.subtract(params[name].numpy(), np.multiply(step, lr32, dtype=f32),
                                                   dtype=f32))
        new_m[name] = torch.from_numpy(m)
    return new_p, new_m


def test_outer_step_equals_separately_rounded_fp32_operations() -> None:
    params, momentum, contributions = inputs()
    p, m = outer_step(params, momentum, contributions, lr=LR, mu=MU)
    want_p, want_m = numpy_reference(params, momentum, contributions, LR, MU)
    for name in SHAPES:
        differ_p = (p[name] != want_p[name]).sum().item()
        differ_m = (m[name] != want_m[name]).sum().item()
        assert torch.equal(m[name], want_m[name]), f"{name}: {differ_m} momentum elements differ"
        assert torch.equal(p[name], want_p[name]), f"{name}: {differ_p} θ elements differ"


def test_outer_step_of_a_fixed_input_has_the_golden_hash() -> None:
    params, momentum, contributions = inputs()
    p, m = outer_step(params, momentum, contributions, lr=LR, mu=MU)
    got = {"input": state_dict_hash({**params, **{f"m.{n}": t for n, t in momentum.items()},
                                     **{f"d{i}.{n}": t for i, (d, _) in enumerate(contributions)
                                        for n, t in d.items()}}),
           "params": state_dict_hash(p), "momentum": state_dict_hash(m)}
    if REGEN:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert got["input"] == want["input"], "the fixed input changed (the test, not outer.py): regenerate"
    assert got == want, "outer_step's result changed bit-wise: I7 between old and new peers is broken"
