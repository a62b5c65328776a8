"""Which voter a leaving leader hands its epoch to (Raft thesis 3.10, leadership transfer).

A leader that leaves (Slurm's end of job, `ops leave`) removes itself from the voter set and steps
down once that commits. Without a hand-over the run then waits for a staying voter's election
timeout, which starts only after the last heartbeat, plus a pre-vote: with 2-minute jobs the
leader changes every few minutes and each change cost rounds. `ConsensusCore` sends a `TimeoutNow`
to every voter; this module picks the successor that campaigns at once.
docs/decisions/consensus-leadership-transfer.md.

    .venv/bin/python -m pytest tests/unit/test_consensus_handover.py -q
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from peer.core.election import SiteId
from peer.core.membership_types import MemberState
from peer.core.site_names import job_number, site_of
from peer.core.voter_set import MemberVerdict


def successor(voters: Collection[SiteId], match_index: Mapping[SiteId, int], last_index: int,
              members: Mapping[SiteId, MemberVerdict], leaving: Collection[SiteId],
              ack_time: Mapping[SiteId, float], heard_after: float,
              trainerless: Collection[SiteId] = ()) -> SiteId | None:
    """The voter to campaign at once, or None (then the voters' timers elect one, as without a
    hand-over). Only a voter whose log holds the leader's last entry can win without a later log
    refusing it; one that has not acked since `heard_after` (an election timeout ago) or that
    membership calls dead or gone would not campaign; one that is leaving itself would open no
    round and start another hand-over. Among the rest: a voter with a trainer before one without
    (which opens no round either and, where a voter trains, stands back: PeerCore), then the one
    likely to lead longest (`_staying`), then the most recently heard, then the name, so that the
    same inputs always pick the same one."""
    def fit(v: SiteId) -> bool:
        gone = v in members and members[v].state in (MemberState.DEAD, MemberState.LEFT)
        heard = ack_time.get(v, float("-inf")) >= heard_after
        return match_index.get(v, 0) >= last_index and heard and not gone and v not in leaving

    ready = [v for v in voters if fit(v)]
    return max(ready, key=lambda v: (v not in trainerless, _staying(v, ready), ack_time[v], v)) if ready else None


def _staying(member: SiteId, voters: Collection[SiteId]) -> int:
    """How long `member` is likely to stay, as a rank among the voters fit to lead: a site's own
    peer has no wall time (2); a job's peer whose site has no newer job among them ends last of its
    site's (1); an older job of a site is the next to leave (0). With 2-minute jobs handing each leadership to the next
    job of any site moved it every 40 s in the soak, each move a reopened round."""
    number = job_number(member)
    if number is None:
        return 2
    site = site_of(member)
    return 0 if any(site_of(v) == site and (job_number(v) or 0) > number for v in voters) else 1
