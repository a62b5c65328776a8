"""Round scheduling for DiLoCo outer rounds, sans I/O: the leader opens rounds and decides them.

The leader of the current epoch opens round r = last committed round + 1 once round r-1 is
committed, and expects a report from every live site. Which samples a site trains is not the
leader's business: sites train samples they hold data leases on (DARL, peer/core/lease_client.py) and
report exactly those, with the lease owners' vouchers. The leader decides when every expected site
reported or the deadline passed: `admit_round` (peer/core/admission.py) includes a contribution only if
every range is vouched for that site and round and none is committed in the data epoch (I6);
anything else is excluded with a reason and its samples go back to free. A peer's round router
(peer_rounds.py) turns a `Decide` into the fetch and outer step the coordinator runs, then a
RoundCommit proposal; the commit log alone says which samples are trained (I4, I5).

    .venv/bin/python -m pytest tests/unit/test_rounds.py -q
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Union

from peer.core import admission
from peer.core.audit import EpochLedger
from peer.core.commitlog import Round, RoundCommit, SampleRange
from peer.core.election import Header, SiteId
from peer.core.exclusion import Exclusion, ExclusionKind
from peer.core.lease_types import Voucher


@dataclass(frozen=True)
class RoundOpen:
    header: Header
    round: int
    inner_steps: int
    deadline_s: float
    base_weights_hash: bytes
    budget_s: float = 0.0
    """> 0: a time-boxed round, each site trains as many of the inner steps as fit in this many
    seconds (at least one); the token-weighted mean absorbs the unequal work. 0: all H steps."""


@dataclass(frozen=True)
class Contribution:
    header: Header
    round: int
    site: str
    address: str
    tokens: int
    ranges: tuple[SampleRange, ...]
    """Exactly the samples trained; empty: this site trained nothing this round."""
    pseudo_gradient_root: bytes
    vouchers: tuple[Voucher, ...] = ()

    def accounting(self) -> admission.Offer:
        return admission.Offer(SiteId(self.site), self.round, self.ranges, self.vouchers, self.tokens)


@dataclass(frozen=True)
class RunComplete:
    """Leader -> members: every data epoch is committed, no round after `round` opens, and the
    leader holds θ_round. A site leaving with samples in that round needs no round after it."""

    header: Header
    round: int


Message = Union[RoundOpen, Contribution, RunComplete]


class EmptyRounds:
    """A peer without a trainer (`peer serve --round-interval S`: membership and consensus runs): its
    leader commits an empty round every `interval_s`, carrying the last committed weights hash."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next_at = 0.0

    def next_deadline(self, leading: bool) -> float:
        """The next proposal's time while this peer leads; a follower waits for an election (an event)."""
        return self._next_at if leading and self.interval_s > 0 else float("inf")

    def tick(self, now: float, leading: bool, committed_round: int, weights_hash: bytes) -> RoundCommit | None:
        if not leading or self.interval_s <= 0 or now < self._next_at:
            return None
        self._next_at = now + self.interval_s
        return RoundCommit(Round(committed_round + 1), (), weights_hash)


