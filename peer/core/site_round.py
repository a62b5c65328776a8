"""The site's half of an outer round, sans I/O: gather, train, claim, report; and a graceful leave.

A round at this site, as states of `SiteRound`:

1. `Opened(r)` from the leader. θ_{r-1} may still be being applied here (its commit raced the
   open): wait for `Persisted` up to `base_wait_s`; not at θ_{r-1} with the leader's hash then:
   report nothing, with the reason.
2. Gather: take samples of started, valid leases (the lease client core) at every `LeasesChanged`,
   up to H x batch; stop when the quota is full or none came for `gather_s` (the next block needs
   its owner's Start ack; at the end of a data epoch nothing may come at all).
3. `Train` effect; `TrainDone` / `TrainFailed`. Whatever happened, what was taken is claimed for
   round r (the round's commit settles the claims: admitted, committed; otherwise free again).
4. Wait for every owner's answer to the claims, up to max(deadline_s, lease ttl), then `Report`
   what was trained with the vouchers got. A lost lease (reclaimed after a pause, stolen) leaves
   its samples without a voucher: the leader excludes the report and the commit frees the claims.

A round reopened after a leader change is answered with the report already sent (same θ, same
vouchers), or, while this site still works on it, with that report when it is done. A site that is
busy with an earlier open or leaving reports nothing.

Overlap (`RoundsConfig.overlap`; docs/decisions/rounds-overlap-fold.md): once this site has
reported round r with samples, it gathers and trains round r+1 at once, *ahead* of its open, from
where its trainer stands; when θ_r is applied here a `Fold` hands it to the trainer, which folds it
in between two steps (Δ_{r+1} is measured from θ_r whenever the fold comes). Its claims go out when
it is trained, as in a serial round; its report waits for the leader's open of r+1 and for θ_r here
with the open's hash, exactly what a serial round checks before it trains. A round trained ahead
that is decided without it (a later round opened, or committed) puts its samples back unclaimed, or,
if claimed, leaves them to the commit that frees them. At most one round is trained ahead: the next
starts only after this one is reported. Each busy state names how its round stands with the open
(`_Serial`, `_Ahead`, `_Opened`) and a trainer's start against θ_{r-1} (`Start`); a round trained
ahead that a later open overtook is `_Overtaken`.

    .venv/bin/python -m pytest -q tests/unit/test_site_round.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from peer.core import events as ev
from peer.core.election import Header
from peer.core.ids import Epoch, SiteId
from peer.core.lease_client import LeaseClient
from peer.core.lease_types import Spans, Voucher, normalize, of_range, subtract, to_ranges
from peer.core.rounds import Contribution, RoundOpen, RoundsConfig
from peer.core.samples import SampleRange, merge_ranges
from peer.core.timeline import RoundClock

BASE_WAIT_S = 5.0
"""How long an open waits for θ_{r-1} to be applied here before the site sits the round out, unless
θ_{r-1} is committed and this peer is applying it (see `SiteRound._base_until`)."""


class Start(Enum):
    """Where the trainer of a round started, against θ_{r-1}."""

    AT_BASE = "at base"
    """From θ_{r-1}: a serial round, or one trained ahead after θ_{r-1} was applied here."""
    BEFORE_BASE = "before base"
    """Ahead of θ_{r-1}, from where the trainer stood: it waits for a `Fold` of θ_{r-1}."""
    FOLDED = "folded"
    """Ahead of θ_{r-1}, and the `Fold` went to the trainer."""


@dataclass(frozen=True)
class _Serial:
    """The leader opened the round before this site gathered for it, and awaits its report."""


@dataclass(frozen=True)
class _Ahead:
    """Overlap: started before its open, which has not come (or was answered "leaving" since): no leader
    awaits a report of it."""


@dataclass(frozen=True)
class _Opened:
    """Overlap: started before its open, which came since: the leader awaits this site's report."""

    since: float
    """From when the report waits for θ_{r-1} here, as `_Waiting` does: the open's arrival, or the end
    of training if that came later."""


