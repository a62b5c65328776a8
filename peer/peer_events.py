"""What a peer counts as it happens, for its metrics: the few numbers that are events, not state.

The cores hold almost every number an operator wants as state, read at scrape time (metrics.py);
suspicions, refutations, commit latencies and exclusions are events, counted here by the node and
the coordinator where they happen.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import Counter
from dataclasses import dataclass, field

from peer.core.exclusion import ExclusionKind
from peer.core.membership_types import MemberState

log = logging.getLogger("sitemesh.node")

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

EXCLUSION_KINDS = tuple(kind.value for kind in ExclusionKind)
"""Every label of the exclusion counter, so each series exists from the first scrape."""


@dataclass
class Histogram:
    """Cumulative-bucket histogram in seconds (what HistogramMetricFamily wants), no locking:
    observed and read on the node's event loop only."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if list(self.buckets) != sorted(self.buckets) or not self.buckets:
            raise ValueError(f"histogram buckets must be a non-empty ascending tuple, got {self.buckets}")
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.buckets, math.inf), self.counts):
            running += n
            out.append(("+Inf" if bound == math.inf else repr(bound), running))
        return out


@dataclass
class PeerEvents:
    """Event counts the cores do not keep as state."""

    suspicions: int = 0
    """Members this peer saw become SUSPECT."""
    refutations: int = 0
    """SUSPECT members that came back ALIVE (they refuted the suspicion with a new incarnation)."""
    excluded: Counter[str] = field(default_factory=Counter)
    """Contributions this peer, as leader, left out of a round, by ExclusionKind value."""
    commit_latency: Histogram = field(default_factory=Histogram)
    """Leader: seconds from proposing a round's commit to knowing it committed."""
    refused: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(layer, sender, message) -> membership and consensus messages refused as no honest peer
    sends them (forged or buggy; peer/core/membership_guard.py, consensus_checks.py)."""
    _proposed: dict[int, float] = field(default_factory=dict)

    def refused_message(self, layer: str, sender: str, what: str, reason: str) -> None:
        """A message no honest peer sends: a warning once per (layer, sender, message), so a hostile
        site cannot flood the log (the keys are bounded by the run's certificates and the message
        types), and always counted."""
        key = (layer, sender, what)
        if key not in self.refused:
            log.warning("%s refused %s from %s: %s; further refusals of this kind are only counted",
                        layer, what, sender, reason)
        self.refused[key] += 1

    def member_changed(self, old: MemberState | None, new: MemberState) -> None:
        if new is MemberState.SUSPECT:
            self.suspicions += 1
        elif old is MemberState.SUSPECT and new is MemberState.ALIVE:
            self.refutations += 1

    def proposed(self, round_: int, now: float) -> None:
        self._proposed[round_] = now

    def committed(self, round_: int, now: float) -> None:
        started = self._proposed.pop(round_, None)
        if started is not None:
            self.commit_latency.observe(max(now - started, 0.0))
        for old in [r for r in self._proposed if r < round_]:
            del self._proposed[old]  # proposals that lost their leadership never commit