@dataclass(frozen=True)
class RoundsConfig:
    inner_steps: int
    """H: inner steps each site runs per round."""
    samples_per_step: int
    """Samples one inner step consumes at a site (the trainer's batch size): a round is H x this."""
    deadline_s: float
    """How long the leader waits for contributions after opening a round."""
    data_epochs: int = 1
    """Passes over the dataset; no round opens once the log has completed this many."""
    idle_wait_s: float = 1.0
    """After a round in which no site trained anything, wait this long before opening it again."""
    idle_wait_max_s: float = 8.0
    """A round decided with no contribution admitted (nobody trained, or every report failed or was
    excluded) is committed empty, and the next opens only after idle_wait_s, doubled for each such
    commit in a row, up to this. Without the wait a run whose every contribution fails at once (a
    site leasing blocks of another data config) committed empty rounds in a tight loop, 976 in 85 s
    (issue #38); at the cap it commits one per idle_wait_max_s, and a productive round resets it."""
    idle_commit_after: int = 2
    """The round's n-th opening in a row in which no site trained anything is committed empty: a
    claim pending on it (a site that claimed samples, then left or died before its report reached
    this leader) settles only by the round's commit, and until then its samples are neither
    committed nor free, so nobody can train them (docs/decisions/rounds-idle-commit.md)."""
    gather_s: float = 2.0
    """A site stops collecting leased samples for a round when none came for this long (its next
    block needs the owner's Start ack; at the end of the data epoch nothing may come at all)."""
    budget_s: float = 0.0
    """Time-boxed rounds (RoundOpen.budget_s); 0: every site runs all inner_steps."""
    deadline_k: float = 0.0
    """> 0: the deadline adapts to the sites' pace, median + k x MAD of the report delays of the
    last `pace_rounds` rounds (plus `deadline_slack_s`), never above deadline_s. 0: deadline_s."""
    pace_rounds: int = 8
    deadline_slack_s: float = 2.0
    """Added to the adaptive deadline: a round's delays vary by more than their spread when the
    leader's own work (fetching, the outer step) lands on them."""
    start_sites: int = 1
    """The run's first round opens only once this many sites are live: sites started together
    build their trainers at different speeds, and the first one up would otherwise train a good
    part of the data epoch alone. Later rounds open with any number of sites."""
    overlap: bool = False
    """This site trains round r+1 as soon as it has reported round r, before θ_r exists, and folds
    θ_r in when it is applied (SiteRound; docs/decisions/rounds-overlap-fold.md). Site-local: the
    log, the leader and every other peer see the same rounds either way."""

    def __post_init__(self) -> None:
        if (self.inner_steps < 1 or self.samples_per_step < 1 or self.deadline_s <= 0 or self.data_epochs < 1
                or self.idle_wait_s < 0 or self.gather_s <= 0 or self.idle_commit_after < 1):
            raise ValueError("inner_steps, samples_per_step, deadline_s, data_epochs and idle_commit_after "
                             "must be positive")
        if self.idle_wait_max_s < self.idle_wait_s:
            raise ValueError(f"idle_wait_max_s ({self.idle_wait_max_s}) must be >= idle_wait_s ({self.idle_wait_s})")
        if self.start_sites < 1:
            raise ValueError(f"start_sites ({self.start_sites}) must be >= 1")
        if self.budget_s < 0 or self.deadline_k < 0 or self.pace_rounds < 1 or self.deadline_slack_s < 0:
            raise ValueError(f"budget_s ({self.budget_s}), deadline_k ({self.deadline_k}) and deadline_slack_s "
                             f"({self.deadline_slack_s}) must be >= 0 and pace_rounds ({self.pace_rounds}) >= 1")

    @property
    def samples_per_round(self) -> int:
        return self.inner_steps * self.samples_per_step


@dataclass(frozen=True)
class Broadcast:
    """Effect: send `msg` to every live member (the node resolves addresses)."""

    msg: RoundOpen


@dataclass(frozen=True)
class SendOpen:
    """Effect (leader): send the open round's `msg` again to `site` alone (the node resolves its
    address), for `why`. An open is a one-way message: one that reached a site's previous process,
    or none at all, is lost, and without it the site never reports (rounds-open-resend.md)."""

    site: str
    msg: RoundOpen
    why: str


@dataclass(frozen=True)
class Decide:
    """Effect (leader): fetch, verify and average `admitted`, then propose the RoundCommit."""

    round: int
    admitted: tuple[Contribution, ...]
    excluded: tuple[Exclusion, ...]
    """Every expected site or contribution that is not in the round, with why."""
    why: str = ""
    """Why a round with nothing admitted is committed anyway, and when the next one opens (empty: it
    has contributions to decide)."""


@dataclass(frozen=True)
class EpochComplete:
    """Effect (leader): the log completed `data_epochs` passes, every sample exactly once per pass,
    and this leader applied the last round: send `msg` to every live member."""

    samples: int
    data_epochs: int
    msg: RunComplete


@dataclass(frozen=True)
class Reported:
    """Effect (leader): `contribution` is in the open round. The node may ask its site for the
    pseudo-gradient's manifest at once, for the `Decide` to find asked: a site cut off right after
    it reported is then known by the round's deadline, not a manifest timeout after it
    (docs/decisions/exchange-manifest-timeout.md). Nothing here waits on it."""

    contribution: Contribution


Effect = Union[Broadcast, SendOpen, Decide, EpochComplete, Reported]


