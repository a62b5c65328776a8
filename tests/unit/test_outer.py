"""The DiLoCo outer step (peer/outer.py) against hand-written references on random tensors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.outer import outer_step, state_dict_hash

SHAPES = {"a.weight": (4, 3), "b.bias": (5,), "c": (2, 2, 2)}


def rand_state(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * scale for n, s in SHAPES.items()}


def reference(params, momentum, contributions, lr, mu):
    """The formula of the issue, element by element in float64 with Python scalars."""
    total = sum(n for _, n in contributions)
    new_p, new_m = {}, {}
    for name, p in params.items():
        flat_p = p.double().flatten().tolist()
        flat_m = momentum[name].double().flatten().tolist() if name in momentum else [0.0] * len(flat_p)
        deltas = [(d[name].double().flatten().tolist(), n) for d, n in contributions]
        out_p, out_m = [], []
        for i in range(len(flat_p)):
            mean = sum(n * d[i] for d, n in deltas) / total
            m = mu * flat_m[i] + mean
            out_m.append(m)
            out_p.append(flat_p[i] - lr * (mean + mu * m))
        new_p[name] = torch.tensor(out_p, dtype=torch.float64).reshape(p.shape)
        new_m[name] = torch.tensor(out_m, dtype=torch.float64).reshape(p.shape)
    return new_p, new_m


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for n in want:
        assert got[n].dtype == torch.float32
        torch.testing.assert_close(got[n].double(), want[n], rtol=1e-5, atol=1e-6)


def test_zero_contributions_change_nothing() -> None:
    params, momentum = rand_state(0), rand_state(1)
    for contributions in ([], [(rand_state(2), 0), (rand_state(3), 0)]):
        p, m = outer_step(params, momentum, contributions)
        assert all(torch.equal(p[n], params[n]) and torch.equal(m[n], momentum[n]) for n in SHAPES)


def test_one_contribution_is_a_normal_round() -> None:
    params, delta = rand_state(0), rand_state(1, 0.01)
    p, m = outer_step(params, None, [(delta, 1234)], lr=0.7, mu=0.9)
    assert_close(p, reference(params, {}, [(delta, 1234)], 0.7, 0.9)[0])
    assert_close(m, {n: delta[n].double() for n in SHAPES})  # first buffer is the gradient itself


@pytest.mark.parametrize("tokens", [[1, 1, 1], [100, 3000, 7], [5, 0, 2**31]])
def test_several_contributions_with_unequal_tokens(tokens: list[int]) -> None:
    params, momentum = rand_state(0), rand_state(1, 0.1)
    contributions = [(rand_state(10 + i, 0.01), n) for i, n in enumerate(tokens)]
    p, m = outer_step(params, momentum, contributions, lr=0.7, mu=0.9)
    live = [c for c in contributions if c[1] > 0]
    want_p, want_m = reference(params, momentum, live, 0.7, 0.9)
    assert_close(p, want_p)
    assert_close(m, want_m)


def test_matches_torch_sgd_nesterov_over_rounds() -> None:
    params = rand_state(0)
    modules = {n: torch.nn.Parameter(t.clone()) for n, t in params.items()}
    sgd = torch.optim.SGD(list(modules.values()), lr=0.5, momentum=0.8, nesterov=True)
    momentum: dict[str, torch.Tensor] = {}
    for r in range(4):
        contributions = [(rand_state(100 * r + i, 0.05), 10 * (i + 1)) for i in range(3)]
        params, momentum = outer_step(params, momentum, contributions, lr=0.5, mu=0.8)
        total = sum(n for _, n in contributions)
        for n, prm in modules.items():
            prm.grad = sum(d[n] * (k / total) for d, k in contributions)
        sgd.step()
    for n, prm in modules.items():
        torch.testing.assert_close(params[n], prm.detach(), rtol=1e-5, atol=1e-6)


def test_inputs_are_not_mutated() -> None:
    params, momentum, delta = rand_state(0), rand_state(1), rand_state(2)
    copies = [{n: t.clone() for n, t in s.items()} for s in (params, momentum, delta)]
    outer_step(params, momentum, [(delta, 3)])
    for orig, copy in zip((params, momentum, delta), copies):
        assert all(torch.equal(orig[n], copy[n]) for n in SHAPES)


def test_errors_are_reported() -> None:
    params = rand_state(0)
    with pytest.raises(ValueError, match="negative tokens"):
        outer_step(params, None, [(rand_state(1), -1)])
    with pytest.raises(KeyError, match="names differ"):
        outer_step(params, None, [({"a.weight": torch.zeros(4, 3)}, 1)])
    with pytest.raises(ValueError, match="mu"):
        outer_step(params, None, [], mu=1.0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=5), st.floats(0.1, 2.0), st.floats(0.0, 0.95))
def test_random_rounds_match_reference(tokens: list[int], lr: float, mu: float) -> None:
    params, momentum = rand_state(7), rand_state(8, 0.1)
    contributions = [(rand_state(20 + i, 0.01), n) for i, n in enumerate(tokens)]
    p, m = outer_step(params, momentum, contributions, lr=lr, mu=mu)
    live = [c for c in contributions if c[1] > 0]
    if not live:
        assert all(torch.equal(p[n], params[n]) for n in SHAPES)
        return
    want_p, want_m = reference(params, momentum, live, lr, mu)
    assert_close(p, want_p)
    assert_close(m, want_m)


def test_hash_sees_every_bit_name_and_dtype() -> None:
    state = rand_state(0)
    h = state_dict_hash(state)
    assert h == state_dict_hash({n: state[n].clone() for n in reversed(list(state))})
    flipped = {n: t.clone() for n, t in state.items()}
    flipped["b.bias"].view(torch.int32)[2] ^= 1  # one mantissa bit
    assert state_dict_hash(flipped) != h
    assert state_dict_hash({("x" if n == "c" else n): t for n, t in state.items()}) != h
    assert state_dict_hash({n: t.double() for n, t in state.items()}) != h
    assert state_dict_hash({n: t.reshape(-1) for n, t in state.items()}) != h
    assert state_dict_hash({"w": torch.ones(3, dtype=torch.bfloat16)}) != state_dict_hash({"w": torch.ones(3)})


_CHILD = """
import torch
from peer.outer import outer_step, state_dict_hash
torch.set_num_threads({threads})
def rs(seed, scale):
    g = torch.Generator().manual_seed(seed)
    return {{n: torch.randn(s, generator=g) * scale for n, s in {shapes!r}.items()}}
