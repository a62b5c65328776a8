"""Seeded fake network between addresses: latency, drop, duplicate, reorder, delay, partitions.

Every `send` decides the fate of one message at once, from the seeded RNG: lost (and why), or
delivered after a delay (twice, when duplicated). Faults are knobs the fault schedule turns:

- `drop_rate`, `duplicate_rate`: probabilities per message.
- `reorder_rate`, `reorder_window_s`: a message is held back a random extra delay up to the window,
  so later messages overtake it.
- `extra_delay_s`: added jitter, uniform in [0, extra_delay_s], on top of the base latency.
- `partition(groups)` (symmetric), `one_way(src, dst)` (src cannot reach dst, the reverse works),
  `bridge(left, right, bridges)` (left and right cannot talk, the bridge members reach both);
  `heal()` lifts every cut.

Crashed and paused nodes are the runner's business (it knows the nodes); the network only moves
messages between addresses and counts what happened to them (`stats`).

    python -c "import random; from peer.sim.network import SimNetwork; n = SimNetwork(random.Random(1)); \
n.partition([['a'], ['b']]); print(n.send('a', 'b', 0.0), n.stats)"
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence


class SimNetwork:
    """Decides delivery times of messages between addresses under the current faults."""

    def __init__(self, rng: random.Random, latency_s: tuple[float, float] = (0.0002, 0.001)) -> None:
        lo, hi = latency_s
        if not 0 <= lo <= hi:
            raise ValueError("latency_s must be (low, high) with 0 <= low <= high")
        self._rng = rng
        self.latency_s = latency_s
        self.drop_rate = 0.0
        self.duplicate_rate = 0.0
        self.reorder_rate = 0.0
        self.reorder_window_s = 0.0
        self.extra_delay_s = 0.0
        self._cut: set[tuple[str, str]] = set()  # (src, dst) pairs that cannot communicate
        self.stats: Counter[str] = Counter()

    # -- faults ------------------------------------------------------------------------------------

    @property
    def lossy(self) -> bool:
        """Whether any message can be lost right now (drop or partition)."""
        return self.drop_rate > 0 or bool(self._cut)

    def partition(self, groups: Sequence[Iterable[str]]) -> None:
        """Symmetric partition: members of different groups cannot reach each other."""
        sets = [list(g) for g in groups]
        for i, a in enumerate(sets):
            for b in sets[i + 1:]:
                self._cut_pairs(a, b)
                self._cut_pairs(b, a)

    def one_way(self, src: Iterable[str], dst: Iterable[str]) -> None:
        """Messages from `src` to `dst` are lost; the other direction still works."""
        self._cut_pairs(list(src), list(dst))

    def bridge(self, left: Iterable[str], right: Iterable[str]) -> None:
        """`left` and `right` cannot talk directly; members in neither group (the bridges) reach
        both sides, so information can only flow through them (a classic SWIM stress case)."""
        self.partition([left, right])

    def heal(self) -> None:
        self._cut.clear()

    def _cut_pairs(self, src: list[str], dst: list[str]) -> None:
        self._cut.update((s, d) for s in src for d in dst if s != d)

    def reachable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self._cut

    # -- sending -----------------------------------------------------------------------------------

    def send(self, src: str, dst: str, now: float) -> list[float]:
        """Delivery times of one message from src to dst sent at `now` (empty: lost)."""
        self.stats["sent"] += 1
        if (src, dst) in self._cut:
            self.stats["lost_partition"] += 1
            return []
        rng = self._rng
        if self.drop_rate and rng.random() < self.drop_rate:
            self.stats["lost_drop"] += 1
            return []
        copies = 2 if self.duplicate_rate and rng.random() < self.duplicate_rate else 1
        if copies == 2:
            self.stats["duplicated"] += 1
        times = []
        for _ in range(copies):
            delay = rng.uniform(*self.latency_s)
            if self.extra_delay_s:
                delay += rng.uniform(0, self.extra_delay_s)
            if self.reorder_rate and rng.random() < self.reorder_rate:
                delay += rng.uniform(0, self.reorder_window_s)
                self.stats["reordered"] += 1
            times.append(now + delay)
        return times
