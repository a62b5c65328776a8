"""The event counts behind the metrics endpoint (the live endpoint: tests/integration/test_watch_run.py)."""

from __future__ import annotations

import math

import pytest

from peer.core.exclusion import ExclusionKind
from peer.core.membership_types import MemberState
from peer.peer_events import EXCLUSION_KINDS, Histogram, PeerEvents


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    for s in (0.05, 0.1, 0.5, 3.0):
        h.observe(s)
    assert h.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert math.isclose(h.total, 3.65)
    with pytest.raises(ValueError, match="ascending"):
        Histogram((1.0, 0.1))


def test_commit_latency_only_for_rounds_this_peer_proposed() -> None:
    ev = PeerEvents()
    ev.proposed(3, now=10.0)
    ev.committed(2, now=10.5)  # proposed by an earlier leader: no latency here
    ev.committed(3, now=10.25)
    assert ev.commit_latency.cumulative()[-1] == ("+Inf", 1)
    assert ev.commit_latency.total == pytest.approx(0.25)
    ev.proposed(4, now=11.0)  # lost its leadership: round 4 committed by someone else as round 5
    ev.committed(5, now=12.0)
    assert ev._proposed == {}


def test_suspicions_and_refutations() -> None:
    ev = PeerEvents()
    alive, suspect, dead = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD
    for old, new in ((alive, suspect), (suspect, alive), (alive, suspect), (suspect, dead), (None, alive)):
        ev.member_changed(old, new)
    assert (ev.suspicions, ev.refutations) == (2, 1)


def test_every_exclusion_kind_is_a_label_from_the_first_scrape() -> None:
    assert set(EXCLUSION_KINDS) == {k.value for k in ExclusionKind} and "not_leased" in EXCLUSION_KINDS
