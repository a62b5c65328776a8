"""Leader election by lease epoch: the rules, with no state machine around them.

Raft's election (Ongaro & Ousterhout 2014, section 5.2, 5.4.1) with the refinements of Ongaro's
thesis: PreVote (section 9.6), CheckQuorum and leader stickiness (section 6.2 / 4.2.3), and a leader
lease for decisions (section 6.4.1). `peer/core/consensus.py` composes these rules with the commit log;
this module holds what one can state and test on its own:

* value types `Epoch` and `SiteId`, the persisted `HardState` (epoch, vote) and the messages;
* `vote_decision`: whether to grant a (pre-)vote, with the reason;
* `majority` over the *configured voter set* (never the gossip view);
* `ElectionConfig`: timeouts and the clock-drift margin of the lease
  (docs/decisions/consensus-lease-drift.md).

    .venv/bin/python -m pytest tests/unit/test_election.py -q
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable
from dataclasses import dataclass

from peer.core.ids import Epoch, SiteId  # noqa: F401 - re-exported: the id types live in peer/core/ids.py


class Role(enum.Enum):
    FOLLOWER = "follower"
    # Asking for pre-votes at epoch + 1 without having moved to it (thesis 9.6).
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True)
class ElectionConfig:
    """Timing of elections and leases. All durations are in seconds of the peer's monotonic clock."""

    election_timeout_min_s: float
    """A follower that heard nothing from a leader for a random time in [min, max) campaigns. `min`
    is also the stickiness window: a voter that heard from a live leader less than `min` ago refuses
    votes, which is what makes the leader's lease safe."""
    election_timeout_max_s: float
    """Upper end of the randomized election timeout; the spread keeps candidates from splitting votes."""
    heartbeat_interval_s: float
    """Leader sends AppendEntries (heartbeat) to every peer this often; well below `min` so that a
    lease is renewed several times before it runs out."""
    max_clock_drift: float
    """Bound on the relative rate error between any two peers' monotonic clocks (0.01 = 1 %). The
    lease is shortened by it (see `lease_s`). Clock *jumps* are outside this bound: the cores use
    monotonic clocks and ignore time going backwards."""
    max_batch: int = 64
    """Most log entries one AppendEntries carries; a follower far behind catches up in batches."""

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval_s < self.election_timeout_min_s < self.election_timeout_max_s:
            raise ValueError("need 0 < heartbeat_interval_s < election_timeout_min_s < election_timeout_max_s")
        if not 0 <= self.max_clock_drift < 0.5:
            raise ValueError("max_clock_drift must be in [0, 0.5)")
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")

    @property
    def lease_s(self) -> float:
        """How long after *sending* a heartbeat that a majority acknowledged the leader may decide.

        A voter refuses votes for `election_timeout_min_s` of its clock after receiving that heartbeat,
        i.e. for at least min/(1+drift) real seconds after the send. The leader's lease of L of its own
        clock lasts at most L/(1-drift) real seconds. L = min*(1-drift)/(1+drift) keeps the lease inside
        every acknowledging voter's refusal window, so no other leader can be elected while it holds.
        """
        d = self.max_clock_drift
        return self.election_timeout_min_s * (1 - d) / (1 + d)

    @property
    def quorum_window_s(self) -> float:
        """How long after *sending* the newest message a majority acknowledged the leader keeps the
        lead (check-quorum), past its lease: in between it decides nothing but holds its epoch, so
        voters whose acks lag behind a loaded machine come back to it without an election
        (docs/decisions/consensus-check-quorum-window.md). The maximum election timeout, as etcd's
        check of its recently active followers every election timeout gives at worst."""
        return self.election_timeout_max_s

    def random_timeout(self, rng: random.Random) -> float:
        return rng.uniform(self.election_timeout_min_s, self.election_timeout_max_s)

    @classmethod
    def wan(cls) -> ElectionConfig:
        return cls(
            # Intercontinental RTT is 100-300 ms and a busy login node adds GC pauses: several RTTs.
            election_timeout_min_s=3.0,
            # A spread of 3 s makes split votes rare even with 50+ voters.
            election_timeout_max_s=6.0,
            # Six heartbeats per minimum timeout: a lease survives a few lost heartbeats.
            heartbeat_interval_s=0.5,
            # NTP-free monotonic clocks drift < 100 ppm; 1 % leaves room for VM steal and slewing.
            max_clock_drift=0.01,
        )

    @classmethod
    def lan(cls) -> ElectionConfig:
        return cls(
            # Sub-millisecond RTT; the bound is dominated by process pauses, not the network.
            election_timeout_min_s=1.0,
            election_timeout_max_s=2.0,
            # Like wan(): at least five renewals per lease, so a few lost heartbeats cost nothing.
            heartbeat_interval_s=0.15,
            max_clock_drift=0.01,
        )

    @classmethod
    def local_test(cls) -> ElectionConfig:
        return cls(
            # Loopback tests want elections well under a second, yet above CI scheduling hiccups.
            election_timeout_min_s=0.3,
            election_timeout_max_s=0.6,
            heartbeat_interval_s=0.05,  # six renewals per lease, like wan()
            max_clock_drift=0.01,
        )


