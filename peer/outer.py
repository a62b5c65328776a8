"""The DiLoCo outer step: token-weighted mean of pseudo-gradients, then Nesterov momentum.

DiLoCo (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1): each site s trains H inner steps from
θ and reports its pseudo-gradient Δ_s = θ − θ_s and the number of tokens n_s it trained. Every peer
then computes, in fp32,

    Δ̄ = Σ_s n_s Δ_s / Σ_s n_s                 (token-weighted; sites with more data count more)
    m ← μ m + Δ̄                               (torch.optim.SGD(momentum=μ, nesterov=True,
    θ ← θ − lr (Δ̄ + μ m)                       dampening=0) with Δ̄ as the gradient)

DiLoCo's values are lr = 0.7, μ = 0.9; the node's default is μ = 0 and an lr set by the run's
length, 1 (plain averaging) up to 16 rounds and 0.6 from 22 rounds on (peer/outer_config.lr_for,
docs/decisions/outer-defaults.md).

Bit-identical everywhere. Every peer must arrive at the same θ_r (invariant I7, checked with
`state_dict_hash`). So the arithmetic is fixed: contributions are summed in the order given (callers
pass them sorted by site name), the weights n_s / Σn are computed in float64 by Python and rounded
once to fp32, and only separately rounded elementwise multiplies and adds are used — no `alpha=`,
`addcmul` or `lerp`, whose vectorised kernels may fuse into an FMA on one CPU and not on another.
IEEE-754 rounds each of these operations exactly, so the result does not depend on the machine,
the SIMD width or CPU vs GPU.

Zero contributions are a normal (empty) round: parameters and momentum come back unchanged (the
momentum is not decayed, as if the round did not happen). One contribution is a normal round.

Try it:
    .venv/bin/python -c "import torch; from peer.outer import outer_step; p={'w': torch.ones(2)}; print(outer_step(p, {}, [({'w': torch.full((2,), .1)}, 5)]))"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import blake3
import torch

WeightedDelta = tuple[Mapping[str, torch.Tensor], int]
"""(pseudo_gradient = θ_global − θ_local by parameter name, tokens trained)."""

DEFAULT_LR = 0.7
DEFAULT_MU = 0.9


def weighted_mean(contributions: Sequence[WeightedDelta], names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Δ̄ = Σ n_s Δ_s / Σ n_s in fp32, summed in list order. Requires at least one token."""
    total = sum(n for _, n in contributions)
    if total <= 0:
        raise ValueError("weighted_mean needs contributions with a positive token total")
    # float64 division in Python, one rounding to fp32: the same weights on every machine.
    weights = [torch.tensor(n / total, dtype=torch.float32) for _, n in contributions]
    mean: dict[str, torch.Tensor] = {}
    for name in names:
        acc: torch.Tensor | None = None
        for (delta, _), w in zip(contributions, weights):
            term = torch.mul(delta[name].to(torch.float32), w.to(delta[name].device))
            acc = term if acc is None else torch.add(acc, term)
        assert acc is not None
        mean[name] = acc
    return mean


def outer_step(
    params: Mapping[str, torch.Tensor],
    momentum: Mapping[str, torch.Tensor] | None,
    contributions: Sequence[WeightedDelta],
    lr: float = DEFAULT_LR,
    mu: float = DEFAULT_MU,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One outer step; returns new (params, momentum) and leaves the inputs untouched.

    params: global weights θ (fp32) by name. momentum: the outer momentum buffers by name; empty or
    None before the first round (treated as zeros, which equals torch SGD's first-step buffer).
    contributions: `(pseudo_gradient, tokens)` pairs in a fixed order (sorted by site); pairs with
    0 tokens are ignored, and if none remain nothing changes. Every pseudo-gradient must have
    exactly the names of `params`.
    """
    _check_rates(lr, mu)
    for i, (delta, n) in enumerate(contributions):
        if n < 0:
            raise ValueError(f"contribution {i} has negative tokens {n}")
        if delta.keys() != params.keys():
            raise KeyError(f"contribution {i}: pseudo-gradient names differ from the parameters'")
    live = [c for c in contributions if c[1] > 0]
    if not live:
        return dict(params), dict(momentum or {})
    return nesterov_step(params, momentum, weighted_mean(live, sorted(params)), lr, mu)


def nesterov_step(
    params: Mapping[str, torch.Tensor],
    momentum: Mapping[str, torch.Tensor] | None,
    mean: Mapping[str, torch.Tensor],
    lr: float = DEFAULT_LR,
    mu: float = DEFAULT_MU,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The step of `outer_step` from a mean formed elsewhere (the exchange's reduction, in the same
    fixed order): new (params, momentum); neither input nor `mean` is changed or kept."""
    _check_rates(lr, mu)
    if mean.keys() != params.keys():
        raise KeyError("the mean's names differ from the parameters'")
    momentum = momentum or {}
    names = sorted(params)
    mu_t = torch.tensor(mu, dtype=torch.float32)
    lr_t = torch.tensor(lr, dtype=torch.float32)
    new_params: dict[str, torch.Tensor] = {}
    new_momentum: dict[str, torch.Tensor] = {}
    for name in names:
        p, g = params[name], mean[name]
        m = momentum.get(name)
        mu_d = mu_t.to(g.device)
        buf = g.clone() if m is None else torch.add(torch.mul(m, mu_d), g)
        step = torch.add(g, torch.mul(buf, mu_d))
        new_params[name] = torch.sub(p.to(torch.float32), torch.mul(step, lr_t.to(g.device)))
        new_momentum[name] = buf
    return new_params, new_momentum


def _check_rates(lr: float, mu: float) -> None:
    if lr <= 0 or not 0 <= mu < 1:
        raise ValueError(f"outer lr={lr} must be > 0 and mu={mu} in [0, 1)")


def state_dict_hash(state: Mapping[str, torch.Tensor]) -> str:
    """blake3 hex digest of a state dict: names (sorted), dtypes, shapes and raw bytes.

    Peers compare it after every round (invariant I7); equal hashes mean bit-identical weights.
    """
    h = blake3.blake3()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        # Viewed as bytes: every dtype (bf16 included) hashes exactly as it is stored.
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
