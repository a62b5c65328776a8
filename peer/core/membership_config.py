"""Timing and fan-out of the membership protocol, with LAN, WAN and local-test presets.

Follows the knobs of HashiCorp memberlist (`DefaultLANConfig`/`DefaultWANConfig`) and the Lifeguard
paper (Dadgar et al., 2018) for the suspicion and awareness multipliers. `detection_bound_s` is the
bound the simulator and the real-process tests assert; its derivation is in docs/membership.md.

    python -c "from peer.core.membership import MembershipConfig as C; print(C.wan().detection_bound_s(5))"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class MembershipConfig:
    """Membership timings. Every `*_s` field is seconds of the core's (injected, monotonic) clock."""

    probe_interval_s: float = 1.0
    """Length of one protocol period: one member is probed per period (scaled by local health)."""
    probe_timeout_s: float = 0.5
    """Wait for a direct Ack before asking `indirect_checks` members to probe; must exceed the RTT."""
    indirect_checks: int = 3
    """k: members asked to ping a silent target for us (SWIM ping-req); also the number of
    independent suspicions that shrink a suspicion timeout to its minimum (Lifeguard)."""
    suspicion_mult: float = 4.0
    """Minimum suspicion timeout = suspicion_mult * max(1, log10(n)) * probe_interval_s."""
    suspicion_max_timeout_mult: float = 6.0
    """Maximum suspicion timeout = this * the minimum; a lone suspicion waits this long (Lifeguard)."""
    retransmit_mult: int = 4
    """Each rumour is piggybacked retransmit_mult * ceil(log10(n + 1)) times by every member."""
    gossip_interval_s: float = 0.2
    """Period of the extra gossip round (only when rumours are queued) that speeds dissemination."""
    gossip_nodes: int = 3
    """Members a gossip round sends its rumours to."""
    max_piggyback: int = 8
    """Most rumours piggybacked on one Ping/Ack/PingReq (keeps each message small)."""
    push_pull_interval_s: float = 30.0
    """Full-state exchange with one random live member (anti-entropy repairs lost rumours)."""
    reconnect_interval_s: float = 10.0
    """Push-pull with one DEAD member or unreached seed (round robin): heals views after a
    partition, as Serf's reconnect does (nobody probes the dead), and merges groups that formed
    apart at start-up."""
    gossip_to_dead_s: float = 30.0
    """Keep gossiping to a member this long after declaring it dead, so a paused one learns it."""
    awareness_max_multiplier: int = 8
    """Lifeguard local health: probe interval, probe timeout and suspicion timeouts are scaled by
    (score + 1), score in [0, awareness_max_multiplier - 1]."""
    join_retry_interval_s: float = 1.0
    """Resend the join PushPull to the seeds this often until one answers."""
    forget_after_s: float = 86_400.0
    """A DEAD or LEFT member is dropped from the table this long after it entered that state (Serf's
    reconnect and tombstone timeouts); a tombstone of its incarnation is kept as long again, so a
    late rumour does not bring it back while the member itself still can. Bounds the table under
    churn of site names; longer than gossip_to_dead_s, and much longer than a partition that
    reconnects should still heal (a forgotten member is reached again only as a seed)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{f.name} must be a positive finite number, got {value!r}")
        if self.probe_timeout_s >= self.probe_interval_s:
            raise ValueError("probe_timeout_s must be shorter than probe_interval_s "
                             "(the indirect probes need the rest of the period)")
        if self.forget_after_s <= self.gossip_to_dead_s:
            raise ValueError("forget_after_s must be longer than gossip_to_dead_s "
                             "(a dead member is told it was declared dead before it is forgotten)")
        if self.suspicion_max_timeout_mult < 1:
            raise ValueError("suspicion_max_timeout_mult must be >= 1")
        for name in ("indirect_checks", "retransmit_mult", "gossip_nodes", "max_piggyback",
                     "awareness_max_multiplier"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an int")

    # -- derived quantities ------------------------------------------------------------------------

    def suspicion_min_s(self, n: int) -> float:
        """Shortest suspicion timeout in a cluster of n live members (all confirmations in)."""
        return self.suspicion_mult * max(1.0, math.log10(max(1, n))) * self.probe_interval_s

    def suspicion_max_s(self, n: int) -> float:
        """Suspicion timeout with no independent confirmation."""
        return self.suspicion_max_timeout_mult * self.suspicion_min_s(n)

    def retransmit_limit(self, n: int) -> int:
        """How many times one member piggybacks one rumour (~ log N, SWIM section 4.1)."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))

    def detection_bound_s(self, n: int, health_multiplier: float = 1.0) -> float:
        """Time within which every live member declares a crashed member DEAD, n members in all.

        Does not depend on any message being delivered: every member probes every other at least
        once in 2(n-1) periods (round robin over a list reshuffled each cycle, SWIM section 4.3), a
        probe of a crashed member fails by the end of its period, and that member's own suspicion
        then expires within suspicion_max_s. A member whose local health multiplier reached h
        stretches periods and suspicion timeouts by h. One probe timeout of slack covers timer
        granularity. Derivation: docs/membership.md.
        """
        if n < 2:
            return 0.0
        periods = 2 * n - 1
        return (periods * self.probe_interval_s + self.suspicion_max_s(n)) * health_multiplier \
            + self.probe_timeout_s

    def convergence_bound_s(self, n: int, health_multiplier: float = 1.0) -> float:
        """After all faults end: time within which views agree again (live members ALIVE, crashed
        ones DEAD, departed ones LEFT). A stale suspicion is refuted by the next probe or expires
        (detection_bound_s); a stale DEAD is repaired by the round-robin reconnect push-pull within
        (n - 1) reconnect intervals; a missed LEFT arrives with the next anti-entropy exchanges
        (two push-pull intervals). Derivation: docs/membership.md.
        """
        return (self.detection_bound_s(n, health_multiplier)
                + (n - 1) * self.reconnect_interval_s + 2 * self.push_pull_interval_s)

    # -- presets -----------------------------------------------------------------------------------

    @classmethod
    def lan(cls) -> MembershipConfig:
        """memberlist's DefaultLANConfig: sub-millisecond RTT, detection within seconds."""
        return cls()  # the field defaults are the LAN values (memberlist's, which are well tested)

    @classmethod
    def wan(cls) -> MembershipConfig:
        """Sites on different continents: RTT 100-150 ms, Python GC pauses of a second or two."""
        return cls(
            probe_interval_s=2.5,  # a handful of sites: probing each every few periods is plenty
            probe_timeout_s=1.5,  # 10x the worst RTT: a 1 s GC pause on either side still acks
            indirect_checks=3,  # three independent paths rule out one bad route
            suspicion_mult=6.0,  # min suspicion 15 s: outlives any GC pause or brief route flap
            suspicion_max_timeout_mult=4.0,  # lone suspicion 60 s: one flaky link cannot kill
            retransmit_mult=4,  # memberlist's value; n is small so this is ~4-8 sends
            gossip_interval_s=0.5,  # several RTTs, so rumours are not sent faster than they travel
            gossip_nodes=3,  # fan-out as on LAN
            max_piggyback=8,  # messages stay well under a kilobyte
            push_pull_interval_s=60.0,  # WAN bandwidth is precious; rumours do the fast path
            reconnect_interval_s=20.0,  # a healed transatlantic link is noticed within a minute
            gossip_to_dead_s=60.0,  # covers a long pause of the accused
            awareness_max_multiplier=8,  # Lifeguard's recommended cap
            join_retry_interval_s=2.0,  # a seed across the ocean needs a few RTTs to answer
            forget_after_s=86_400.0,  # Serf's 24 h: a site down for a day returns as a newcomer
        )

    @classmethod
    def local_test(cls) -> MembershipConfig:
        """Real processes on one loaded 2-core machine over loopback: fast, but tolerant of
        scheduling stalls of several hundred milliseconds."""
        return cls(
            probe_interval_s=0.2,  # tests observe several periods per second
            probe_timeout_s=0.1,  # loopback RTT is microseconds; 100 ms absorbs scheduler stalls
            indirect_checks=2,  # test meshes have 3-5 members
            suspicion_mult=6.0,  # min suspicion 1.2 s: a stalled test process refutes in time
            suspicion_max_timeout_mult=3.0,  # lone suspicion 3.6 s keeps crash tests short
            retransmit_mult=4,  # as memberlist
            gossip_interval_s=0.1,  # fast dissemination for assertions
            gossip_nodes=3,  # reaches every member of a small test mesh in one round
            max_piggyback=8,  # as LAN
            push_pull_interval_s=2.0,  # anti-entropy within a test's patience
            reconnect_interval_s=1.0,  # partition-heal tests converge in seconds
            gossip_to_dead_s=5.0,  # longer than any pause a test injects
            awareness_max_multiplier=4,  # caps how slow a starved test process may become
            join_retry_interval_s=0.3,  # seeds start concurrently with joiners
            forget_after_s=600.0,  # longer than any test run, short enough to bound a long soak
        )