@dataclass
class _Open:
    msg: RoundOpen
    """What was broadcast (sent again, unchanged, to a site that came back up: `member_up`)."""
    opened: float
    deadline: float
    expected: frozenset[str]
    got: dict[str, Contribution] = field(default_factory=dict)
    """Reports with samples, by site (the first one of each site counts)."""
    idle: set[str] = field(default_factory=set)
    """Sites that reported they trained nothing."""
    dead: set[str] = field(default_factory=set)
    """Sites membership stopped counting as live while the round was open (DEAD or LEFT): one that
    reported is dropped at once, since its pseudo-gradient cannot be fetched any more."""
    withdrawn: set[str] = field(default_factory=set)
    """Sites whose report must not be admitted: this leader itself once it is leaving."""

    @property
    def round(self) -> int:
        return self.msg.round


class RoundLeader:
    """The leader's side. Feed it commits, contributions and ticks; it says when to open and decide.

    `ledger` is the node's EpochLedger of the commit log (the lease cores share it); the node
    folds every RoundCommit into it before calling `on_commit`.
    """

    def __init__(self, config: RoundsConfig, ledger: EpochLedger,
                 credit: admission.Credit | None = None) -> None:
        self.config = config
        self.ledger = ledger
        self.credit = credit
        """What admission checks of vouchers and tokens (the node's `LeaseLog.credit`;
        docs/decisions/security-work-credit.md); None: coverage and the log only."""
        self._open: _Open | None = None
        self._decided: int | None = None  # round handed to the node, awaiting its commit
        self._idle_until = float("-inf")
        self._for_sites = False
        """The last tick could not open a round for want of live sites: only a membership change helps."""
        self._started = False
        """A first round was opened, here or by another leader: `start_sites` waits no longer."""
        self._epoch_reported = False
        self._pace: deque[tuple[int, float]] = deque()
        """(round, seconds from its open to a site's report) of recent reports, late ones included."""
        self._last: tuple[int, float] | None = None
        """(round, opened at) of the last round closed: its late reports still tell the pace."""
        self._idle: tuple[int, int] = (0, 0)
        """(round, how many of its openings in a row at this leader closed with nobody training)."""
        self._empty = 0
        """Rounds in a row this leader decided with no contribution admitted: sets the wait before
        the next opening (`empty_wait_s`)."""

    @property
    def done(self) -> bool:
        """The log completed every data epoch the run asked for."""
        return self.ledger.data_epoch >= self.config.data_epochs

    def on_commit(self, round_: int) -> None:
        """Round `round_` is committed (on every peer, in log order)."""
        if self._decided is not None and round_ >= self._decided:
            self._decided = None
        if self._open is not None and round_ >= self._open.round:
            self._open = None

    def step_down(self) -> None:
        """Lost the leadership: whatever was open is abandoned; a successor reopens the round."""
        self._open, self._decided = None, None

    def next_deadline(self) -> float:
        """When tick next has something to do on its own (-inf: now; inf: only after an event), for
        an executor that also ticks after every commit, report and membership change."""
        if self._decided is not None or self._for_sites:
            return float("inf")
        if self._open is not None:
            return self._open.deadline
        if self.done:
            return float("inf") if self._epoch_reported else float("-inf")
        return self._idle_until

    @property
    def collecting(self) -> bool:
        """A round is open: its reports are being collected until they are in or its deadline."""
        return self._open is not None

    @property
    def in_progress(self) -> bool:
        """A round is open, or decided and not committed yet."""
        return self._open is not None or self._decided is not None

    def tick(self, now: float, header: Header, committed_round: int, live_sites: Sequence[str],
             base_hash: bytes, open_new: bool = True) -> list[Effect]:
        """Opens the next round (only if `open_new`), or closes the open one when nobody live is
        waited for or its deadline passed."""
        if self._decided is not None:
            return []
        o = self._open
        if o is None and not open_new:
            return []
        self._for_sites = False
        if o is None:
            if self.done:
                if self._epoch_reported:
                    return []
                self._epoch_reported = True
                return [EpochComplete(self.ledger.total, self.config.data_epochs, RunComplete(header, committed_round))]
            if now < self._idle_until:
                return []
            if not live_sites or (committed_round == 0 and not self._started
                                  and len(set(live_sites)) < self.config.start_sites):
                self._for_sites = True  # the run starts once its first sites are all up (start_sites)
                return []
            rnd = committed_round + 1
            deadline_s, self._started = self.deadline_s(), True
            msg = RoundOpen(header, rnd, self.config.inner_steps, deadline_s, base_hash, self.config.budget_s)
            self._open = _Open(msg, now, now + deadline_s, frozenset(live_sites))
            return [Broadcast(msg)]
        o.dead |= o.expected - set(live_sites)
        # Waiting for a site that membership no longer counts as live cannot pay off: decide now.
        if now >= o.deadline or not self._waiting(o) - o.dead:
            return self._close(now)
        return []

    def member_down(self, site: str, now: float) -> list[Effect]:
        """Membership declared `site` DEAD or LEFT: drop it from the open round at once (its report,
        if any, cannot be fetched) and decide if it was the last one waited for."""
        o = self._open
        if o is None or site not in o.expected:
            return []
        o.dead.add(site)
        return [] if self._waiting(o) - o.dead else self._close(now)

    def member_up(self, site: str, now: float) -> list[Effect]:
        """Membership saw `site` come (back) up: ALIVE again, or a new process of it. If the open
        round still waits for its report, send it the open again: the broadcast may have reached
        its previous process, or (SUSPECT then) not been sent to it at all, and a site that never
        heard of the round would be waited for until the deadline. A site that has the open already
        takes the copy as a reopening from the same θ (SiteRound), so a spare one costs nothing."""
        o = self._open
        if o is None or site not in self._waiting(o) - o.dead:
            return []
        return [SendOpen(site, o.msg, f"round {o.round}: {site} came back up and has not reported; "
                                      f"sending it the open again ({o.deadline - now:.1f} s to the deadline)")]

    def withdraw(self, site: str, now: float) -> list[Effect]:
        """`site` (this leader, leaving) takes its report back: the open round admits none from it
        and stops waiting for it; decide if it was the last one waited for."""
        o = self._open
        if o is None:
            return []
        o.withdrawn.add(site)
        return [] if self._waiting(o) - o.dead else self._close(now)

    @staticmethod
    def _waiting(o: _Open) -> set[str]:
        return set(o.expected - set(o.got) - o.idle - o.withdrawn)

    def deadline_s(self) -> float:
        """The next round's deadline: deadline_s, or (deadline_k > 0) the sites' recent pace."""
        c = self.config
        delays = [d for _, d in self._pace]
        if c.deadline_k <= 0 or len(delays) < 3:
            return c.deadline_s
        mid = statistics.median(delays)
        mad = statistics.median(abs(d - mid) for d in delays)
        return min(c.deadline_s, mid + c.deadline_k * mad + c.deadline_slack_s)

    def empty_wait_s(self, empty_in_a_row: int) -> float:
        """How long the next opening waits after the n-th round in a row decided with nothing
        admitted: idle_wait_s, doubled for each one before, at most idle_wait_max_s."""
        c = self.config
        return min(c.idle_wait_s * 2.0 ** min(max(empty_in_a_row - 1, 0), 62), c.idle_wait_max_s)

    def _decided_round(self, round_: int, admitted: int, now: float) -> None:
        """The leader handed `round_` to the node to commit. With nothing admitted the commit is empty,
        and so it costs the log an entry and gains the run nothing: the next opening waits on a
        deadline (`next_deadline`) instead of following the commit at once; one that admits
        anything opens the next round as soon as it commits."""
        self._decided = round_
        if admitted:
            self._empty = 0
            return
        self._empty += 1
        self._idle_until = max(self._idle_until, now + self.empty_wait_s(self._empty))

    def opened_elsewhere(self) -> None:
        """Another leader opened a round: the run has started. A site that died in its first round
        would otherwise keep a new leader from reopening it, waiting for `start_sites` forever."""
        self._started = True

    def observed(self, round_: int, seconds: float) -> None:
        """Round `round_`, opened by another leader, committed `seconds` after its open reached this
        peer. A peer that comes to lead has none of its own report delays yet and would give its
        first rounds the whole fixed deadline_s, many rounds' time; a round's length bounds its
        slowest report, so until its own reports replace them these set the deadline (`deadline_s`)."""
        self._paced(round_, seconds)

    def _paced(self, round_: int, delay: float) -> None:
        self._pace.append((round_, delay))
        while self._pace and self._pace[0][0] <= round_ - self.config.pace_rounds:
            self._pace.popleft()

    def receive(self, msg: Contribution, now: float) -> list[Effect]:
        """Collects one report; decides once every expected site has reported."""
        o = self._open
        if o is None or msg.round != o.round or msg.site in o.got:
            if o is None and self._last is not None and msg.round == self._last[0] and msg.ranges:
                # A report that missed the deadline: the next deadline must learn this site's pace,
                # or a slowed-down mesh would be cut off round after round.
                self._paced(msg.round, now - self._last[1])
            return []  # late, early, or a duplicate delivery of what we have
        if msg.ranges:
            self._paced(msg.round, now - o.opened)
        asked: list[Effect] = []
        if msg.ranges:
            o.got[msg.site] = msg
            o.idle.discard(msg.site)
            asked.append(Reported(msg))
        else:
            o.idle.add(msg.site)
        return asked if self._waiting(o) - o.dead else asked + self._close(now)

    def _close(self, now: float) -> list[Effect]:
        """Decide the open round (I6). If nobody trained anything, drop it and open it again later
        (a commit that settles no claim only lengthens the log), unless that happened
        `idle_commit_after` times in a row: then commit it empty, since a claim may be pending on
        it that no report here names (its site left or died after the owner vouched for it)."""
        o = self._open
        assert o is not None
        self._open = None
        self._last = (o.round, o.opened)
        if not o.got and o.withdrawn:
            # This leader is leaving and its own report (with claims, perhaps not here yet) is not
            # admitted: only the round's commit settles those claims and lets its leave go on, and
            # a leaving leader reopens nothing (PeerRounds.may_open).
            self._decided = o.round
            return [Decide(o.round, (), (), f"round {o.round}: {', '.join(sorted(o.withdrawn))} leads it and is "
                                            "leaving; committing it without contributors so that its claims settle")]
        if not o.got:
            n = self._idle[1] + 1 if self._idle[0] == o.round else 1
            self._idle = (o.round, n)
            if n < self.config.idle_commit_after:
                self._idle_until = now + self.config.idle_wait_s
                return []
            self._decided_round(o.round, 0, now)
            return [Decide(o.round, (), (), f"round {o.round}: nobody trained in {n} openings in a row; "
                                            "committing it empty so that any claim pending on it settles "
                                            "(its samples go back to free)")]
        # A report of samples without a pseudo-gradient (its training failed) is there to have its
        # claims settled by this round's commit, never to be included.
        failed = sorted(s for s, c in o.got.items() if c.tokens <= 0 or not c.pseudo_gradient_root)
        withdrawn = sorted(set(o.got) & o.withdrawn - set(failed))
        gone = sorted(set(o.got) & o.dead - set(failed) - set(withdrawn))
        offers = {s: c for s, c in o.got.items() if s not in failed and s not in gone and s not in withdrawn}
        decisions = admission.admit_round(o.round, (c.accounting() for c in offers.values()), self.ledger,
                                          self.credit)
        admitted = tuple(offers[d.site] for d in decisions if d.included)
        excluded = [Exclusion(d.site, d.kind, d.reason) for d in decisions if d.kind is not None]
        excluded += [Exclusion(s, ExclusionKind.TRAINING_FAILED,
                               f"excluded: {s} trained nothing usable in round {o.round} (its training failed)")
                     for s in failed]
        excluded += [Exclusion(s, ExclusionKind.DEPARTED,
                               f"excluded: {s} is dead (membership), its reported pseudo-gradient cannot be fetched")
                     for s in gone]
        excluded += [Exclusion(s, ExclusionKind.LEAVING_LEADER, f"excluded: {s} leads this round and is leaving: "
                               "once it is gone nobody would hold its pseudo-gradient") for s in withdrawn]
        excluded += [Exclusion(s, ExclusionKind.DEPARTED, f"excluded: {s} did not report (membership declared it "
                               "dead or left)") if s in o.dead else
                     Exclusion(s, ExclusionKind.NO_REPORT, f"excluded: {s} did not report (deadline passed)")
                     for s in sorted(self._waiting(o))]
        self._decided_round(o.round, len(admitted), now)
        why = "" if admitted else (f"round {o.round}: no contribution admitted ({self._empty} such round(s) in a "
                                   f"row); committing it empty, the next round opens in "
                                   f"{self._idle_until - now:.1f} s")
        return [Decide(o.round, admitted, tuple(excluded), why)]
