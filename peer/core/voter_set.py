"""Which voter change the leader proposes next: membership's verdicts turned into single-server
changes of the voter set (Raft thesis 4.1), one at a time, never one that strands a majority.

The consensus core (peer/core/consensus.py) keeps membership's verdict on every site it heard of
(`MemberVerdict`) and, as leader, asks `next_voter_change` what to propose once the previous change
committed. Priority: confirmed-dead voters first (each removal makes a majority easier to reach),
then graceful leaves (this leader's own, then others'), then joins of members that caught up with the
committed log. docs/decisions/consensus-last-voter.md has why the last voter stays.

    .venv/bin/python -m pytest tests/unit/test_consensus_membership.py -q
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from peer.core.commitlog import Log, LogIndex, VoterChange, Voters, apply_voter_change
from peer.core.election import ElectionConfig, SiteId, has_majority
from peer.core.membership_types import MemberState


@dataclass
class MemberVerdict:
    address: str
    state: MemberState  # ALIVE, DEAD or LEFT, as membership reports it (SUSPECT is never stored)
    since: float = 0.0  # core time of the last state change
    trains: bool = True  # it publishes a training identity (a join's VoterChange says if not)


class LeaderState(Protocol):
    """What the voter-change rule reads of the leader's core."""

    site: SiteId
    address: str
    config: ElectionConfig
    log: Log
    now: float
    leaving: bool
    members: dict[SiteId, MemberVerdict]
    ack_time: dict[SiteId, float]
    match_index: dict[SiteId, int]
    commit_index: LogIndex
    became_leader_at: float


def majority_acked(core: LeaderState) -> float:
    """Send time of the newest message a majority of the voters acked (the leader counts as acking
    at once); -inf where nobody has. The leader's lease and check-quorum run from it."""
    voters = [s for s, _ in core.log.voters()]
    times = sorted((core.now if v == core.site else core.ack_time.get(v, -math.inf) for v in voters), reverse=True)
    return times[len(voters) // 2] if voters else -math.inf


def next_voter_change(core: LeaderState) -> tuple[VoterChange | None, str | None]:
    """The first candidate change that keeps the responsive voters a majority of the new set, and
    why a change waits (None: nothing to say).

    A change that would leave the voters that answered within election_timeout_min short of a
    majority waits: removing a live leaver before a dead voter would otherwise strand the rest (e.g.
    {A, B leaving, C dead})."""
    voters = dict(core.log.voters())
    if core.leaving and list(voters) == [core.site]:
        return None, "last voter stays in the voter set: the run resumes from its disk"

    def answers(site: SiteId) -> bool:
        fresh = core.now - core.ack_time.get(site, -math.inf) < core.config.election_timeout_min_s
        dead = site in core.members and core.members[site].state is MemberState.DEAD
        return site == core.site or (fresh and not dead)

    note = None
    for change in voter_change_candidates(core, voters):
        new = [s for s, _ in apply_voter_change(tuple(sorted(voters.items())), change)]
        if has_majority(filter(answers, new), new):
            return change, note
        note = (f"waiting to {'add' if change.add else 'remove'} {change.site}: the voters that "
                f"answer ({', '.join(filter(answers, new))}) would not be a majority")
    return None, note


def voter_change_candidates(core: LeaderState, voters: dict[SiteId, str]) -> Iterator[VoterChange]:
    """Every change membership's verdicts call for, in priority order."""
    for site in sorted(voters):
        m = core.members.get(site)
        silent = core.now - core.ack_time.get(site, core.became_leader_at)
        if site != core.site and m is not None and m.state is MemberState.DEAD and silent >= core.config.election_timeout_max_s:
            yield VoterChange(site, voters[site], False, f"dead: membership and no ack for {silent:.1f}s")
    if core.leaving and core.site in voters:
        yield VoterChange(core.site, core.address, False, "graceful leave")
    for site in sorted(voters):
        m = core.members.get(site)
        if site != core.site and m is not None and m.state is MemberState.LEFT:
            yield VoterChange(site, voters[site], False, "graceful leave")
    if not core.leaving:
        for site, m in sorted(core.members.items()):
            if m.state is MemberState.ALIVE and site not in voters and core.match_index.get(site, 0) >= core.commit_index:
                yield VoterChange(site, m.address, True, "join", trainerless=not m.trains)


def live_addresses(members: dict[SiteId, MemberVerdict], voters: Voters) -> dict[SiteId, str]:
    """Voter -> address to dial: where membership last saw it alive, else where the log says.
    A site restarted by Slurm on another node keeps its seat but not its address."""
    return {s: (members[s].address if s in members and members[s].state is MemberState.ALIVE else a)
            for s, a in voters}


def replication_targets(core: LeaderState) -> dict[SiteId, str]:
    """Everyone who needs the leader's log: voters and live members (observers, voters-to-be), and
    members that left, while they answer or for 10 election timeouts, so that a leaver learns that
    its removal committed (what `ops leave` waits for, I8) even after a partition."""
    def leaving(m: MemberVerdict, site: SiteId) -> bool:
        silent = core.now - core.ack_time.get(site, core.became_leader_at)
        recent = core.now - m.since < 10 * core.config.election_timeout_max_s
        return m.state is MemberState.LEFT and (silent < core.config.election_timeout_max_s or recent)

    # A site only heard of as LEFT (never seen alive here, not in the log) has no address to dial.
    out = {s: m.address for s, m in core.members.items()
           if m.address and (m.state is MemberState.ALIVE or leaving(m, s))}
    out.update(live_addresses(core.members, core.log.voters()))
    out.pop(core.site, None)
    return out
