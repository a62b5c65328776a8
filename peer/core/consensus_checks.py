"""What a consensus message's sender may say now: the checks the consensus core runs before a
message may change anything.

Mutual TLS proves who sent a message (the guard checks `header.from_site` against the certificate),
not that what it says is true. Raft is not Byzantine fault tolerant, but a site of the run with a
bug, a wrong config or a stolen key must not be able to stop the run with one message. Issue 38 did
it four ways: a snapshot from a site that never joined, an ack far beyond the leader's log, an epoch
at the wire's bound that nobody can increment, a repaired log the leader never re-read. The checks:

* **Bounds**: no epoch above `EPOCH_LIMIT` is believed, so every epoch this peer holds can still be
  incremented by the elections that follow it.
* **Jumps**: nobody is believed alone more than `MAX_EPOCH_JUMP` above this peer's epoch; a jump is
  believed once a majority of the voter set has been heard at it (`EpochClaims`): with PreVote an
  epoch grows only by elections a majority agreed to hold, so an honest run that moved far ahead
  while this peer was away is a majority that says so, and one faulty voter is not.
* **Standing**: every message comes from a voter of this peer's configurations or a member its
  membership knows (a peer with no voters yet trusts anyone); a leader takes replies only from
  sites it replicated to, and acks only within its own log; entries must be consecutive and no
  newer than their leader's epoch. Entries from a site this peer does not know yet, at an epoch
  whose leader it has not heard, wait (`leader_not_known_yet`): a leader that joined while this
  peer was away.

A refusal is a `Rejected` effect with a `RefusalKind`; it never changes state, durable or not.
docs/decisions/security-consensus-standing.md.

    .venv/bin/python -m pytest tests/unit/test_consensus_hostile.py tests/unit/test_consensus_epoch_jumps.py -q
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field

from peer.core.commitlog import AppendEntries, AppendReply, InstallSnapshot, Voters
from peer.core.election import Epoch, RequestVote, SiteId, TimeoutNow, VoteReply

MAX_EPOCH_JUMP = 1_000
"""How far above this peer's epoch one sender may take it alone. Elections happen seconds apart at
the least, so an honest peer is this far behind only after hours away; then a majority vouches."""

EPOCH_LIMIT = 2**61
"""The highest epoch believed: half the wire's counter bound (peer/transport/wire.py MAX_COUNTER),
so that 2^61 elections can still follow any epoch a peer accepted."""


class RefusalKind(enum.Enum):
    """Why a consensus message was refused, as a kind: logs, metrics and the simulator read this,
    never the human reason."""

    ROUTINE = "routine"
    """Log repair, a vote not granted: every healthy run has these."""
    STALE = "stale"
    """A message of an epoch that is over (fencing, I1): a paused or slow peer, a late delivery."""
    IMPLAUSIBLE = "implausible"
    """Something no honest peer says: a forged, corrupted or buggy message. An honest run (the
    simulator) never produces one."""


Message = RequestVote | VoteReply | AppendEntries | AppendReply | InstallSnapshot | TimeoutNow


def fencing_epoch(msg: Message) -> Epoch:
    """The epoch a message is judged by. A pre-vote reply answers a question asked at
    proposed_epoch - 1; every other message is as fresh as its header's epoch."""
    if isinstance(msg, VoteReply) and msg.pre_vote:
        return Epoch(msg.proposed_epoch - 1)
    return msg.header.epoch


def claimed_epoch(msg: Message) -> Epoch:
    return Epoch(max(msg.header.epoch, msg.proposed_epoch if isinstance(msg, RequestVote) else 0))


