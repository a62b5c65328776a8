"""Lifeguard local health awareness (LHM): a member that misses its own acks and nacks slows down.

Lifeguard (Dadgar, Phillips, Currey, "Lifeguard: Local Health Awareness for More Accurate Failure
Detection", 2018, section IV-A) observes that a member that cannot get its probes answered is more
likely slow itself (CPU starvation, GC, a saturated link) than surrounded by dead peers. It keeps a
score: +1 for a failed probe, + (expected - received) nacks, +1 when it has to refute a suspicion
about itself, -1 for every successful probe. Probe interval, probe timeout and the suspicion
timeouts it starts are multiplied by score + 1, so a sick member accuses others less and slower.

    python -c "from peer.core.awareness import Awareness; a = Awareness(8); a.apply(3); print(a.multiplier)"
"""

from __future__ import annotations


class Awareness:
    """Local health score in [0, max_multiplier - 1]; 0 is healthy."""

    def __init__(self, max_multiplier: int) -> None:
        if max_multiplier < 1:
            raise ValueError("max_multiplier must be >= 1")
        self._max = max_multiplier
        self.score = 0

    def apply(self, delta: int) -> None:
        """Add delta (positive: evidence we are unhealthy), clamped to the allowed range."""
        self.score = min(self._max - 1, max(0, self.score + delta))

    @property
    def multiplier(self) -> int:
        """Factor for timeouts and intervals: score + 1."""
        return self.score + 1

    def scale(self, seconds: float) -> float:
        """`seconds` stretched by the current health."""
        return seconds * self.multiplier
