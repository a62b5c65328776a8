"""Fake clocks for the simulator: one true timeline, and per-node clocks with skew and jumps.

Each node reads its own clock: `local = base + rate * true`, where `rate` models oscillator drift
(e.g. 1.0001) and `base` an offset; `jump(seconds)` moves a node's clock forward at once (a suspended
VM, an NTP-stepped clock used as if it were monotonic). Clocks never go backwards: protocol cores are
fed a monotonic clock (`time.monotonic()` in the real node). The runner converts a node's local
deadline back to true time with `to_true` to schedule its next tick.

    python -c "from peer.sim.clock import NodeClock; c = NodeClock(offset=5, rate=1.01); \
print(c.local(10.0), c.to_true(c.local(10.0)))"
"""

from __future__ import annotations

import math


class NodeClock:
    """A node's view of time as an affine function of true time; forward jumps only."""

    def __init__(self, offset: float = 0.0, rate: float = 1.0) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.base = offset
        self.rate = rate

    def local(self, true_time: float) -> float:
        return self.base + self.rate * true_time

    def to_true(self, local_time: float) -> float:
        """The earliest true time at which this clock reads at least `local_time` (if no jump
        happens first). Rounded up, so a node woken then finds its deadline reached."""
        t = (local_time - self.base) / self.rate
        while self.local(t) < local_time:
            t = math.nextafter(t, math.inf)
        return t

    def jump(self, seconds: float) -> None:
        """Step the clock forward by `seconds` from now on."""
        if seconds < 0:
            raise ValueError("clocks fed to cores are monotonic: jumps go forward only")
        self.base += seconds