@dataclass(frozen=True)
class HardState:
    """What must be on disk before a vote or any message at `epoch` leaves the peer (Raft figure 2)."""

    epoch: Epoch
    voted_for: SiteId | None
    """Candidate this peer voted for in `epoch`; guards one vote per epoch across restarts."""


@dataclass(frozen=True)
class Header:
    """Sender and fencing token of every consensus message (proto ConsensusHeader)."""

    from_site: SiteId
    from_address: str
    epoch: Epoch
    round: int
    """Sender's last committed round; informational (ordering is by epoch and log index)."""


@dataclass(frozen=True)
class RequestVote:
    header: Header
    proposed_epoch: Epoch
    last_index: int
    last_epoch: Epoch
    pre_vote: bool


@dataclass(frozen=True)
class TimeoutNow:
    """A leader that stepped down to leave hands its epoch over (Raft thesis 3.10): every receiver
    that follows it drops the lease it kept for it, and `successor` campaigns at once."""

    header: Header
    successor: SiteId


@dataclass(frozen=True)
class VoteReply:
    header: Header
    proposed_epoch: Epoch
    granted: bool
    pre_vote: bool
    reason: str


def majority(voters: Iterable[SiteId]) -> int:
    """Votes or acks needed among `voters`: a strict majority of the configured voter set."""
    return len(set(voters)) // 2 + 1


def has_majority(supporters: Iterable[SiteId], voters: Iterable[SiteId]) -> bool:
    """True when the supporters that are voters form a majority of the voters; others do not count."""
    voter_set = set(voters)
    return bool(voter_set) and len(voter_set & set(supporters)) >= majority(voter_set)


def log_up_to_date(cand_last: tuple[int, int], own_last: tuple[int, int]) -> bool:
    """Raft 5.4.1: compare (last epoch, last index) lexicographically."""
    return (cand_last[1], cand_last[0]) >= (own_last[1], own_last[0])


def vote_decision(
    hard: HardState,
    req: RequestVote,
    own_last: tuple[int, int],
    sticky: str | None,
) -> tuple[bool, str]:
    """Whether to grant `req`, and why. Pure: the caller persists a granted real vote first.

    own_last is (last index, last epoch) of this peer's log. sticky says why this peer must not vote
    now (it heard from a live leader, or restarted, less than election_timeout_min ago; or it is the
    leader); while it is set no vote is granted, which protects the leader's lease (thesis 4.2.3).
    """
    if sticky is not None:
        return False, sticky
    cand = req.header.from_site
    if req.pre_vote:
        if req.proposed_epoch <= hard.epoch:
            return False, f"pre-vote for epoch {req.proposed_epoch} <= current epoch {hard.epoch}"
    else:
        if req.proposed_epoch < hard.epoch:
            return False, f"stale epoch {req.proposed_epoch} < {hard.epoch}"
        if req.proposed_epoch == hard.epoch and hard.voted_for not in (None, cand):
            return False, f"already voted for {hard.voted_for} in epoch {hard.epoch}"
    if not log_up_to_date((req.last_index, req.last_epoch), own_last):
        return False, (
            f"candidate log is behind: (epoch {req.last_epoch}, index {req.last_index}) < "
            f"(epoch {own_last[1]}, index {own_last[0]})"
        )
    return True, "granted"