_Lead = _Serial | _Ahead | _Opened
"""How a round this site works on stands with the leader's open of it."""


@dataclass
class _Waiting:
    open: RoundOpen
    since: float
    """When the open arrived: the wait for θ_{r-1} is counted from here (`_base_until`)."""


@dataclass
class _Gathering:
    open: RoundOpen
    since: float
    quiet_since: float
    got: list[SampleRange]
    lead: _Lead
    """Before its open (`_Ahead`), `open` is the last round's open renumbered, its base hash unknown
    until the real open arrives."""
    count: int = 0


@dataclass
class _Training:
    open: RoundOpen
    ranges: tuple[SampleRange, ...]
    started: float
    lead: _Lead
    start: Start


@dataclass
class _Overtaken:
    """Overlap: a later round opened while this one trained ahead, so it was decided without this site:
    its samples go back on their leases when the trainer is done."""

    open: RoundOpen
    ranges: tuple[SampleRange, ...]
    lead: _Ahead | _Opened
    start: Start


@dataclass
class _Claiming:
    open: RoundOpen
    trained: ev.TrainDone
    published: float
    until: float
    lead: _Lead


_Busy = _Waiting | _Gathering | _Training | _Overtaken | _Claiming


class SiteRound:
    """This site's part of each round; feed it events, run the effects it returns."""

    def __init__(self, site: str, address: str, config: RoundsConfig, claim_wait_s: float, client: LeaseClient,
                 clock: RoundClock, applied_round: int, weights_hash: bytes) -> None:
        self.site, self.address, self.config = site, address, config
        self.claim_wait_s = claim_wait_s
        """At least this long for the owners' vouchers (the lease ttl: a claim outlives a failover)."""
        self.client, self.clock = client, clock
        self.applied_round, self.weights_hash = applied_round, weights_hash
        self.committed_round = applied_round
        """The newest round committed in the log as far as this core was told."""
        self.busy: _Busy | None = None
        self.sent: Contribution | None = None
        """This site's last report with samples, kept to answer a reopened round without retraining."""
        self.leaving = False
        self._leave_until: float | None = None
        self._nobody_stays = False
        """While leaving: no round after this site's last will open (`NobodyStays`)."""
        self._sent_to = ""
        """The leader that opened the round of `sent` (the one that decides it)."""
        self._run_complete = 0
        """The run's last round, once its leader said it holds θ of it (`RunCompleted`); 0: not said."""
        self._down: set[str] = set()
        """Sites membership declared DEAD or LEFT and not up again since."""
        self._pace: float | None = None
        """Samples per compute second this site trained in its last time-boxed round."""

    # ----- the state machine -----------------------------------------------------------------
    def handle(self, event: ev.Event, now: float) -> list[ev.Effect]:
        if isinstance(event, ev.Opened):
            return self._opened(event.msg, now)
        if isinstance(event, ev.Persisted):
            self.applied_round, self.weights_hash = event.round, event.weights_hash
            self.committed_round = max(self.committed_round, event.round)
            b = self.busy
            if isinstance(b, _Training | _Overtaken) and b.start is Start.BEFORE_BASE and b.open.round == event.round + 1:
                b.start = Start.FOLDED
                return [ev.Fold(event.round)] + self._progress(now)
        elif isinstance(event, ev.Committed):
            self.committed_round = max(self.committed_round, event.commit.round)
            if self.sent is not None and event.commit.round == self.sent.round and all(
                    c.site != self.site for c in event.commit.contributors):
                self.sent = None  # the round went without this site's report: nobody needs its Δ
        elif isinstance(event, ev.TrainDone | ev.TrainFailed):
            return self._trained(event, now)
        elif isinstance(event, ev.LeaveRequested):
            return self._leave(event.wait_s, now)
        elif isinstance(event, ev.NobodyStays):
            self._nobody_stays = event.value
        elif isinstance(event, ev.RunCompleted) and event.round > self._run_complete:
            self._run_complete = event.round
            return [ev.Note(f"the run's data is complete: no round after round {event.round} opens, and its "
                            "leader holds θ of it")] + self._progress(now)
        elif isinstance(event, ev.MemberDown):
            self._down.add(event.site)
        elif isinstance(event, ev.MemberUp):
            self._down.discard(event.site)
        return self._progress(now)

    def next_deadline(self) -> float:
        times = [self._leave_until if self._leave_until is not None else float("inf")]
        b = self.busy
        if isinstance(b, _Waiting):
            times.append(self._base_until(b.open, b.since))
        elif isinstance(b, _Claiming):
            lead = b.lead
            if isinstance(lead, _Opened) and self.applied_round < b.open.round - 1:
                times.append(self._base_until(b.open, lead.since))  # θ_{r-1} here first, then the vouchers
            elif not isinstance(lead, _Ahead):
                times.append(b.until)
        elif isinstance(b, _Gathering):
            times.append(b.quiet_since + self.config.gather_s)
        return min(times)

    # ----- steps -------------------------------------------------------------------------------
    def _opened(self, msg: RoundOpen, now: float) -> list[ev.Effect]:
        sent = self.sent
        if sent is not None and sent.round == msg.round:
            self._sent_to = msg.header.from_site
            return [ev.Note(f"round {msg.round}: reopened; the report of {self._count(sent.ranges)} samples "
                            "trained from the same θ stands"), ev.Report(sent)]
        b = self.busy
        if isinstance(b, _Gathering | _Training | _Overtaken | _Claiming) and not self.leaving:
            lead = b.lead
            if not isinstance(lead, _Serial):
                if msg.round == b.open.round or (isinstance(b, _Gathering) and msg.round > b.open.round):
                    # The open of the round this site works on ahead (or, before it trains, a later one:
                    # the gathered samples serve that one as well).
                    b.open, b.lead = msg, _Opened(now)
                    return [ev.Note(f"round {msg.round}: opened; this site trains it ahead")] + self._progress(now)
                if msg.round > b.open.round and isinstance(b, _Training):
                    b = self.busy = _Overtaken(b.open, b.ranges, lead, b.start)
        if b is not None and not self.leaving and (b.open.round, b.open.base_weights_hash) == (
                msg.round, msg.base_weights_hash):
            # A new leader reopened the round this site is working on from the same θ: the work
            # stands, and its report goes to whoever leads when it is done. Answering nothing here
            # threw away a slow site's whole round each time the leadership changed under it.
            b.open = msg
            return [ev.Note(f"round {msg.round}: reopened while this site works on it from the same θ; "
                            "it reports when done")]
        if b is not None or self.leaving:
            why = "leaving" if self.leaving else f"still busy with round {b.open.round}"  # type: ignore[union-attr]
            return [ev.Note(f"round {msg.round}: {why}; reporting nothing"), self._report(msg.round)]
        self.busy = _Waiting(msg, now)
        return self._progress(now)

    def _progress(self, now: float) -> list[ev.Effect]:
        """Advance whatever state the time and the lease cores allow (called on every event)."""
        out: list[ev.Effect] = []
        if self._leave_until is not None:
            sent = self._sent_round()
            if self.committed_round >= sent and not self.client.leaving:
                out += self._give_back(now)
            if self.committed_round > sent or now >= self._leave_until:
                out += self._release(now)
            elif self.committed_round >= sent and self._run_complete >= sent:
                # The run's data is complete: no round after opens to prove θ_sent is held by a peer
                # that stays, so the leader says it (it applied the round before it said so).
                out += [ev.Note(f"leaving: the run's data is complete and its leader holds θ_{self._run_complete}; "
                                f"no round after round {sent} will open")] + self._release(now)
            elif self._nobody_stays and self.committed_round >= sent and self.applied_round >= sent:
                # Every other live member leaves too: no leader that stays will open the round after,
                # and nobody that stays needs θ_sent. This site's disk holds it: the run pauses, not lost.
                out += [ev.Note(f"leaving: every other live member is leaving too, so no round after round {sent} "
                                f"will open; θ_{sent} is on this site's disk")] + self._release(now)
            elif self._nobody_stays and self.committed_round < sent and (self._sent_to in self._down
                                                                         or self._sent_to == self.site):
                # The leader that opened it left without deciding it, or was this site and no longer
                # holds it (it stepped down, or closed it uncommitted: `NobodyStays` says this peer
                # leads no round in progress), and a leaving leader reopens nothing. The round is
                # not committed, so nothing of it is lost: its claims settle when a resumed run
                # commits round `sent`.
                who = "this site" if self._sent_to == self.site else self._sent_to
                out += [ev.Note(f"leaving: {who}, which opened round {sent}, no longer holds it undecided and every "
                                "other live member is leaving too; nobody will fetch this site's "
                                "pseudo-gradient")] + self._release(now)
        b = self.busy
        if isinstance(b, _Waiting):
            at_base = self.applied_round >= b.open.round - 1 and self.applied_round >= self.committed_round
            if not at_base and now < self._base_until(b.open, b.since):
                return out
            if not self._at_base(b.open):
                self.busy = None
                return out + [ev.Note(f"round {b.open.round}: not at θ_{b.open.round - 1} (have round "
                                      f"{self.applied_round}), not contributing", warning=True),
                              self._report(b.open.round)]
            b = self.busy = _Gathering(b.open, now, now, [], _Serial())
        if isinstance(b, _Gathering):
            return out + self._gather(b, now)
        if isinstance(b, _Claiming):
            return out + self._claimed(b, now)
        return out

    def _ahead(self, last: RoundOpen, now: float) -> list[ev.Effect]:
        """Overlap: start the round after `last` (just reported with samples) before it opens, on the
        same settings (H, budget, deadline)."""
        rnd = last.round + 1
        if self.leaving or rnd <= self.committed_round or self.applied_round < last.round - 1:
            return []  # decided already, or this site lags: the next open starts it as a serial round
        self.busy = _Gathering(replace(last, round=rnd, base_weights_hash=b""), now, now, [], _Ahead())
        return self._progress(now)

    def _base_until(self, open_: RoundOpen, since: float) -> float:
        """Until when a round opened (or confirmed) at `since` waits for θ_{r-1} to be applied here:
        BASE_WAIT_S; but while θ_{r-1} is committed and this peer is applying it, up to half the
        round's deadline. Applying means fetching the round's mean, which over a WAN link can take
        longer than BASE_WAIT_S: a site that missed one round then sat out every later one too (it
        was applying θ_{r-1} whenever round r opened), in bench_overhead's WAN arm 5.6 s each
        (docs/decisions/rounds-base-wait.md). Half the deadline leaves it time to train and report."""
        if self.applied_round < open_.round - 1 == self.committed_round:
            return since + max(BASE_WAIT_S, open_.deadline_s / 2)
        return since + BASE_WAIT_S

    @staticmethod
    def _budget(open_: RoundOpen) -> float | None:
        """The round's compute budget in seconds, or None when it is not time-boxed."""
        budget = open_.budget_s
        return budget if math.isfinite(budget) and budget > 0 else None

    def _quota(self, open_: RoundOpen) -> int:
        """Samples to take for a round: H x batch; for a time-boxed one, what this site's pace in its
        last boxed round fits in the budget, a quarter to spare and at least one step's worth, and
        one step's worth in its first (a probe of its pace). A slow site that took H x batch would
        start block after block it cannot train in the budget: a started block cannot be stolen, so
        faster sites would idle while it holds them (docs/decisions/rounds-time-boxed-quota.md)."""
        full = self.config.samples_per_round
        budget = self._budget(open_)
        if budget is None:
            return full
        if self._pace is None:
            return min(full, self.config.samples_per_step)
        return max(self.config.samples_per_step, min(full, math.ceil(self._pace * budget * 1.25)))

    def _gather(self, b: _Gathering, now: float) -> list[ev.Effect]:
        quota = self._quota(b.open)
        while b.count < quota:
            new = [r for block, spans in self.client.next_samples(quota - b.count, now)
                   for r in to_ranges(block, spans)]
            if not new:
                break
            b.got.extend(new)
            b.count += sum(r.num_samples for r in new)
            b.quiet_since = now
        if b.count < quota and now < b.quiet_since + self.config.gather_s:
            return []  # more may come with the next Start ack
        rnd = b.open.round
        self.clock.add(rnd, "gather", now - b.since)
        if not b.got:
            self.busy = None
            if isinstance(b.lead, _Ahead):
                return [ev.Note(f"round {rnd}: nothing leased to train ahead of its open")]
            return [ev.Note(f"round {rnd}: no leased sample came within {self.config.gather_s:g} s; "
                            "reporting nothing"), self._report(rnd)]
        ranges = tuple(b.got)
        # Ahead, the trainer goes on from its model and folds θ_{r-1} in when it is applied; if that
        # already happened here, it simply starts from θ_{r-1} (the same as a fold before step one).
        folding = not isinstance(b.lead, _Serial) and self.applied_round < rnd - 1
        self.busy = _Training(b.open, ranges, now, b.lead, Start.BEFORE_BASE if folding else Start.AT_BASE)
        boxed = self._budget(b.open)
        self.clock.computing(now)
        return [ev.Note(f"round {rnd}: training {b.count} leased samples"
                        + (f", time-boxed to {boxed:g} s" if boxed else "")
                        + (", ahead of θ_" + str(rnd - 1) if folding else "")),
                ev.Train(rnd, ranges, b.open.inner_steps, boxed, ahead=folding)]

    def _trained(self, event: ev.TrainDone | ev.TrainFailed, now: float) -> list[ev.Effect]:
        b = self.busy
        if not isinstance(b, _Training | _Overtaken) or b.open.round != event.round:
            return []  # not what this core asked for (cannot happen with one executor)
        rnd = event.round
        failed = isinstance(event, ev.TrainFailed)
        if isinstance(b, _Overtaken) or (not isinstance(b.lead, _Serial) and (
                failed or self.leaving or self.committed_round >= rnd)):
            return self._untrained(b, event)
        failure = event.reason if isinstance(event, ev.TrainFailed) else ""
        notes: list[ev.Effect] = []
        if isinstance(event, ev.TrainDone):
            taken, trained = _by_block(b.ranges), _by_block(event.ranges)
            if any(subtract(spans, taken.get(block, ())) for block, spans in trained.items()):
                failure = "the trainer trained other samples than the leased ones"
            else:
                # A time-boxed round (or a short last batch) ends before every sample taken: those
                # go back on their leases for the next round instead of being claimed.
                left = [r for block, spans in taken.items() for r in to_ranges(block, subtract(spans, trained.get(
                    block, ())))]
                if left:
                    self.client.untake(left)
                    notes.append(ev.Note(f"round {rnd}: {sum(r.num_samples for r in left)} taken samples not "
                                         "reached by the trainer go back on their leases"))
        # Whatever happened, what was trained (or, on failure, taken) is claimed for this round: its
        # commit settles the claims.
        if b.start is not Start.AT_BASE and isinstance(event, ev.TrainDone):
            notes.append(ev.Note(f"round {rnd}: trained ahead; θ_{rnd - 1} folded in after {event.folded_at} of "
                                 f"{event.steps} steps" if event.folded_at is not None else
                                 f"round {rnd}: trained ahead; θ_{rnd - 1} came after all {event.steps} steps"))
        out: list[ev.Effect] = [*notes, *self.client.end_round(rnd, now)]
        if failure:
            # Reported without a pseudo-gradient: the leader excludes it and the round's commit frees
            # the claimed samples (an unreported claim would wait for that).
            self.busy = None
            self.clock.computed(None)
            self.sent = self._report(rnd, b.ranges).contribution
            self._sent_to = b.open.header.from_site
            return out + [ev.Note(f"round {rnd}: training failed ({failure}); reporting the samples without "
                                  "a pseudo-gradient so the commit frees them", warning=True), ev.Report(self.sent)]
        assert isinstance(event, ev.TrainDone)
        if event.seconds > 0:
            pace = sum(r.num_samples for r in event.ranges) / event.seconds
            self.client.trained_at(pace)  # the lease owners compare holders by it at the epoch's tail
            if self._budget(b.open) is not None:
                self._pace = pace
        self.clock.computed(event.seconds)
        self.clock.trained(rnd, event.tokens, event.steps, event.mean_loss)
        self.clock.add(rnd, "publish", now - b.started - event.seconds)
        lead = _Opened(now) if isinstance(b.lead, _Opened) else b.lead  # θ_{r-1} is awaited from here
        claim = _Claiming(b.open, event, now, now + max(b.open.deadline_s, self.claim_wait_s), lead)
        self.busy = claim
        return out + self._claimed(claim, now)

    def _untrained(self, b: _Training | _Overtaken, event: ev.TrainDone | ev.TrainFailed) -> list[ev.Effect]:
        """Trained ahead for a round that went on without this site, or it is leaving, or the trainer
        failed: nothing was claimed or reported yet (its open may not even have come), so every sample
        it took simply goes back on its lease."""
        rnd = event.round
        failed = isinstance(event, ev.TrainFailed)
        self.busy = None
        self.clock.computed(None)  # wasted work: not compute, though closed records may hold part of it
        self.client.untake(list(b.ranges))
        why = (f"training failed ({event.reason})" if isinstance(event, ev.TrainFailed) else "leaving"
               if self.leaving else "it was decided without this site")
        said: list[ev.Effect] = [ev.Note(f"round {rnd}: trained ahead, but {why}; its samples go back on "
                                         "their leases", warning=failed)]
        if failed and isinstance(b, _Training) and isinstance(b.lead, _Opened) and not self.leaving \
                and self.committed_round < rnd:
            # Its open came: the leader waits for this site's report, and without one it waits out the
            # round's deadline. Nothing was claimed: report nothing.
            said.append(self._report(rnd))
        return said

    def _claimed(self, b: _Claiming, now: float) -> list[ev.Effect]:
        rnd = b.open.round
        if self.committed_round >= rnd:
            # Decided while this site trained it (a new leader reopened it, this site was busy, the
            # round closed without it): no voucher can come (the lease client drops the claims of
            # decided rounds) and no leader wants the report; the owners free the samples.
            self.busy = None
            self.clock.add(rnd, "publish", now - b.published)
            return [ev.Note(f"round {rnd}: committed while this site trained it; not reporting, its "
                            "samples go back to free when their leases lapse", warning=True)]
        lead = b.lead
        if not isinstance(lead, _Serial):
            if self.leaving:
                self.busy = None
                return [ev.Note(f"round {rnd}: trained ahead, but leaving: not reporting; its claims are "
                                "freed by the round's commit")]
            if isinstance(lead, _Ahead):
                return []  # its open comes once θ_{r-1} is committed and applied at the leader
            if not self._at_base(b.open):
                if self.applied_round < rnd - 1 and now < self._base_until(b.open, lead.since):
                    return []
                self.busy = None
                return [ev.Note(f"round {rnd}: not at θ_{rnd - 1} (have round {self.applied_round}); the "
                                "round trained ahead is not reported, its claims are freed by the round's commit",
                                warning=True), self._report(rnd)]
        accounted = self.client.offer(rnd)
        if accounted is None and now < b.until:
            return []
        self.busy = None
        self.clock.add(rnd, "publish", now - b.published)
        t = b.trained
        out: list[ev.Effect] = []
        if accounted is None or merge_ranges(accounted.ranges) != merge_ranges(t.ranges):
            why = (self.client.lost_reasons[-1:] or ["no answer from the owners"])[0]
            out.append(ev.Note(f"round {rnd}: not every trained sample was vouched ({why}); the leader will "
                               "exclude this report and free its samples", warning=True))
        vouchers = accounted.vouchers if accounted is not None else ()
        report = self._report(rnd, t.ranges, t.tokens, t.root, vouchers)
        self.sent = report.contribution
        self._sent_to = b.open.header.from_site
        self.clock.reported(rnd, now)
        out += [ev.Note(f"round {rnd}: reporting {self._count(t.ranges)} samples, {t.tokens} tokens, "
                        f"{len(vouchers)} voucher(s)"), report]
        return out + (self._ahead(b.open, now) if self.config.overlap and t.tokens > 0 else [])

    def _leave(self, wait_s: float, now: float) -> list[ev.Effect]:
        """Graceful leave (I8): train no more; give the leader up to `wait_s` to decide a round this
        site reported samples for (it pulls the pseudo-gradient from here), give every lease back at
        its commit, and stay (serving that pseudo-gradient) until the round after it commits: the
        other peers apply the round by fetching it from here, and the next round opens only once the
        leader applied it, so its commit proves θ of this site's last round is held by a peer that
        stays. Leaving at the first commit stranded the run when this site was also the leader (the
        only other holder of θ_r): the whole-peer simulator's `leave` fault found it. A leaving
        leader therefore admits no report of its own (PeerRounds), and a commit of that round
        without this site's report ends the wait at once: nobody will fetch its Δ. When every other
        live member is leaving too (`NobodyStays`), no round after opens (a leaving leader opens
        none): the wait ends once this site holds θ of its round (docs/decisions/rounds-open-resend.md).
        When the run's data is complete no round after opens either: the leader's `RunComplete`
        (sent once it applied the last round) is the proof instead of that round's commit."""
        self.leaving = True
        b = self.busy
        out: list[ev.Effect] = []
        if isinstance(b, _Gathering | _Training | _Overtaken | _Claiming) and not isinstance(b.lead, _Serial):
            if isinstance(b, _Gathering):
                self.busy = None  # nothing trained or claimed yet
                self.client.untake(b.got)
            if isinstance(b.lead, _Opened):
                # Its open came while it trained ahead: the leader waits for this site's report, and
                # would wait out the round's deadline (the leave's wait with it) for one that never
                # comes. (One not opened yet is answered "leaving" when it is.)
                b.lead = _Ahead()
                out += [ev.Note(f"round {b.open.round}: leaving; reporting nothing"), self._report(b.open.round)]
        sent = self._sent_round()
        if self.committed_round <= sent and sent > 0:
            self._leave_until = now + wait_s
            return out + [ev.Note(f"leaving: waiting up to {wait_s:g} s for round {sent}, which holds this "
                                  f"site's samples, and the round after it to be committed")] + self._progress(now)
        return out + self._release(now)

    def _give_back(self, now: float) -> list[ev.Effect]:
        return [ev.Note(f"leaving: giving back {len(self.client.held)} lease(s)"), *self.client.release_all(now)]

    def _release(self, now: float) -> list[ev.Effect]:
        self._leave_until = None
        out: list[ev.Effect] = [] if self.client.leaving else self._give_back(now)
        return out + [ev.LeaveReady()]

    # ----- helpers -------------------------------------------------------------------------------
    def _at_base(self, open_: RoundOpen) -> bool:
        """This site holds θ_{r-1} as the open names it: a Δ of round r is measured from there."""
        return self.applied_round == open_.round - 1 and self.weights_hash == open_.base_weights_hash

    def _sent_round(self) -> int:
        """The round whose commit this site's reported samples wait for (0: none)."""
        return self.sent.round if self.sent is not None and self.sent.tokens > 0 else 0

    def _report(self, round_: int, ranges: tuple[SampleRange, ...] = (), tokens: int = 0, root: bytes = b"",
                vouchers: tuple[Voucher, ...] = ()) -> ev.Report:
        header = Header(SiteId(self.site), self.address, Epoch(0), round_ - 1)
        return ev.Report(Contribution(header, round_, self.site, self.address, tokens, ranges, root, vouchers))

    @staticmethod
    def _count(ranges: tuple[SampleRange, ...]) -> int:
        return sum(r.num_samples for r in ranges)


def _by_block(ranges: tuple[SampleRange, ...]) -> dict[int, Spans]:
    out: dict[int, Spans] = {}
    for r in ranges:
        out[r.block_id] = normalize(out.get(r.block_id, ()) + of_range(r))
    return out