@dataclass
class EpochClaims:
    """The highest epoch each voter of this peer's configuration was heard at (soft state, lost at
    restart: a restarted peer hears its voters again within a heartbeat or a campaign)."""

    heard: dict[SiteId, Epoch] = field(default_factory=dict)

    def note(self, site: SiteId, epoch: Epoch, voters: Voters) -> None:
        names = dict(voters)
        if site in names and epoch <= EPOCH_LIMIT:
            self.heard[site] = max(self.heard.get(site, Epoch(0)), epoch)
        for gone in [s for s in self.heard if s not in names]:
            del self.heard[gone]

    def vouched(self, me: SiteId, epoch: Epoch, voters: Voters) -> Epoch:
        """The highest epoch a majority of `voters` has been heard at (this peer at its own)."""
        claims = sorted((epoch if v == me else self.heard.get(v, Epoch(0)) for v, _ in voters), reverse=True)
        return claims[len(claims) // 2] if claims else epoch


def implausible_epoch(msg: Message, me: SiteId, epoch: Epoch, voters: Voters, claims: EpochClaims) -> str | None:
    """Why `msg` must be ignored for the epoch it claims, or None. Notes the claim of a voter first,
    so that the message that completes a majority is believed. A peer with no voters yet (a joiner
    before its first entries) has no majority to ask: `unknown_to_a_joiner` judges its messages."""
    claimed, sender = claimed_epoch(msg), msg.header.from_site
    if claimed > EPOCH_LIMIT:
        return f"implausible epoch {claimed}: above the limit {EPOCH_LIMIT} no honest run reaches"
    claims.note(sender, msg.header.epoch, voters)
    if not voters:
        return None
    ceiling = max(epoch, claims.vouched(me, epoch, voters)) + MAX_EPOCH_JUMP
    if claimed <= ceiling:
        return None
    return (f"implausible epoch {claimed}: more than {MAX_EPOCH_JUMP} above ours ({epoch}) from {sender}, "
            f"and no majority of the voters is there")


def unknown_to_a_joiner(msg: Message, epoch: Epoch, voters: Voters, known: Collection[SiteId]) -> str | None:
    """Why a message to a peer with no voters yet (a joiner before its first entries) waits, or None.
    A joiner believes any epoch below the limit from a member its membership reports (`known`), or
    from anyone while membership reported nobody. A higher epoch than its own from a site its
    membership does not report waits until it does: one such message from a site that never joined
    would leave the joiner at an epoch the run's leader is stale for (its answers implausible to that
    leader, for good), and an honest member may be unreported for a detection time (restarted after
    the joiner's join and elected at once: the whole-peer simulator's seed 70042). Waiting changes
    nothing; a leader retries at its next heartbeat, a candidate at its next election."""
    if voters or not known:
        return None
    claimed, sender = claimed_epoch(msg), msg.header.from_site
    if sender in known or claimed <= epoch:
        return None
    return (f"epoch {claimed} from {sender or '(no name)'}, which this peer's membership does not report (yet), "
            "before this peer has any voters")


def leader_not_known_yet(msg: Message, seated: bool, epoch: Epoch, leader: SiteId | None) -> str | None:
    """Why entries or a snapshot from a site this peer does not know (`seated` False) wait, or None
    (then `without_standing` judges them). A leader elected while this peer was away (paused, cut
    off) may have joined meanwhile: neither this peer's log nor its membership knows it yet, and
    both will (membership's gossip reports it within a detection time; the entry that seated it is
    among those the leader sends once it is believed). That leader's epoch is above this peer's, or
    is this peer's own while it has heard no leader of it: a voter's refusal of its pre-vote, or a
    candidate's request, moves a peer to an epoch without naming the epoch's leader. `leader`: the
    leader this peer heard at `epoch` (itself when it leads), None if none; an unknown site that
    claims an epoch whose leader this peer heard is a second leader (I1): implausible. A joiner
    (no voters yet) waits the same way: a member restarted after its join may be unknown to it
    (`unknown_to_a_joiner` holds its newer epochs). Waiting changes nothing, and the leader retries
    at its next heartbeat."""
    if seated or not isinstance(msg, (AppendEntries, InstallSnapshot)):
        return None
    sender, claimed = msg.header.from_site or "(no name)", msg.header.epoch
    unknown = "and is no voter or member this peer knows yet"
    if claimed > epoch:
        return f"{sender} leads epoch {claimed}, newer than ours ({epoch}), {unknown}"
    if claimed == epoch and leader is None:
        return f"{sender} leads epoch {claimed}, ours, whose leader this peer has not heard yet, {unknown}"
    return None


def not_its_leader(msg: TimeoutNow, leader: SiteId | None, leader_epoch: Epoch,
                   epoch_now: Epoch) -> tuple[str, RefusalKind] | None:
    """Why a hand-over must change nothing here, or None: only the leader this peer follows at its
    epoch (`epoch_now`) may void the lease this peer keeps for it, and a hand-over moves no epoch.
    Another leader of the same epoch is a lie (I1); a leader this peer has not heard yet (it
    rejoined, missed an election, the leader's entries are still on their way) is not."""
    sender, epoch = msg.header.from_site, msg.header.epoch
    if (leader, leader_epoch) == (sender, epoch) and epoch == epoch_now:
        return None
    other = leader if leader_epoch == epoch else None
    if other is not None:
        return f"{sender or '(no name)'} does not lead epoch {epoch} here: {other} does", RefusalKind.IMPLAUSIBLE
    return f"{sender or '(no name)'} does not lead epoch {epoch} here", RefusalKind.ROUTINE


def without_standing(msg: Message, seated: bool, replicated: Collection[SiteId], leading: Epoch | None,
                     last_index: int) -> str | None:
    """Why `msg`'s sender may not say this now, or None. `seated`: the sender holds or held a seat in
    this peer's log, or its membership knows the sender, or this peer has no voters and its
    membership reported nobody yet (then it trusts anyone); `replicated`: the sites this peer sent entries to as leader of `leading` (None
    when it does not lead); `last_index`: this peer's last log index."""
    sender = msg.header.from_site
    if isinstance(msg, (AppendEntries, InstallSnapshot)):
        if not seated:
            return f"{sender or '(no name)'} cannot lead: neither a voter nor a member of the run"
        return _malformed(msg)
    # Only this leader's messages of its epoch are answered at that epoch, and its log only grows
    # while it leads: a reply from elsewhere, or an ack beyond the log, is false. (A late reply to an
    # earlier leader, or to this peer before it restarted, is of another epoch: fenced, not false.)
    if isinstance(msg, AppendReply) and msg.header.epoch == leading:
        if sender not in replicated:
            return f"{sender or '(no name)'} answers entries this leader never sent it"
        if msg.success and msg.match_index > last_index:
            return f"acknowledges index {msg.match_index} beyond this log's last {last_index}"
    # This peer asks votes of voters and sends entries to voters and members only: a reply from
    # anyone else is false, and its epoch must not depose anyone (one reply of epoch e + 1000,
    # then another, and this peer's epoch would pass every honest voter's plausibility bound).
    if isinstance(msg, (VoteReply, AppendReply)) and not seated:
        return f"{sender or '(no name)'} answers what it was never asked: neither a voter nor a member of the run"
    return None


def _malformed(msg: AppendEntries | InstallSnapshot) -> str | None:
    epoch = msg.header.epoch
    if isinstance(msg, InstallSnapshot):
        snap = msg.snapshot
        if snap.last_epoch > epoch:
            return f"snapshot of epoch {snap.last_epoch} sent at epoch {epoch}"
        if not snap.voters:
            return "snapshot with no voters"
        return None
    if msg.prev_epoch > epoch:
        return f"previous entry of epoch {msg.prev_epoch} sent at epoch {epoch}"
    expected, last_epoch = msg.prev_index + 1, msg.prev_epoch
    for e in msg.entries:
        if e.index != expected:
            return f"entries not consecutive: index {e.index} where {expected} was due"
        if not last_epoch <= e.epoch <= epoch:
            return f"entry {e.index} of epoch {e.epoch} out of order (after {last_epoch}, sent at {epoch})"
        expected, last_epoch = expected + 1, e.epoch
    return None