p, m = rs(0, 1.0), {{}}
for r in range(3):
    p, m = outer_step(p, m, [(rs(10 * r + i, 0.01), 1000 + 37 * i) for i in range(3)])
print(state_dict_hash(p), state_dict_hash(m))
"""


def test_bit_identical_across_processes() -> None:
    shapes = {"big": (257, 129), **SHAPES}  # wide enough for vectorised kernels and their tails
    outs = {
        subprocess.run([sys.executable, "-c", _CHILD.format(threads=t, shapes=shapes)],
                       check=True, capture_output=True, text=True).stdout
        for t in (1, 2)
    }
    assert len(outs) == 1 and len(outs.pop().split()) == 2


def test_a_bf16_mean_steps_exactly_as_the_same_values_in_fp32() -> None:
    # The node receives the mean in the wire dtype (SiteTraining._take_mean): bf16 -> fp32 is exact,
    # so θ and the momentum must be bit for bit those of an fp32 mean holding the same values.
    g = torch.Generator().manual_seed(5)
    params = {n: torch.randn(33, 7, generator=g) for n in ("a", "b")}
    momentum = {n: torch.randn(33, 7, generator=g) for n in ("a", "b")}
    mean = {n: torch.randn(33, 7, generator=g).bfloat16() for n in ("a", "b")}
    got = outer_step(params, momentum, [(mean, 123)], lr=0.7, mu=0.9)
    want = outer_step(params, momentum, [({n: t.float() for n, t in mean.items()}, 123)], lr=0.7, mu=0.9)
    for side in (0, 1):
        assert all(torch.equal(got[side][n], want[side][n]) and got[side][n].dtype == torch.float32 for n in params)
