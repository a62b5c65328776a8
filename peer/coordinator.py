"""Runs DiLoCo outer rounds on a node: the executor of the round protocol's effects.

The decisions are taken by the peer's pure protocol (peer/core/peer_core.py, whose `PeerRounds` holds
the data-lease cores, the leader's `RoundLeader` and this peer's `RoundCore`); the node runs its
effects and hands the rounds' ones here. This file runs them (trainer calls, pseudo-gradient fetches,
θ applies and state transfers in peer/training.py, round and lease sends through the node, the lease
ledger on disk in peer/leasing.py) as tasks and feeds each completion back as an event through the
node; nothing here sleeps or polls or decides. A round, end to end:

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
from collections.abc import Sequence
from typing import TYPE_CHECKING

from peer.core import rounds as r
from peer.core.commitlog import Entry, RoundCommit
from peer.core import events as ev
from peer.core.peer_rounds import Effect, PeerRounds
from peer.core.election import Role, SiteId
from peer.core.lease_types import LeaseEvent, Message as LeaseMessage, Send as LeaseSend
from peer.core.membership_types import LIVE, MemberState
from peer.core.lease_config import LeaseConfig
from peer.heldout import HeldOut
from peer.job_record import JobLog
from peer.leasing import Leasing
from peer.vouching import keys_of
from peer.core.timeline import RoundClock, RoundTimeline
from peer.round_exchange import InvalidContribution, Unavailable
from peer.training import HashMismatch, Outcome, SiteTraining

if TYPE_CHECKING:
    from peer.runtime_view import Runtime

log = logging.getLogger("sitemesh.rounds")


class Coordinator:
    def __init__(self, node: Runtime, training: SiteTraining, config: r.RoundsConfig, leases: LeaseConfig) -> None:
        self.node = node
        self.training = training
        self.config = config
        self.lease_config = leases
        self.leasing: Leasing | None = None
        self.rounds: PeerRounds | None = None
        """This peer's round protocol (read for status; the node's PeerCore drives it); None until start()."""
        self._fetch: asyncio.Task[None] | None = None
        """The leader's pseudo-gradient fetch in flight (a cancelled one is awaited by the next)."""
        self._recompute: asyncio.Future[Outcome] | None = None
        """The running apply's recompute (CancelApply stops it; the apply then feeds nothing)."""
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
        await self.training.start()
        leasing = Leasing(self.node.config.site, dict(self.training.blocks), self.lease_config,
                          self.node.data_dir / "leases", self._send_lease, keys=keys_of(self.node.creds),
                          tokens_per_sample=self.training.trainer_config.data.seq_len)
        # No await from here on: the protocol replays the applied entries to the lease cores now,
        # later ones arrive as commits, so the lease cores see every entry exactly once, in log order.
        rnd, index, committed = self.node.last_round_entry(self.training.applied_index)
        why = self.training.verify_against(index, rnd, committed)
        self.leasing = leasing
        self.rounds = PeerRounds(self.node.config.site, self.node.address, self.config, leasing.cores,
                                 self.lease_config.ttl, self.clock, self.training.applied_round,
                                 self.training.weights_hash)
        # The apply queue re-syncs (a divergence) before it applies what came while the trainer started.
        self.node.attach(self.rounds, ev.Diverged(why) if why else None)
        log.info("leases: boot %d, data epoch %d, %d/%d samples committed", leasing.boot,
                 leasing.ledger.data_epoch, leasing.ledger.committed, leasing.ledger.total)

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

    # ----- from the node's executor ------------------------------------------------------------
    def committed(self, entries: Sequence[Entry]) -> None:
        """Committed log entries: a leader's pull and outer step go on the round's record before
        commit_wait ends (the round protocol's effects of them come next)."""
        for entry in entries:
            if isinstance(entry.body, RoundCommit):
                self._book_spent(entry.body.round)

    def run_leases(self, batch: Sequence[LeaseSend | LeaseEvent]) -> None:
        """A run of lease effects at once: the ledger file is appended once per run."""
        self._leasing().run(batch)

    def _leasing(self) -> Leasing:
        assert self.leasing is not None
        return self.leasing

    def _to_live(self, msg: r.Message) -> None:
        for view in self.node.members():
            if view.state is MemberState.ALIVE:
                self.node.send_round_message(view.address, msg)

    def run(self, effect: Effect) -> None:
        """One of the round protocol's effects; a long one runs as a task that ends in one event."""
        if isinstance(effect, r.Broadcast):
            log.info("round %d open", effect.msg.round)
            self._to_live(effect.msg)
        elif isinstance(effect, r.SendOpen):
            to = self.node.member(effect.site)
            if to is not None and to.state is MemberState.ALIVE:
                log.info("%s", effect.why)
                self.node.send_round_message(to.address, effect.msg)
        elif isinstance(effect, r.EpochComplete):
            log.info("run's data complete: %d data epoch(s), every one of %d samples committed exactly once each",
                     effect.data_epochs, effect.samples)
            self._to_live(effect.msg)
        elif isinstance(effect, ev.SendReport):
            self._send_report(effect)
        elif isinstance(effect, ev.Train):
            self._spawn(self._train(effect))
        elif isinstance(effect, ev.Fold):
            self._spawn(self.training.fold(effect.round))
        elif isinstance(effect, ev.Excluded):
            self.node.events.excluded[effect.kind.value] += 1
        elif isinstance(effect, r.Reported):
            c = effect.contribution
            self.training.exchange.ask_manifest(c.round, c.site, c.address, c.pseudo_gradient_root)
        elif isinstance(effect, ev.Fetch):
            self._fetch = self._spawn(self._outcome(effect, self._fetch))
        elif isinstance(effect, ev.CancelFetch):
            if self._fetch is not None:
                self._fetch.cancel()
        elif isinstance(effect, ev.Apply):
            # Started here, not in the task: a CancelApply right behind this effect must find it.
            self._recompute = asyncio.ensure_future(self.training.recompute(effect.commit, self._addresses()))
            self._spawn(self._apply(effect, self._recompute))
        elif isinstance(effect, ev.CancelApply):
            if self._recompute is not None:
                self._recompute.cancel()
        elif isinstance(effect, ev.CatchUp):
            self._spawn(self._catch_up())
        elif isinstance(effect, ev.RoundApplied):
            log.info("round %d applied: θ %s, %d/%d samples committed", self.training.applied_round,
                     self.training.weights_hash.hex()[:16], self.samples_committed, self.samples_total)
            self._finish_timeline(self.training.applied_round)

    def _spawn(self, coro: object) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self.node.spawn(task)  # the node cancels it at stop
        return task

    def _send_lease(self, site: SiteId, msg: LeaseMessage) -> None:
        if site == self.node.config.site:
            # Own shard: no network hop, but never re-entrantly inside the core that produced it.
            asyncio.get_running_loop().call_soon(self.node.deliver_lease, msg)
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
            self.node.feed(ev.TrainFailed(t.round, f"{type(err).__name__}: {err}"))
            return
        log.info("round %d trained: %d samples, %d tokens, loss %.3f, %.1fs", t.round,
                 sum(x.num_samples for x in trained.ranges), trained.tokens, trained.mean_loss, trained.seconds)
        self.job.trained(trained.seconds, trained.steps)
        self.node.feed(ev.TrainDone(t.round, trained.ranges, trained.tokens, trained.root, trained.seconds,
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
        self.node.feed(event)

    async def _apply(self, a: ev.Apply, recompute: asyncio.Future[Outcome]) -> None:
        event: ev.Event
        try:
            await asyncio.wait([recompute])  # its cancel (CancelApply) must not cancel this task
            if recompute.cancelled():
                return  # the apply queue went on to a state transfer
            await self.training.install(a.index, a.commit, recompute.result())
        except (HashMismatch, InvalidContribution) as err:
            event = ev.ApplyFailed(a.commit.round, "diverged", str(err))
        except Unavailable as err:
            event = ev.ApplyFailed(a.commit.round, "unavailable", str(err))
        except Exception as err:  # noqa: BLE001 - the apply queue retries it
            event = ev.ApplyFailed(a.commit.round, "error", str(err))
        else:
            event = ev.Persisted(a.index, a.commit.round, self.training.weights_hash)
        finally:
            recompute.cancel()  # this task cancelled (the node stops): so is its fetch
        self.node.feed(event)

    async def _catch_up(self) -> None:
        """State transfer of the newest committed round from a peer whose θ hashes as the log says."""
        rnd, index, weights_hash = self.node.last_round_entry()
        event: ev.Event
        try:
            ok = await self.training.catch_up(rnd, index, weights_hash, self._addresses())
        except Exception as err:  # noqa: BLE001 - the apply queue retries it
            event = ev.CatchUpFailed(str(err))
        else:
            event = (ev.Persisted(index, rnd, weights_hash, transfer=True) if ok
                     else ev.CatchUpFailed(f"no live peer served the state of round {rnd}"))
        self.node.feed(event)

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
