"""The whole-peer simulation's parameters: its timings and bounds, and `PeerSimConfig`.

The timings are those of a local test run, short enough that a seed covers two data epochs with every
fault in a few simulated minutes; the bounds are what the invariants (peer/sim/peer_world.py) and the
fault phases (peer/sim/peer_faults.py) hold the run to.

    ops simulate --protocol peer --members 5 --seeds 0:100 --faults all
"""

from __future__ import annotations

from dataclasses import dataclass, field

from peer.core import rounds as r
from peer.core.election import ElectionConfig
from peer.core.lease_config import LeaseConfig

RAFT = ElectionConfig(election_timeout_min_s=1.0, election_timeout_max_s=2.0, heartbeat_interval_s=0.2,
                      max_clock_drift=0.01, max_batch=16)
"""Consensus timing: failover well within a round deadline and a lease ttl."""
DETECT_S = 1.5
"""Membership's delay between a crash (or a start) and the verdict the cores are told."""
LEAVE_WAIT_S = 4 * RAFT.election_timeout_max_s
"""How long a leaving voter waits for its removal to commit (as `Node.leave`): room for an election."""
LEFT_S = 0.2
"""Membership's delay between a graceful leave and the LEFT verdict (gossip, no suspicion)."""
UP_S = 0.5
"""Membership's delay between a fast restart (back before it was declared dead) and the news of the
new process (its new address, or its refutation of a suspicion), which the cores get as member_alive."""
RESEND_S = 0.5
"""A site that came back up while the leader waited for its report must hold the open round's open
within this long of the leader hearing so (a message's latency is at most 70 ms here)."""
LEAVE_ALL_WAIT_S = 40.0
"""The leave wait of the `leave` phase's SIGTERM to every site at once: far longer than the rest of
the leave (as a real run's 120 s round deadline is), so a wait that runs out stands out."""
LEAVE_ALL_S = 20.0
"""Every site stops within this long of a SIGTERM to all of them at once (its round's work and
its seat's leave); a leave wait for a round nobody opens would take LEAVE_ALL_WAIT_S."""
LIVENESS_S = 30.0
"""While the live, connected sites hold a majority of the voters, some round commits within this long
of the last commit or the last fault action (the longest stall seen over 1,000 seeds is in
docs/decisions/site-round-core.md)."""
CONVERGE_S = 30.0
"""After the last round commits, every site that is up holds θ of it within this long (convergence)."""
GRACE_S = 0.2
"""Messages sent before a cut still arrive (the network decides a message's fate when it is sent):
a minority may finish what a majority acked up to this long after the cut."""
EXTRA_KINDS = ("leave", "restart")
"""Faults of this simulator beyond peer.sim.faults.KINDS: `leave` (`ops leave` site after site down
to one, which commits rounds alone, then they join again) and `restart` (every site killed at once
and restarted from its disk)."""
TOKENS_PER_SAMPLE = 8
"""Tokens the fake trainer claims per sample trained (a leader with keys bounds claims by it)."""


@dataclass(frozen=True)
class PeerSimConfig:
    sites: int = 5
    blocks: int = 24
    block_samples: int = 16
    epochs: int = 2
    rounds: r.RoundsConfig = field(default_factory=lambda: r.RoundsConfig(
        inner_steps=2, samples_per_step=8, deadline_s=4.0, data_epochs=2, idle_wait_s=0.5, gather_s=0.5))
    lease: LeaseConfig = field(default_factory=LeaseConfig.local_test)
    faults: tuple[str, ...] = ("drop", "duplicate", "reorder", "skew", "crash", "pause", "partition", "one_way",
                               *EXTRA_KINDS)
    """Of `peer.sim.faults.KINDS` plus `EXTRA_KINDS`, these act here (bridges do not)."""
    budgets: tuple[float, ...] = (0.0, 0.3)
    """Each seed runs its rounds with one of these compute budgets (RoundOpen.budget_s), picked by
    the seed: 0 trains all H steps; 0.3 s is one step at the slowest site (20 samples/s) and both
    at the fastest (80/s), so unequal sites contribute unequal work."""
    speeds: tuple[float, ...] = ()
    """Each site's trainer pace (samples per second), s0 first; empty: drawn per seed from 20, 40
    and 80 (scripts/bench_tail fixes them to measure the data epoch's tail)."""
    overlaps: tuple[bool, ...] = (False, True)
    """Each seed runs serial or overlapped rounds (RoundsConfig.overlap), picked by the seed."""
    max_time: float = 600.0
    fetch_s: float = 0.3
    apply_s: float = 0.2

    def __post_init__(self) -> None:
        if self.sites < 3:
            raise ValueError(f"--members {self.sites}: the peer simulation needs at least 3 sites (a majority "
                             "must survive a killed leader)")
        if self.rounds.data_epochs != self.epochs:
            raise ValueError("rounds.data_epochs must equal epochs")
        if self.speeds and (len(self.speeds) != self.sites or min(self.speeds) <= 0):
            raise ValueError(f"speeds {self.speeds}: one positive pace per site ({self.sites})")
