"""Runs DiLoCo outer rounds on a node: the effect executor of the round cores.

The decisions are taken by one pure core, `PeerRounds` (peer/core/peer_rounds.py: the data-lease
cores, the leader's `RoundLeader` and this peer's `RoundCore`, with the routing between them that the
whole-peer simulator runs too). This file runs its effects (trainer calls, pseudo-gradient fetches, θ
applies and state transfers in peer/training.py, round and lease sends through the node, the lease
ledger on disk in peer/leasing.py) as tasks and feeds each completion back as an event; nothing here
sleeps or polls or decides. A round, end to end:

1. The leader opens round r once r-1 is committed and applied here.
2. Each site takes up to H x batch samples from its started, valid data leases, trains them from
   θ_{r-1} in its trainer process, publishes Δ in its exchange store, claims the samples from their
   lease owners for round r and sends the leader a Contribution with the owners' vouchers.
3. The leader admits contributions (I6), pulls and averages the admitted ones, applies the outer
   step and proposes RoundCommit(r, contributors, hash θ_r) to the log.
4. Every peer applies each committed round in log order: folds its samples into the lease ledger,
   pulls the contributors' Δ, recomputes θ_r, checks the hash (I7), persists it.

A site whose lease was lost while it trained (reclaimed after a pause, stolen) still reports what it
trained, without the missing vouchers: the leader excludes it, and the commit frees its claims.
In 3, a contributor whose pseudo-gradient cannot be fetched is dropped (peer/core/decision.py); a
failure no single site is to blame for commits the round without contributors: nothing is lost,
its samples go back to free and are leased again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from peer.core import rounds as r
from peer.core.commitlog import Entry, RoundCommit
from peer.core import events as ev
from peer.core.peer_rounds import Effect, PeerRounds, Seen
from peer.core.election import Role, SiteId
from peer.core.lease_types import LeaseEvent, Message as LeaseMessage, Send as LeaseSend
from peer.core.membership import LEAVING
from peer.core.membership_types import MemberState
from peer.core.lease_config import LeaseConfig
from peer.heldout import HeldOut
from peer.job_record import JobLog
from peer.leasing import Leasing
from peer.vouching import keys_of
from peer.core.timeline import RoundClock, RoundTimeline
from peer.round_exchange import InvalidContribution, Unavailable
from peer.training import HashMismatch, SiteTraining

if TYPE_CHECKING:
    from peer.runtime_view import Runtime

log = logging.getLogger("sitemesh.rounds")

LIVE = (MemberState.ALIVE, MemberState.SUSPECT)


class Coordinator:
    def __init__(self, node: Runtime, training: SiteTraining, config: r.RoundsConfig, leases: LeaseConfig) -> None:
        self.node = node
        self.training = training
        self.config = config
        self.lease_config = leases
        self.leasing: Leasing | None = None
        self.rounds: PeerRounds | None = None
        """This peer's round protocol (peer/core/peer_rounds.py); None until start()."""
        self._effects: deque[Effect] = deque()
        self._pending: list[ev.Event] = []
        """Events that came before start() (commits while the trainer started), fed at its end."""
        self._draining = False
        self._fetch: asyncio.Task[None] | None = None
        """The leader's pseudo-gradient fetch in flight (a cancelled one is awaited by the next)."""
        self._left: asyncio.Future[None] | None = None
        """Resolved when a graceful leave's round work is done (LeaveReady)."""
        self.last_timeline: RoundTimeline | None = None
        """Where this site's time went in the last round it finished (also in timeline.jsonl)."""
        self.clock = RoundClock(node.config.site, node.now())
        """Books this site's seconds to round phases; a record per applied round (peer/core/timeline.py)."""
        training.clock = node.now
        self.heldout = HeldOut(node.data_dir, training.outer.eval_every, self._spawn)
        """Writes the records in round order, the leader's with θ's held-out perplexity (peer/heldout.py)."""
        self.job = JobLog(node.data_dir, node.config.site)
        """When this job began, trained and ended, for the run's accounting (peer/job_record.py)."""

    async def start(self) -> None:
        self.job.started()  # first: a job whose trainer never starts still cost its allocation
        await self.training.start()
        raft = self.node.consensus_core()
        leasing = Leasing(self.node.config.site, dict(self.training.blocks), self.lease_config,
                          self.node.data_dir / "leases", self._send_lease, keys=keys_of(self.node.creds),
                          tokens_per_sample=self.training.trainer_config.data.seq_len)
        # No await from here on: entries up to applied_index are replayed now, later ones arrive
        # through on_entries, so the lease cores see every entry exactly once, in log order.
        now = self.node.now()
        leasing.note_leader_epoch(raft.hard.epoch)
        replayed = [raft.log.entry(i) for i in range(raft.log.snapshot.last_index + 1, raft.applied_index + 1)]
        rnd, index, committed = raft.log.last_round_entry(self.training.applied_index)
        why = self.training.verify_against(index, rnd, committed)
        self.leasing = leasing
        self.rounds = PeerRounds(self.node.config.site, self.node.address, self.config, leasing.cores,
                                 self.lease_config.ttl, self.clock, self.training.applied_round,
                                 self.training.weights_hash)
        self._run_all(self.rounds.replay([e for e in replayed if e is not None], now))
        log.info("leases: boot %d, data epoch %d, %d/%d samples committed", leasing.boot,
                 leasing.ledger.data_epoch, leasing.ledger.committed, leasing.ledger.total)
        if why:  # the apply queue re-syncs before it applies anything else
            self._pending.insert(0, ev.Diverged(why))
        pending, self._pending = self._pending, []
        for event in pending:  # what was committed while the trainer started
            self._feed(event)

    async def close(self) -> None:
        """The peer stops: the job's exit goes on record, then the trainer and the bulk listener close."""
        self.job.exited()
        await self.training.close()

    # ----- status ------------------------------------------------------------------------------
    @property
    def samples_total(self) -> int:
        """Samples the run trains: every sample once per data epoch."""
        return self.leasing.ledger.total * self.config.data_epochs if self.leasing else 0

    @property
    def samples_committed(self) -> int:
        if self.leasing is None:
            return 0
        ledger = self.leasing.ledger
        return ledger.data_epoch * ledger.total + ledger.committed

    @property
    def epoch_complete(self) -> bool:
        """The log completed every data epoch of the run."""
        return self.rounds is not None and self.rounds.leader.done

    @property
    def diverged(self) -> str:
        """The last I7 violation this peer found (its θ disagreed with the log) and whether the
        state transfer that repairs it is done; empty if θ never disagreed."""
        return self.rounds.core.applier.diverged if self.rounds is not None else ""

    @property
    def last_reason(self) -> str:
        """The round core's last decision and its reason (why a round was skipped, a site excluded)."""
        return self.rounds.core.last_reason if self.rounds is not None else ""

    def next_deadline(self) -> float:
        """When `tick` next has something to do on its own (node-clock seconds; -inf: now; inf: on
        events only). The node ticks after every event too."""
        return self.rounds.next_deadline(self._seen()) if self.rounds is not None else float("inf")

    def _seen(self) -> Seen:
        """What consensus, membership and the trainer's state say now."""
        status = self.node.consensus_status()
        members = [v for v in self.node.members() if v.state in LIVE]
        live = frozenset(v.site for v in members)
        leaving = frozenset(v.site for v in members if v.meta is not None and LEAVING in v.meta.labels)
        return Seen(status.role is Role.LEADER, status.epoch, status.committed_round, self.training.applied_round,
                    self.training.weights_hash, live, leaving, status.leader)

    # ----- from the node -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if self.rounds is not None:
            self._run_all(self.rounds.tick(now, self._seen()))

    def on_leader_changed(self, leader: str | None, epoch: int) -> None:
        if self.rounds is not None:
            self.rounds.leader_changed(leader, epoch)

    def on_entries(self, entries: Sequence[Entry]) -> None:
        """Committed log entries, in order: the lease ledger and views at once, θ by the apply queue."""
        for entry in entries:
            if isinstance(entry.body, RoundCommit):
                self._book_spent(entry.body.round)  # a leader's pull and outer step, before commit_wait ends
        if self.rounds is None:
            # Before start(): the lease cores replay these from the log there; the round core gets them then.
            self._pending += [ev.Committed(e.index, e.body) for e in entries if isinstance(e.body, RoundCommit)]
            return
        self._run_all(self.rounds.entries(entries, self.node.now(), self._seen()))

    def receive(self, msg: r.Message) -> None:
        if self.rounds is not None:
            self._run_all(self.rounds.round_message(msg, self.node.now(), self._seen()))

    def member_down(self, site: str) -> None:
        """Membership declared `site` DEAD or LEFT (PeerRounds.member_down)."""
        if self.rounds is not None:
            self._run_all(self.rounds.member_down(site, self.node.now(), self._seen()))

    def member_up(self, site: str) -> None:
        """Membership saw `site` come (back) up: ALIVE again, or a new process (PeerRounds.member_up)."""
        if self.rounds is not None:
            self._run_all(self.rounds.member_up(site, self.node.now(), self._seen()))

    def receive_lease(self, msg: LeaseMessage) -> None:
        if self.rounds is not None:
            self._run_all(self.rounds.lease_message(msg, self.node.now(), self._seen()))

    async def prepare_leave(self, wait_s: float) -> None:
        """Graceful leave (I8): train no more, give the leader up to `wait_s` to decide a round this
        site already reported samples for (it pulls the pseudo-gradient from here), then give every
        lease back to its owner. Returns once the core says so (LeaveReady)."""
        if self.rounds is None:
            return
        self._left = asyncio.get_running_loop().create_future()
        self._feed(ev.LeaveRequested(wait_s))
        await self._left

    # ----- the executor ------------------------------------------------------------------------
    def _feed(self, event: ev.Event) -> None:
        """Hands `event` (a completion, a leave) to the round protocol and runs its effects."""
        if self.rounds is None:
            self._pending.append(event)
            return
        self._run_all(self.rounds.handle(event, self.node.now(), self._seen()))

    def _run_all(self, effects: Sequence[Effect]) -> None:
        """Runs `effects` in order. What running one makes the core say (a proposal that commits at
        once) queues behind the rest, so effects run in the order the core produced them."""
        self._effects.extend(effects)
        if self._draining:
            return
        self._draining = True
        try:
            while self._effects:
                effect = self._effects.popleft()
                if isinstance(effect, LeaseSend | LeaseEvent):
                    # A run of lease effects at once: the ledger file is appended once per run.
                    batch: list[LeaseSend | LeaseEvent] = [effect]
                    while self._effects and isinstance(nxt := self._effects[0], LeaseSend | LeaseEvent):
                        batch.append(nxt)
                        self._effects.popleft()
                    self._leasing().run(batch)
                else:
                    self._run(effect)
        finally:
            self._draining = False
        self.node.wake()  # the core's next deadline may have moved

    def _leasing(self) -> Leasing:
        assert self.leasing is not None
        return self.leasing

    def _run(self, effect: Effect) -> None:
        assert self.rounds is not None
        if isinstance(effect, ev.Note):
            log.log(logging.WARNING if effect.warning else logging.INFO, "%s", effect.text)
        elif isinstance(effect, r.Broadcast):
            log.info("round %d open", effect.msg.round)
            for view in self.node.members():
                if view.state is MemberState.ALIVE:
                    self.node.send_round_message(view.address, effect.msg)
        elif isinstance(effect, r.SendOpen):
            to = self.node.member(effect.site)
            if to is not None and to.state is MemberState.ALIVE:
                log.info("%s", effect.why)
                self.node.send_round_message(to.address, effect.msg)
        elif isinstance(effect, r.EpochComplete):
            log.info("run's data complete: %d data epoch(s), every one of %d samples committed exactly once each",
                     effect.data_epochs, effect.samples)
        elif isinstance(effect, ev.SendReport):
            self._send_report(effect)
        elif isinstance(effect, ev.Train):
            self._spawn(self._train(effect))
        elif isinstance(effect, ev.Fold):
            self._spawn(self.training.fold(effect.round))
        elif isinstance(effect, ev.Excluded):
            self.node.events.excluded[effect.kind.value] += 1
        elif isinstance(effect, ev.Fetch):
            self._fetch = self._spawn(self._outcome(effect, self._fetch))
        elif isinstance(effect, ev.CancelFetch):
            if self._fetch is not None:
                self._fetch.cancel()
        elif isinstance(effect, ev.Propose):
            self.rounds.proposed(self.node.propose(effect.commit))
        elif isinstance(effect, ev.Apply):
            self._spawn(self._apply(effect))
        elif isinstance(effect, ev.CatchUp):
            self._spawn(self._catch_up())
        elif isinstance(effect, ev.RoundApplied):
            log.info("round %d applied: θ %s, %d/%d samples committed", self.training.applied_round,
                     self.training.weights_hash.hex()[:16], self.samples_committed, self.samples_total)
            self._finish_timeline(self.training.applied_round)
        elif isinstance(effect, ev.LeaveReady):
            if self._left is not None and not self._left.done():
                self._left.set_result(None)

    def _spawn(self, coro: object) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self.node.spawn(task)  # the node cancels it at stop
        return task

    def _send_lease(self, site: SiteId, msg: LeaseMessage) -> None:
        if site == self.node.config.site:
            # Own shard: no network hop, but never re-entrantly inside the core that produced it.
            asyncio.get_running_loop().call_soon(self.receive_lease, msg)
            return
        view = self.node.member(site)
        if view is not None and view.state in LIVE:
            self.node.send_lease_message(view.address, msg)

    def _send_report(self, effect: ev.SendReport) -> None:
        report = effect.contribution
        leader = self.node.member(effect.leader) if effect.leader is not None else None
        if leader is None:
            log.info("round %d: no leader known; the report waits for the next open", report.round)
            return
        log.info("round %d: reported %d samples, %d tokens to %s", report.round,
                 sum(x.num_samples for x in report.ranges), report.tokens, leader.site)
        self.node.send_round_message(leader.address, report)

    def _addresses(self) -> dict[str, str]:
        return {v.site: v.address for v in self.node.members() if v.state is MemberState.ALIVE}

    # ----- long effects: each ends in one completion event -------------------------------------
    async def _train(self, t: ev.Train) -> None:
        try:
            trained = await self.training.train(t.round, t.ranges, t.inner_steps, t.budget_s, t.ahead)
        except Exception as err:  # a failed round costs this site its contribution, never the peer
            log.exception("round %d: training failed", t.round)
            self._feed(ev.TrainFailed(t.round, f"{type(err).__name__}: {err}"))
            return
        log.info("round %d trained: %d samples, %d tokens, loss %.3f, %.1fs", t.round,
                 sum(x.num_samples for x in trained.ranges), trained.tokens, trained.mean_loss, trained.seconds)
        self.job.trained(trained.seconds, trained.steps)
        self._feed(ev.TrainDone(t.round, trained.ranges, trained.tokens, trained.root, trained.seconds,
                                trained.steps, trained.mean_loss, trained.folded_at))

    async def _outcome(self, f: ev.Fetch, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:  # a cancelled fetch unwinds before the next one starts
            await asyncio.gather(previous, return_exceptions=True)
        event: ev.Event
        try:
            outcome = await self.training.outcome(
                f.round, [(c.site, c.address, c.pseudo_gradient_root, c.tokens) for c in f.admitted])
        except InvalidContribution as err:
            event = ev.OutcomeFailed(f.round, f.attempt, err.site, str(err))
        except Unavailable as err:
            event = ev.OutcomeFailed(f.round, f.attempt, err.site,
                                     f"{err.site}'s pseudo-gradient cannot be fetched ({err}); deciding without it")
        except Exception as err:  # noqa: BLE001 - the core commits the round empty: nothing is lost
            event = ev.OutcomeFailed(f.round, f.attempt, "", str(err))
        else:
            event = ev.OutcomeReady(f.round, f.attempt, outcome.weights_hash)
        self._feed(event)

    async def _apply(self, a: ev.Apply) -> None:
        event: ev.Event
        try:
            await self.training.apply(a.index, a.commit, self._addresses())
        except (HashMismatch, InvalidContribution) as err:
            event = ev.ApplyFailed(a.commit.round, "diverged", str(err))
        except Unavailable as err:
            event = ev.ApplyFailed(a.commit.round, "unavailable", str(err))
        except Exception as err:  # noqa: BLE001 - the apply queue retries it
            event = ev.ApplyFailed(a.commit.round, "error", str(err))
        else:
            event = ev.Persisted(a.index, a.commit.round, self.training.weights_hash)
        self._feed(event)

    async def _catch_up(self) -> None:
        """State transfer of the newest committed round from a peer whose θ hashes as the log says."""
        status = self.node.consensus_status()
        rnd, index, weights_hash = self.node.consensus_core().log.last_round_entry(status.commit_index)
        event: ev.Event
        try:
            ok = await self.training.catch_up(rnd, index, weights_hash, self._addresses())
        except Exception as err:  # noqa: BLE001 - the apply queue retries it
            event = ev.CatchUpFailed(str(err))
        else:
            event = (ev.Persisted(index, rnd, weights_hash, transfer=True) if ok
                     else ev.CatchUpFailed(f"no live peer served the state of round {rnd}"))
        self._feed(event)

    # ----- the timeline ------------------------------------------------------------------------
    def _book_spent(self, round_: int) -> None:
        for phase, seconds in self.training.take_spent().items():
            self.clock.add(round_, phase, seconds)

    def _finish_timeline(self, round_: int) -> None:
        """Closes this site's record of `round_` (θ_round applied): status now; timeline.jsonl and
        TensorBoard once θ_round's held-out evaluation, if this peer makes one, is done."""
        self._book_spent(round_)
        tokens = self.samples_committed * self.training.trainer_config.data.seq_len
        record = self.clock.finish(round_, self.node.now(), committed_tokens=tokens)
        self.last_timeline = record
        theta = self.training.weights  # θ_round: bound now, evaluated once the trainer is free
        due = self.heldout.due(round_, self.node.consensus_status().role is Role.LEADER, self.epoch_complete)
        self.heldout.closed(record, (lambda: self.training.evaluate(theta)) if due else None)
