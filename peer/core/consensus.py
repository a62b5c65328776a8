"""The consensus core: election by lease epoch plus the replicated round-commit log, sans I/O.

Raft (Ongaro & Ousterhout 2014) with PreVote, CheckQuorum and leader stickiness (Ongaro's thesis
9.6, 6.2), a leader lease for decisions (thesis 6.4.1; margin in docs/decisions/consensus-lease-drift.md)
and single-server voter changes (thesis 4.1). The rules live in `peer/core/election.py` and
`peer/core/commitlog.py`; this class owns the state and turns inputs into ordered effects:

    core = ConsensusCore.start(site, address, ElectionConfig.wan(), store.load_or_init(fresh), now, rng)
    effects = core.tick(now) / core.receive(msg, now) / core.propose_round(commit, now).effects

The node executes the effects **in list order**: a `PersistHardState`, `PersistLog` or
`PersistSnapshot` must be durable (fsynced) before any later effect of the same list runs, because a
`Send` after it may promise what it persisted (a vote, an ack). `Committed` entries are applied in
order, each exactly once. Contract and bounds: docs/consensus.md.

    .venv/bin/python -m pytest tests/unit/test_election_core.py tests/unit/test_commitlog_replication.py -q
    .venv/bin/python -m peer.sim.consensus_sim --seeds 0:100 --voters 3 5
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from peer.core.commitlog import (
    AppendEntries,
    AppendReply,
    DurableState,
    EpochStart,
    InstallSnapshot,
    Log,
    LogIndex,
    PersistHardState,
    PersistLog,
    PersistSnapshot,
    RoundCommit,
    VoterChange,
    quorum_index,
)
from peer.core.consensus_checks import (  # noqa: F401 - MAX_EPOCH_JUMP, fencing_epoch re-exported
    MAX_EPOCH_JUMP,
    EpochClaims,
    fencing_epoch,
    Message,
    RefusalKind,
    implausible_epoch,
    unknown_to_a_joiner,
    leader_not_known_yet,
    not_its_leader,
    without_standing,
)
from peer.core.consensus_effects import (
    Committed,
    Answer,
    Effect,
    LeaderChanged,
    Rejected,
    Send,
    SnapshotInstalled,
    Status,
    TWO_LEADERS,
)
from peer.core.handover import successor
from peer.core.membership_types import MemberState
from peer.core.voter_set import MemberVerdict, live_addresses, majority_acked, next_voter_change, replication_targets
from peer.core.election import (
    ElectionConfig,
    Epoch,
    HardState,
    Header,
    RequestVote,
    Role,
    SiteId,
    TimeoutNow,
    VoteReply,
    has_majority,
    vote_decision,
)


@dataclass
class ConsensusCore:
    """One peer's election and log state. Build it with `start`; feed it inputs; run its effects."""

    site: SiteId
    address: str
    config: ElectionConfig
    hard: HardState
    log: Log
    rng: random.Random
    now: float
    commit_index: LogIndex = LogIndex(0)
    applied_index: LogIndex = LogIndex(0)
    role: Role = Role.FOLLOWER
    leader: SiteId | None = None
    # The epoch `leader` was heard at: a candidate keeps the leader of the epoch before its own.
    leader_epoch: Epoch = Epoch(0)
    # Votes refused until this time: the last contact with a live leader (or this peer's start)
    # plus election_timeout_min. Guards other leaders' leases (election.vote_decision).
    sticky_until: float = 0.0
    sticky_why: str = ""
    election_deadline: float = math.inf
    votes: set[SiteId] = field(default_factory=set)
    leaving: bool = False  # `ops leave` ran: the leader removes this voter, and no join is proposed
    # The peer's leave began (its rounds' half first): it stands for election only after a staying
    # voter had its chance (`stand_back`).
    standing_back: bool = False
    voter_note: str = ""  # why the last voter change was (not) proposed, for status and logs
    members: dict[SiteId, MemberVerdict] = field(default_factory=dict)  # membership's verdicts (inputs only)
    # Live members whose graceful leave began (membership's LEAVING label; input only): never the
    # successor of a hand-over.
    leaving_members: frozenset[SiteId] = frozenset()
    released: tuple[SiteId, Epoch] | None = None  # the leader and epoch whose lease a hand-over voided
    # Leader-only state, reset at every election win.
    became_leader_at: float = 0.0
    next_heartbeat: float = math.inf
    next_index: dict[SiteId, int] = field(default_factory=dict)
    match_index: dict[SiteId, int] = field(default_factory=dict)
    ack_time: dict[SiteId, float] = field(default_factory=dict)  # send time of the newest acked message
    sent_at: dict[int, float] = field(default_factory=dict)
    # seq of the newest successful reply per site: a refusal sent after it speaks for the follower's
    # log as it is now (a repaired, emptied log), one sent before is a late delivery.
    acked_seq: dict[SiteId, int] = field(default_factory=dict)
    seq: int = 0
    claims: EpochClaims = field(default_factory=EpochClaims)  # what each voter was heard at (checks)

    @classmethod
    def start(cls, site: SiteId, address: str, config: ElectionConfig, durable: DurableState, now: float,
              rng: random.Random, applied_index: int = 0) -> ConsensusCore:
        """A core from what is on disk. applied_index: last entry whose effect the node's own durable
        state (checkpoint) already holds; entries after it are emitted again as Committed."""
        log = Log(durable.snapshot, list(durable.entries))
        applied = LogIndex(max(applied_index, durable.snapshot.last_index))
        core = cls(site, address, config, durable.hard, log, rng, now, applied, applied)
        # A restarted peer may have acked a leader's lease just before it crashed: refuse votes for
        # one minimum election timeout, as if it had just heard from that leader.
        core.sticky_until, core.sticky_why = now + config.election_timeout_min_s, "restarted within the election timeout"
        core._reset_election_timer()
        return core

    # ----- inputs -----

    def tick(self, now: float) -> list[Effect]:
        now = self._advance(now)
        effects: list[Effect] = []
        if self.role is Role.LEADER:
            if now >= self._quorum_lost_at():
                self._step_down(None, effects, "check-quorum: no majority acked within the election timeout")
                return effects
            if self.standing_back and self._hand_over(effects) is not None:
                return effects  # leaving: a staying voter leads from here (at LeaveRequested, or once one caught up)
            if now >= self.next_heartbeat:
                self._broadcast(effects)
            self._reconcile_voters(effects)
        elif now >= self.election_deadline:
            self._campaign(pre_vote=True, effects=effects)
        return effects

    def next_deadline(self) -> float:
        if self.role is Role.LEADER:
            return min(self.next_heartbeat, self._quorum_lost_at())
        return self.election_deadline

    def receive(self, msg: Message, now: float) -> list[Effect]:
        now = self._advance(now)
        effects: list[Effect] = []
        h = msg.header
        voters = self.log.voters()
        implausible = implausible_epoch(msg, self.site, self.hard.epoch, voters, self.claims)
        if implausible is not None:
            return [Rejected(h.from_site, type(msg).__name__, implausible, RefusalKind.IMPLAUSIBLE)]
        waits = unknown_to_a_joiner(msg, self.hard.epoch, voters, self.members)
        if waits is not None:
            return [Rejected(h.from_site, type(msg).__name__, waits, RefusalKind.ROUTINE)]
        if isinstance(msg, RequestVote):
            self._on_request_vote(msg, effects)
            return effects
        if fencing_epoch(msg) < self.hard.epoch:
            reason = f"stale epoch {fencing_epoch(msg)} < {self.hard.epoch}"
            effects.append(Rejected(h.from_site, type(msg).__name__, reason, RefusalKind.STALE))
            if isinstance(msg, (AppendEntries, InstallSnapshot)):
                # Tell the stale leader about the newer epoch so it steps down.
                effects.append(Send(h.from_site, h.from_address,
                                    AppendReply(self._header(), False, LogIndex(0), msg.seq, reason)))
            return effects
        # A leader that was removed (or removes itself, thesis 4.2.2) led its epoch: its late
        # messages are stale, not false. A site that never had a seat nor joined cannot lead, also
        # not a joiner: only a joiner whose membership reported nobody yet trusts anyone.
        seated = (h.from_site in dict(voters) or h.from_site in self.members or self.log.ever_voter(h.from_site)
                  or not (voters or self.members))
        # A leader that joined while this peer was away waits until membership or the log seats it.
        heard = self.leader if self.leader_epoch == self.hard.epoch else None
        waits = leader_not_known_yet(msg, seated, self.hard.epoch, heard)
        if waits is not None:
            return [Rejected(h.from_site, type(msg).__name__, waits, RefusalKind.ROUTINE)]
        leading = self.hard.epoch if self.role is Role.LEADER else None
        implausible = without_standing(msg, seated, self.next_index, leading, self.log.last_index)
        if implausible is not None:
            return [Rejected(h.from_site, type(msg).__name__, implausible, RefusalKind.IMPLAUSIBLE)]
        if isinstance(msg, TimeoutNow):  # it voids a lease held at this peer's epoch, nothing else
            self._on_timeout_now(msg, effects)
            return effects
        if h.epoch > self.hard.epoch:
            self._adopt_epoch(h.epoch, effects)
        if isinstance(msg, (AppendEntries, InstallSnapshot)) and self.role is Role.LEADER:
            # This peer leads this epoch, and an epoch has one leader (I1): no honest voter sends
            # this. A forged or misdirected message is refused; the simulator reports it as a
            # violation, since there every message is honest.
            effects.append(Rejected(h.from_site, type(msg).__name__,
                                    f"{TWO_LEADERS} {self.hard.epoch}: {h.from_site or '(no name)'} claims to lead "
                                    f"the epoch {self.site} leads", RefusalKind.IMPLAUSIBLE))
            return effects
        if isinstance(msg, VoteReply):
            self._on_vote_reply(msg, effects)
        elif isinstance(msg, AppendEntries):
            self._on_append(msg, effects)
        elif isinstance(msg, InstallSnapshot):
            self._on_snapshot(msg, effects)
        else:
            self._on_append_reply(msg, effects)
        return effects

    def propose_round(self, commit: RoundCommit, now: float) -> Answer:
        """Leader only: append the decision of round `commit.round` and replicate it."""
        refusal = self.not_ready(now)
        if refusal is not None:
            return Answer(False, refusal, [])
        next_round = self.log.last_round_entry()[0] + 1
        if commit.round != next_round:
            return Answer(False, f"round {commit.round} is not the next round {next_round}", [])
        return self._append_and_replicate(commit)

    def not_ready(self, now: float) -> str | None:
        """Why this peer cannot decide a round now, or None when it can (the rounds layer polls it)."""
        now = self._advance(now)
        if self.role is not Role.LEADER:
            return f"not leader (leader is {self.leader}, epoch {self.hard.epoch})"
        if now >= self._lease_expiry():
            return "no lease: a majority has not acked this leader recently"
        last_round, last_round_index, _ = self.log.last_round_entry()
        if last_round_index > self.commit_index:
            return f"round {last_round} is not committed yet"
        return None

    def member_changed(self, site: SiteId, state: MemberState, address: str, trains: bool = True) -> None:
        """Membership's verdict on `site`, whatever it is. SUSPECT changes nothing here: a suspect
        still gets appends, and only a DEAD verdict (confirmed by the missing acks) removes a voter.
        An ALIVE verdict without an address (membership forgot it meanwhile) is ignored. `trains`: its VoterChange says."""
        if state is MemberState.ALIVE:
            if address:
                self.member_alive(site, address, trains)
        elif state is MemberState.LEFT:
            self.member_left(site)
        elif state is MemberState.DEAD:
            self.member_dead(site)

    def member_alive(self, site: SiteId, address: str, trains: bool = True) -> None:
        """Membership sees `site` alive at `address`: replicate to it; the leader adds it as a voter
        once it has caught up with the committed log."""
        self.members[site] = MemberVerdict(address, MemberState.ALIVE, trains=trains)

    def member_left(self, site: SiteId) -> None:
        """Membership reports a graceful leave: the leader removes the voter."""
        self._mark(site, MemberState.LEFT)

    def member_dead(self, site: SiteId) -> None:
        """Membership declared `site` dead: the leader removes the voter once it has also had no ack
        from it for election_timeout_max (its own confirmation), by a majority-committed entry."""
        self._mark(site, MemberState.DEAD)

    def leave(self, now: float) -> Answer:
        """Graceful leave of this peer (`ops leave`, SIGTERM). See docs/decisions/consensus-last-voter.md."""
        self._advance(now)
        # A leaving voter keeps campaigning (standing back): until its removal commits it may be
        # needed for a majority, and as leader it removes itself first.
        self.stand_back(now)
        self.leaving = True
        voters = dict(self.log.voters())
        if self.site not in voters:
            return Answer(True, "not a voter", [])
        if len(voters) == 1:
            return Answer(False, "last voter stays in the voter set: the run resumes from its disk", [])
        if self.role is not Role.LEADER:
            return Answer(True, f"leader {self.leader} removes this voter when membership reports the leave", [])
        effects: list[Effect] = []
        self._reconcile_voters(effects)
        return Answer(True, self.voter_note, effects)

    def compact(self, upto: int, app_state: bytes) -> list[Effect]:
        """Fold the applied log up to `upto` into a snapshot (after the node checkpointed it)."""
        snap = self.log.compact(min(upto, self.applied_index), app_state)
        return [] if snap is None else [PersistSnapshot(snap)]

    def status(self) -> Status:
        return Status(
            self.site, self.role, self.hard.epoch, self.hard.voted_for, self.leader,
            self._lease_expiry() if self.role is Role.LEADER else None,
            self.log.last_round_entry(self.commit_index)[0], self.commit_index, self.applied_index,
            self.log.last_index, self.log.voters(),
        )

    def is_voter(self) -> bool:
        return self.site in dict(self.log.voters())

    def removed(self) -> bool:
        """A graceful leave's seat is handed back: this site is no longer a voter and everything in
        its log (its removal last) is committed."""
        return not self.is_voter() and self.commit_index >= self.log.last_index

    # ----- election -----

    def _advance(self, now: float) -> float:
        # Time never runs backwards inside the core: a clock jump back is treated as no time passing.
        self.now = max(self.now, now)
        return self.now

    def _reset_election_timer(self) -> None:
        if not self.is_voter():
            self.election_deadline = math.inf
            return
        # A voter on its way out waits one more full election timeout, so that a staying voter's
        # timer fires first: a leaving leader opens no round, so electing it stalls the run until
        # its leave is done (the 2-minute-job soak measured 19 s with no round).
        back = self.config.election_timeout_max_s if self.standing_back else 0.0
        self.election_deadline = self.now + self.config.random_timeout(self.rng) + back

    def stand_back(self, now: float) -> None:
        """This peer's leave began: from now on it campaigns only after a staying voter could have.
        It still votes, and still campaigns if nobody else does (every voter leaving at once)."""
        self._advance(now)
        if not self.standing_back:
            self.standing_back = True
            if self.role is not Role.LEADER and self.election_deadline != math.inf:
                self.election_deadline += self.config.election_timeout_max_s

    def _sticky(self) -> str | None:
        if self.role is Role.LEADER:
            return f"{self.site} is the leader of epoch {self.hard.epoch}"
        if self.now < self.sticky_until:
            return self.sticky_why
        return None

    def _campaign(self, pre_vote: bool, effects: list[Effect]) -> None:
        self.votes = {self.site}
        if pre_vote:
            self.role = Role.PRE_CANDIDATE
            proposed = Epoch(self.hard.epoch + 1)
        else:
            self.role = Role.CANDIDATE
            proposed = Epoch(self.hard.epoch + 1)
            self.hard = HardState(proposed, self.site)
            effects.append(PersistHardState(self.hard))
        self._reset_election_timer()
        req = RequestVote(self._header(), proposed, self.log.last_index, self.log.last_epoch, pre_vote)
        for site, address in live_addresses(self.members, self.log.voters()).items():
            if site != self.site:
                effects.append(Send(site, address, req))
        self._count_votes(effects)

    def _count_votes(self, effects: list[Effect]) -> None:
        if not has_majority(self.votes, (s for s, _ in self.log.voters())):
            return
        if self.role is Role.PRE_CANDIDATE:
            self._campaign(pre_vote=False, effects=effects)
        elif self.role is Role.CANDIDATE:
            self._become_leader(effects)

    def _on_request_vote(self, req: RequestVote, effects: list[Effect]) -> None:
        h = req.header
        sticky = self._sticky()
        if not req.pre_vote and req.proposed_epoch > self.hard.epoch and sticky is None:
            self._adopt_epoch(req.proposed_epoch, effects)
        granted, reason = vote_decision(self.hard, req, (self.log.last_index, self.log.last_epoch), sticky)
        if granted and not req.pre_vote:
            self.hard = HardState(self.hard.epoch, h.from_site)
            effects.append(PersistHardState(self.hard))
            self._reset_election_timer()
        if not granted:
            effects.append(Rejected(h.from_site, "pre-vote" if req.pre_vote else "vote", reason))
        effects.append(Send(h.from_site, h.from_address,
                            VoteReply(self._header(), req.proposed_epoch, granted, req.pre_vote, reason)))

    def _on_vote_reply(self, rep: VoteReply, effects: list[Effect]) -> None:
        wanted = Role.PRE_CANDIDATE if rep.pre_vote else Role.CANDIDATE
        expected = self.hard.epoch + 1 if rep.pre_vote else self.hard.epoch
        if self.role is not wanted or rep.proposed_epoch != expected or not rep.granted:
            return
        self.votes.add(rep.header.from_site)
        self._count_votes(effects)

    def _adopt_epoch(self, epoch: Epoch, effects: list[Effect]) -> None:
        was_leader = self.role is Role.LEADER
        self.hard = HardState(epoch, None)
        effects.append(PersistHardState(self.hard))
        self.role, self.votes = Role.FOLLOWER, set()
        if self.leader is not None or was_leader:
            self.leader = None
            effects.append(LeaderChanged(None, epoch))
        self._reset_election_timer()

    def _step_down(self, leader: SiteId | None, effects: list[Effect], why: str) -> None:
        self.role, self.leader, self.next_heartbeat = Role.FOLLOWER, leader, math.inf
        effects.append(Rejected(self.site, "leadership", why))
        effects.append(LeaderChanged(leader, self.hard.epoch))
        self._reset_election_timer()

    def _become_leader(self, effects: list[Effect]) -> None:
        self.role, self.leader, self.leader_epoch = Role.LEADER, self.site, self.hard.epoch
        self.became_leader_at = self.now
        self.next_index = {}
        self.match_index, self.ack_time, self.sent_at = {}, {}, {}
        self.election_deadline = math.inf
        effects.append(LeaderChanged(self.site, self.hard.epoch))
        self._append_and_replicate(EpochStart(self.site), effects)

    def _quorum_lost_at(self) -> float:
        """Check-quorum: when this leader steps down for want of acks (ElectionConfig.quorum_window_s)."""
        c = self.config
        return max(self._lease_expiry(c.quorum_window_s), self.became_leader_at + c.election_timeout_min_s)

    def _lease_expiry(self, hold_s: float | None = None) -> float:
        """Send time of the newest message a majority acked, plus `hold_s` (default: the lease, election.py)."""
        hold = self.config.lease_s if hold_s is None else hold_s
        return majority_acked(self) + hold if self.role is Role.LEADER else -math.inf

    def _hand_over(self, effects: list[Effect]) -> SiteId | None:
        """This peer leaves: if a staying voter holds the whole log, step down (a leaving leader opens
        no round) and tell every voter that the lease it kept for this peer is void and the heir to
        campaign now. Returns the heir (docs/decisions/consensus-leadership-transfer.md)."""
        voters = live_addresses(self.members, self.log.voters())
        voters.pop(self.site, None)
        heir = successor(voters, self.match_index, self.log.last_index, self.members, self.leaving_members,
                         self.ack_time, self.now - self.config.election_timeout_min_s, self.log.trainerless())
        if heir is not None:
            if self.role is Role.LEADER:
                self._step_down(None, effects, f"standing back: epoch {self.hard.epoch} handed over to {heir}")
            for site, address in sorted(voters.items()):
                effects.append(Send(site, address, TimeoutNow(self._header(), heir)))
        return heir

    def _on_timeout_now(self, msg: TimeoutNow, effects: list[Effect]) -> None:
        """The leader this peer follows handed its epoch over: its lease is void; the heir, unless it
        leaves too (gossip may lag), campaigns now without a pre-vote (no leader to disturb), and
        again half a timeout on (a voter the hand-over reached after the vote request refused it)."""
        h = msg.header
        refusal = not_its_leader(msg, self.leader, self.leader_epoch, self.hard.epoch)
        if refusal is not None:
            effects.append(Rejected(h.from_site, "hand-over", *refusal))
            return
        self.sticky_until, self.released = self.now, (h.from_site, h.epoch)
        if msg.successor == self.site and self.is_voter() and not self.standing_back:
            self._campaign(pre_vote=False, effects=effects)
            self.election_deadline = min(self.election_deadline, self.now + self.config.election_timeout_min_s / 2)

    # ----- replication -----

    def _header(self) -> Header:
        return Header(self.site, self.address, self.hard.epoch, self.log.last_round_entry(self.commit_index)[0])

    def _append_and_replicate(self, body: RoundCommit | VoterChange | EpochStart,
                              effects: list[Effect] | None = None) -> Answer:
        effects = [] if effects is None else effects
        entry = self.log.append_local(self.hard.epoch, body)
        effects.append(PersistLog(entry.index, (entry,)))
        self._broadcast(effects)
        self._advance_commit(effects)
        return Answer(True, f"appended at index {entry.index}", effects, entry.index)

    def _broadcast(self, effects: list[Effect]) -> None:
        self.next_heartbeat = self.now + self.config.heartbeat_interval_s
        for site, address in sorted(replication_targets(self).items()):
            effects.append(self._replicate_to(site, address))
        horizon = self.now - 2 * self.config.election_timeout_max_s  # no reply renews a lease from older sends
        self.sent_at = {s: t for s, t in self.sent_at.items() if t >= horizon}

    def _replicate_to(self, site: SiteId, address: str) -> Send:
        self.seq += 1
        self.sent_at[self.seq] = self.now
        nxt = self.next_index[site] = min(self.next_index.get(site, self.log.last_index + 1), self.log.last_index + 1)
        # Pipelining (etcd's replicate state): next_index moves past what is in flight, so replies to
        # earlier messages do not resend it; a lost message shows up as a refusal with a hint.
        if nxt <= self.log.snapshot.last_index:
            self.next_index[site] = self.log.snapshot.last_index + 1
            return Send(site, address, InstallSnapshot(self._header(), self.log.snapshot, self.seq))
        prev = nxt - 1
        prev_epoch = self.log.epoch_at(prev)
        assert prev_epoch is not None, f"no epoch for index {prev} above the snapshot"
        entries = self.log.slice(nxt, self.config.max_batch)
        if entries:
            self.next_index[site] = entries[-1].index + 1
        msg = AppendEntries(self._header(), LogIndex(prev), prev_epoch, entries, self.commit_index, self.seq)
        return Send(site, address, msg)

    def _follow(self, h: Header, effects: list[Effect]) -> None:
        if self.leader != h.from_site:
            effects.append(LeaderChanged(h.from_site, h.epoch))
        self.role, self.leader, self.leader_epoch, self.votes = Role.FOLLOWER, h.from_site, h.epoch, set()
        if self.released != (h.from_site, h.epoch):  # a hand-over's late heartbeat renews no lease
            self.sticky_until = self.now + self.config.election_timeout_min_s
            self.sticky_why = f"leader {h.from_site} heard within the election timeout (its lease holds)"
        self._reset_election_timer()

    def _on_append(self, msg: AppendEntries, effects: list[Effect]) -> None:
        self._follow(msg.header, effects)
        res = self.log.append_from_leader(msg.prev_index, msg.prev_epoch, msg.entries, self.commit_index)
        if res.first_changed is not None:
            effects.append(PersistLog(res.first_changed, self.log.slice(res.first_changed, len(self.log.entries))))
        h = msg.header
        if not res.ok:
            kind = RefusalKind.IMPLAUSIBLE if res.overwrites_committed else RefusalKind.ROUTINE
            effects.append(Rejected(h.from_site, "append", res.reason, kind))
        effects.append(Send(h.from_site, h.from_address,
                            AppendReply(self._header(), res.ok, res.match_index, msg.seq, res.reason)))
        if res.ok:
            self._commit_to(min(msg.commit_index, res.match_index), effects)

    def _on_snapshot(self, msg: InstallSnapshot, effects: list[Effect]) -> None:
        self._follow(msg.header, effects)
        snap = msg.snapshot
        if snap.last_index > self.commit_index:
            self.log.install(snap)
            self.commit_index = self.applied_index = snap.last_index
            effects.append(PersistSnapshot(snap))
            effects.append(SnapshotInstalled(snap))
        h = msg.header
        effects.append(Send(h.from_site, h.from_address,
                            AppendReply(self._header(), True, snap.last_index, msg.seq, "snapshot")))

    def _on_append_reply(self, rep: AppendReply, effects: list[Effect]) -> None:
        if self.role is not Role.LEADER:
            return
        site = rep.header.from_site
        sent = self.sent_at.get(rep.seq)
        if sent is not None:
            self.ack_time[site] = max(self.ack_time.get(site, -math.inf), sent)
        if rep.success:
            self.acked_seq[site] = max(self.acked_seq.get(site, 0), rep.seq)
            self.match_index[site] = max(self.match_index.get(site, 0), rep.match_index)
            self.next_index[site] = max(self.next_index.get(site, 0), self.match_index[site] + 1)
            self._advance_commit(effects)
        else:
            hint = min(rep.match_index, self.log.last_index + 1)
            if rep.seq > self.acked_seq.get(site, 0) and hint <= self.match_index.get(site, 0):
                # The follower refuses what it once acked: its log was emptied (`peer repair`). Forget
                # the old match, or every retry re-sends the same unusable prev_index.
                self.match_index[site] = max(0, hint - 1)
            self.next_index[site] = max(self.match_index.get(site, 0) + 1, hint)
        if not rep.success or self.next_index[site] <= self.log.last_index:
            effects.append(self._replicate_to(site, rep.header.from_address))

    def _advance_commit(self, effects: list[Effect]) -> None:
        match = dict(self.match_index)
        match[self.site] = self.log.last_index
        n = quorum_index(match, (s for s, _ in self.log.voters()))
        # Raft 5.4.2: only an entry of the leader's own epoch commits by counting replicas.
        if n > self.commit_index and self.log.epoch_at(n) == self.hard.epoch:
            self._commit_to(n, effects)
            self._broadcast(effects)  # followers learn the new commit index one delay later
            if self.role is Role.LEADER:
                self._reconcile_voters(effects)
            elif self._hand_over(effects) is None:  # it committed its own removal (thesis 4.2.2)
                effects.append(Rejected(self.site, "hand-over", "no staying voter is alive and holds the whole log"))

    def _commit_to(self, index: int, effects: list[Effect]) -> None:
        if index <= self.commit_index:
            return
        self.commit_index = LogIndex(index)
        while self.applied_index < self.commit_index:
            self.applied_index = LogIndex(self.applied_index + 1)
            entry = self.log.entry(self.applied_index)
            assert entry is not None, f"committed index {self.applied_index} missing from the log"
            effects.append(Committed(entry))
            body = entry.body
            if isinstance(body, VoterChange) and body.site == self.site and not body.add and self.role is Role.LEADER:
                # Thesis 4.2.2: a leader that removed itself steps down once the removal commits.
                self._step_down(None, effects, "removed from the voter set")

    # ----- voter set -----

    def _mark(self, site: SiteId, state: MemberState) -> None:
        known = self.members.get(site)
        address = known.address if known else dict(self.log.voters()).get(site, "")
        since = known.since if known and known.state == state else self.now
        self.members[site] = MemberVerdict(address, state, since)

    def _reconcile_voters(self, effects: list[Effect]) -> None:
        """Leader: propose at most one voter change toward what membership reports (thesis 4.1)."""
        if self.role is not Role.LEADER or self.now >= self._lease_expiry():
            return
        if self.log.epoch_at(self.commit_index) != self.hard.epoch:
            return  # thesis 4.1 fix: commit an entry of this epoch before changing the voter set
        if self.log.last_config_index() > self.commit_index:
            return  # one change at a time: the previous one is not committed yet
        change, note = next_voter_change(self)
        if note is not None:
            self.voter_note = note
        if change is not None:
            self.voter_note = f"proposed {'add' if change.add else 'remove'} {change.site}: {change.reason}"
            self._append_and_replicate(change, effects)
