"""A simulated consensus cluster on one shared clock with a fixed one-way delay and no random faults.

The harness of the consensus unit tests (time travel, targeted crash, pause and partition) and of
scripts/bench_consensus; the invariants are `Cluster`'s (peer/sim/consensus_cluster.py).

    .venv/bin/python -m pytest tests/unit/test_election_core.py tests/unit/test_commitlog_replication.py -q
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable

from peer.core.commitlog import Contributor, Round, RoundCommit
from peer.core.consensus_checks import Message
from peer.core.consensus_effects import Answer, Effect, Send
from peer.core.election import ElectionConfig, Role, SiteId
from peer.sim.consensus_cluster import SIM_CONFIG, Cluster



class Lockstep:
    """A cluster on one shared clock with a fixed one-way delay and no random faults: the harness of
    the unit tests (time travel, targeted crash/pause/partition) and of scripts/bench_consensus."""

    def __init__(self, sites: int | Iterable[str], config: ElectionConfig = SIM_CONFIG, delay: float = 0.001,
                 seed: int = 0) -> None:
        names = [f"s{i:02d}" for i in range(sites)] if isinstance(sites, int) else list(sites)
        self.cluster = Cluster(config, seed, {SiteId(s): f"{s}:7000" for s in names})
        self.delay, self.t, self.n = delay, 0.0, 0
        self.queue: list[tuple[float, int, SiteId, Message]] = []
        self.blocked: set[tuple[SiteId, SiteId]] = set()
        self.paused: set[SiteId] = set()
        self.sent = 0

    def post(self, src: SiteId, sends: list[Send]) -> None:
        for s in sends:
            self.sent += 1
            if (src, s.to) not in self.blocked:
                self.n += 1
                heapq.heappush(self.queue, (self.t + self.delay, self.n, s.to, s.msg))

    def _due(self) -> tuple[float, SiteId | None]:
        best: tuple[float, SiteId | None] = (self.queue[0][0], None) if self.queue else (math.inf, None)
        for site in self.cluster.live():
            if site not in self.paused:
                d = self.cluster.core(site).next_deadline()
                if d < best[0]:
                    best = (d, site)
        return best

    def step(self, until: float) -> bool:
        """Process the next event at or before `until`; False when there is none."""
        t, site = self._due()
        if t > until:
            self.t = until
            return False
        self.t = max(self.t, t)
        if site is not None:
            self.post(site, self.cluster.tick(site, self.t))
            return True
        _, _, to, msg = heapq.heappop(self.queue)
        if self.cluster.cores.get(to) is None or to in self.paused:
            return True  # lost: the process is down or stopped (its socket buffer is not modelled)
        self.post(to, self.cluster.deliver(to, msg, self.t))
        return True

    def run_for(self, dt: float) -> None:
        end = self.t + dt
        while self.step(end):
            pass

    def run_until(self, pred: Callable[[], bool], timeout: float) -> bool:
        end = self.t + timeout
        while not pred():
            if not self.step(end):
                return pred()
        return True

    def leaders(self) -> list[SiteId]:
        """Live, running peers that are leader and hold a valid lease now."""
        return [s for s in self.cluster.live() if s not in self.paused
                and self.cluster.core(s).role is Role.LEADER and self.t < self.cluster.core(s)._lease_expiry()]

    def leader(self) -> SiteId | None:
        held = self.leaders()
        return held[0] if len(held) == 1 else None

    def propose(self, site: SiteId, contributors: tuple[Contributor, ...] = ()) -> Answer:
        core = self.cluster.core(site)
        rnd = Round(core.log.last_round_entry()[0] + 1)
        d = core.propose_round(RoundCommit(rnd, contributors, f"w{rnd}".encode()), self.t)
        self.post(site, self.cluster.execute(site, d.effects))
        return d

    def do(self, site: SiteId, effects: list[Effect]) -> None:
        self.post(site, self.cluster.execute(site, effects))
