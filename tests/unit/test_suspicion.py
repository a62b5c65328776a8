"""Lifeguard suspicion timer: logarithmic shrink with independent confirmations."""

from __future__ import annotations

import math

import pytest

from peer.core.suspicion import Suspicion


@pytest.mark.parametrize("k,confirmations,expected", [
    (3, 0, 60.0),  # nobody agrees yet: the full (max) timeout
    (3, 1, 60.0 - 50.0 * math.log(2) / math.log(4)),
    (3, 2, 60.0 - 50.0 * math.log(3) / math.log(4)),
    (3, 3, 10.0),  # k confirmations: the minimum
    (3, 5, 10.0),  # more than k changes nothing
    (0, 0, 10.0),  # nobody could ever confirm (two members): start at the minimum
])
def test_timeout_shrinks_logarithmically(k: int, confirmations: int, expected: float) -> None:
    s = Suspicion("b", 4, "a", 100.0, 10.0, 60.0, k)
    for i in range(confirmations):
        s.confirm(f"c{i}")
    assert s.deadline == pytest.approx(100.0 + expected)
    assert s.confirmations == min(confirmations, k)


def test_confirmations_must_be_independent() -> None:
    s = Suspicion("b", 4, "a", 0.0, 10.0, 60.0, 3)
    assert not s.confirm("a")  # the first suspecter does not confirm itself
    assert s.confirm("c")
    assert not s.confirm("c")  # nor does anyone twice
    assert s.confirmations == 1


def test_invalid_bounds_are_rejected() -> None:
    with pytest.raises(ValueError):
        Suspicion("b", 0, "a", 0.0, 10.0, 5.0, 3)
    with pytest.raises(ValueError):
        Suspicion("b", 0, "a", 0.0, 0.0, 5.0, 3)
