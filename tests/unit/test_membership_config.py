"""Membership configuration: validation, presets, and the derived detection bound."""

from __future__ import annotations

import dataclasses
import math

import pytest

from peer.core.awareness import Awareness
from peer.core.membership import MembershipConfig

PRESETS = [MembershipConfig.lan(), MembershipConfig.wan(), MembershipConfig.local_test()]


@pytest.mark.parametrize("change", [
    {"probe_interval_s": 0.0},
    {"probe_timeout_s": -1.0},
    {"probe_timeout_s": 1.0},  # not shorter than the interval: no room for indirect probes
    {"indirect_checks": 0},
    {"suspicion_max_timeout_mult": 0.5},
    {"retransmit_mult": 2.5},
    {"push_pull_interval_s": float("inf")},
    {"gossip_nodes": 0},
])
def test_invalid_values_are_rejected(change: dict) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(MembershipConfig.lan(), **change)


def test_every_field_is_documented_and_every_preset_value_explained() -> None:
    import inspect

    source = inspect.getsource(MembershipConfig)
    for f in dataclasses.fields(MembershipConfig):
        after = source.split(f"    {f.name}:", 1)[1].splitlines()[1].strip()
        assert after.startswith('"""'), f"{f.name} has no docstring"
    for preset in ("wan", "local_test"):
        body = inspect.getsource(getattr(MembershipConfig, preset))
        for f in dataclasses.fields(MembershipConfig):
            line = next(ln for ln in body.splitlines() if ln.strip().startswith(f"{f.name}="))
            assert "#" in line, f"{preset}.{f.name} has no why"


def test_wan_tolerates_round_trips_and_gc_pauses() -> None:
    wan = MembershipConfig.wan()
    assert wan.probe_timeout_s >= 5 * 0.150  # several worst-case RTTs
    assert wan.suspicion_min_s(2) > 10.0  # a multi-second GC pause is refuted long before death


@pytest.mark.parametrize("cfg", PRESETS)
def test_detection_bound_formula_and_growth(cfg: MembershipConfig) -> None:
    n = 20
    expected = ((2 * n - 1) * cfg.probe_interval_s + cfg.suspicion_max_s(n)) + cfg.probe_timeout_s
    assert cfg.detection_bound_s(n) == pytest.approx(expected)
    assert cfg.detection_bound_s(n, 4) > cfg.detection_bound_s(n)
    assert cfg.detection_bound_s(1) == 0.0
    bounds = [cfg.detection_bound_s(k) for k in (3, 10, 100)]
    assert bounds == sorted(bounds)
    assert cfg.convergence_bound_s(n) > cfg.detection_bound_s(n)


def test_derived_quantities() -> None:
    cfg = MembershipConfig.lan()
    assert cfg.suspicion_min_s(5) == cfg.suspicion_mult * cfg.probe_interval_s  # log10 floor of 1
    assert cfg.suspicion_min_s(1000) == pytest.approx(3 * cfg.suspicion_mult)
    assert cfg.suspicion_max_s(1000) == pytest.approx(cfg.suspicion_max_timeout_mult * 12.0)
    assert cfg.retransmit_limit(9) == cfg.retransmit_mult
    assert cfg.retransmit_limit(1000) == cfg.retransmit_mult * math.ceil(math.log10(1001))


@pytest.mark.parametrize("deltas,score", [([1, 1, 1], 3), ([5, 5], 7), ([3, -1, -1, -5], 0)])
def test_awareness_is_clamped(deltas: list[int], score: int) -> None:
    a = Awareness(8)
    for d in deltas:
        a.apply(d)
    assert a.score == score and a.multiplier == score + 1 and a.scale(2.0) == 2.0 * (score + 1)
