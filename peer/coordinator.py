"""Runs DiLoCo outer rounds on a node: the leader opens and decides, every site leases, trains, applies.

Glue between parts that know nothing of each other: the round core (peer/rounds.py), the data-lease
cores (peer/leasing.py), the consensus core (peer/consensus.py, through the node) and the training
edge (peer/training.py). A round, end to end:

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
A failure in 3 (a contributor's pseudo-gradient cannot be fetched) commits the round without any
contributor: nothing is lost, its samples go back to free and are leased again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from peer import rounds as r
from peer import timeline
from peer.commitlog import Contributor, Entry, Round, RoundCommit
from peer.election import Epoch, Header, Role, SiteId
from peer.lease_types import Message as LeaseMessage, Voucher
from peer.leases import LeaseConfig
from peer.leasing import Leasing
from peer.metrics import exclusion_kind
from peer.samples import SampleRange
from peer.timeline import RoundClock, RoundTimeline
from peer.trainer.blocks import merge_ranges
from peer.training import HashMismatch, InvalidContribution, Outcome, SiteTraining, Unavailable

if TYPE_CHECKING:
    from peer.node import Node

log = logging.getLogger("sitemesh.rounds")

LIVE = ("ALIVE", "SUSPECT")


class _ContributorDown(Exception):
    """An admitted contributor was declared dead while the leader fetched the round."""

    def __init__(self, site: str) -> None:
        super().__init__(site)
        self.site = site


class Coordinator:
    def __init__(self, node: Node, training: SiteTraining, config: r.RoundsConfig, leases: LeaseConfig) -> None:
        self.node = node
        self.training = training
        self.config = config
        self.lease_config = leases
        self.leasing: Leasing | None = None
        self.leader: r.RoundLeader | None = None
        self._applies: asyncio.Queue[tuple[int, RoundCommit]] = asyncio.Queue()
        self._busy = False
        self._deciding = False
        self._sent: r.Contribution | None = None
        """This site's last report with samples, kept to answer a reopened round without retraining."""
        self.diverged = ""
        """The last I7 violation this peer found (its θ disagreed with the log) and whether the
        state transfer that repairs it is done; empty if θ never disagreed."""
        self.leaving = False
        """Set by a graceful leave: the site reports nothing more and trains no more."""
        self._resync = False
        """This peer's θ disagrees with the log: the apply loop installs a peer's state first."""
        self._down_changed: asyncio.Event | None = None
        """Set by member_down while the leader fetches a round's pseudo-gradients."""
        self.last_timeline: RoundTimeline | None = None
        """Where this site's time went in the last round it finished (also in timeline.jsonl)."""
        self.clock = RoundClock(node.config.site, node.now())
        """Books this site's seconds to round phases; a record per applied round (peer/timeline.py)."""
        training.clock = node.now

    async def start(self) -> None:
        await self.training.start()
        raft = self.node.consensus_core()
        leasing = Leasing(self.node.config.site, dict(self.training.blocks), self.lease_config,
                          self.node.data_dir / "leases", self._send_lease)
        # No await from here on: entries up to applied_index are replayed now, later ones arrive
        # through on_entries, so the lease cores see every entry exactly once, in log order.
        now = self.node.now()
        leasing.note_leader_epoch(raft.hard.epoch)
        replayed = [raft.log.entry(i) for i in range(raft.log.snapshot.last_index + 1, raft.applied_index + 1)]
        leasing.apply_entries([e for e in replayed if e is not None], now)
        rnd, index, committed = raft.log.last_round_entry(self.training.applied_index)
        why = self.training.verify_against(index, rnd, committed)
        if why:
            self._diverge(why)  # the apply loop re-syncs before it applies anything else
        self.leasing = leasing
        self.leader = r.RoundLeader(self.config, leasing.ledger)
        log.info("leases: boot %d, data epoch %d, %d/%d samples committed", leasing.boot,
                 leasing.ledger.data_epoch, leasing.ledger.committed, leasing.ledger.total)
        self.node.spawn(self._apply_loop())

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
        return self.leader is not None and self.leader.done

    # ----- from the node -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if self.leasing is None or self.leader is None:
            return
        if self.leader.done:
            self.leasing.release_all(now)  # nothing left to train: lease no more
        self.leasing.tick(now)
        raft = self.node.consensus_core()
        if raft.role is not Role.LEADER or self._deciding:
            return
        status = raft.status()
        if self.training.applied_round != status.committed_round or not self._applies.empty():
            return  # θ_{r-1} must be ours before we open r
        live = [v.site for v in self.node.members() if v.state.name in LIVE]
        header = Header(SiteId(self.node.config.site), self.node.address, status.epoch, status.committed_round)
        for effect in self.leader.tick(now, header, status.committed_round, live, self.training.weights_hash):
            self._run(effect)

    def on_leader_changed(self, leader: str | None, epoch: int) -> None:
        if self.leasing is not None:
            self.leasing.note_leader_epoch(epoch)
        if leader != self.node.config.site and self.leader is not None:
            self.leader.step_down()

    def on_entries(self, entries: Sequence[Entry]) -> None:
        """Committed log entries, in order: the lease ledger and views at once, θ by the apply loop."""
        if self.leasing is not None:
            self.leasing.apply_entries(entries, self.node.now())
        for entry in entries:
            if isinstance(entry.body, RoundCommit):
                if self.leader is not None:
                    self.leader.on_commit(entry.body.round)
                self._book_spent(entry.body.round)  # a leader's pull and outer step, before commit_wait ends
                self.clock.committed(entry.body.round, self.node.now())
                self._applies.put_nowait((entry.index, entry.body))

    def receive(self, msg: r.Message) -> None:
        raft = self.node.consensus_core()
        if msg.header.epoch < raft.hard.epoch:
            log.info("refused %s of round %d from %s: stale epoch %d < %d", type(msg).__name__, msg.round,
                     msg.header.from_site, msg.header.epoch, raft.hard.epoch)
            return
        if isinstance(msg, r.RoundOpen):
            self._on_open(msg)
        elif self.leader is not None and raft.role is Role.LEADER:
            for effect in self.leader.receive(msg, self.node.now()):
                self._run(effect)

    def member_down(self, site: str) -> None:
        """Membership declared `site` DEAD or LEFT: the open round stops waiting for it, and a
        decision that is fetching its pseudo-gradient drops it at once instead of retrying."""
        if self.leader is not None and self.node.consensus_core().role is Role.LEADER:
            for effect in self.leader.member_down(site, self.node.now()):
                self._run(effect)
        if self._down_changed is not None:
            self._down_changed.set()

    def _live(self, site: str) -> bool:
        view = self.node.member(site)
        return view is not None and view.state.name in LIVE

    def receive_lease(self, msg: LeaseMessage) -> None:
        if self.leasing is not None:
            self.leasing.receive(msg, self.node.now())

    async def prepare_leave(self, wait_s: float) -> None:
        """Graceful leave (I8): train no more, give the leader up to `wait_s` to decide a round this
        site already reported samples for (it pulls the pseudo-gradient from here), then give every
        lease back to its owner."""
        self.leaving = True
        sent = self._sent
        if sent is not None and sent.tokens > 0:
            deadline = self.node.now() + wait_s
            while self.node.consensus_core().status().committed_round < sent.round and self.node.now() < deadline:
                await asyncio.sleep(0.05)
        if self.leasing is not None:
            log.info("leaving: giving back %d lease(s)", self.leasing.held)
            self.leasing.release_all(self.node.now())

    # ----- internals ---------------------------------------------------------------------------
    def _send_lease(self, site: SiteId, msg: LeaseMessage) -> None:
        if site == self.node.config.site:
            # Own shard: no network hop, but never re-entrantly inside the core that produced it.
            asyncio.get_running_loop().call_soon(self.receive_lease, msg)
            return
        view = self.node.member(site)
        if view is not None and view.state.name in LIVE:
            self.node.send_lease_message(view.address, msg)

    def _run(self, effect: r.Effect) -> None:
        if isinstance(effect, r.Broadcast):
            log.info("round %d open", effect.msg.round)
            for view in self.node.members():
                if view.state.name == "ALIVE":
                    self.node.send_round_message(view.address, effect.msg)
        elif isinstance(effect, r.Decide):
            self._deciding = True
            self.node.spawn(self._decide(effect))
        elif isinstance(effect, r.EpochComplete):
            log.info("run's data complete: %d data epoch(s), every one of %d samples committed exactly once each",
                     effect.data_epochs, effect.samples)

    def _on_open(self, msg: r.RoundOpen) -> None:
        sent = self._sent
        if sent is not None and sent.round == msg.round:
            # A new leader (or the same one after an idle close) reopened a round we already trained
            # from the same θ: the vouchers are for this round, so the report stands as it is.
            self._contribute(sent)
            return
        if self._busy or self.leaving:
            log.info("round %d: %s; reporting nothing", msg.round, "leaving" if self.leaving else "still training")
            self._contribute(self._report(msg.round, (), 0, b""))
            return
        self._busy = True
        self.node.spawn(self._train(msg))

    async def _train(self, msg: r.RoundOpen) -> None:
        try:
            # θ_{r-1} may still be being applied here (its commit raced the open): wait briefly.
            for _ in range(100):
                if self.training.applied_round >= msg.round - 1 and self._applies.empty():
                    break
                await asyncio.sleep(0.05)
            if self.training.applied_round != msg.round - 1 or self.training.weights_hash != msg.base_weights_hash:
                log.warning("round %d: not at θ_%d (have round %d), not contributing", msg.round, msg.round - 1,
                            self.training.applied_round)
                self._contribute(self._report(msg.round, (), 0, b""))
                return
            gather_from = self.node.now()
            ranges = await self._gather(self.config.samples_per_round)
            self.clock.add(msg.round, "gather", self.node.now() - gather_from)
            report = self._report(msg.round, ranges, 0, b"")
            if ranges:
                try:
                    report = await self._train_ranges(msg, ranges)
                except Exception:  # a failed round costs this site its contribution, never the peer
                    # Reported without a pseudo-gradient: the leader excludes it and the round's
                    # commit frees the claimed samples (an unreported claim would wait for that).
                    log.exception("round %d: training failed", msg.round)
                self._sent = report
            self._contribute(report)
            if report.tokens > 0:
                self.clock.reported(msg.round, self.node.now())
        finally:
            self._busy = False

    async def _gather(self, quota: int) -> tuple[SampleRange, ...]:
        """Samples of started, valid leases, up to `quota`; stops early when none came for gather_s
        (the client starts the next leased block only when the current one is used up)."""
        assert self.leasing is not None
        got: list[SampleRange] = []
        n, quiet_since = 0, self.node.now()
        while n < quota and self.node.now() - quiet_since < self.config.gather_s:
            new = self.leasing.take(quota - n, self.node.now())
            if new:
                got.extend(new)
                n += sum(x.num_samples for x in new)
                quiet_since = self.node.now()
                continue
            await asyncio.sleep(0.02)
        return tuple(got)

    async def _train_ranges(self, msg: r.RoundOpen, ranges: tuple[SampleRange, ...]) -> r.Contribution:
        """Train `ranges`, claim them from their owners, and build the report (vouchers included)."""
        assert self.leasing is not None
        started = self.node.now()
        try:
            trained = await self.training.train(msg.round, ranges, msg.inner_steps)
        finally:
            # Whatever happened, what was taken is claimed for this round: the round's commit
            # settles the claims (admitted: committed; otherwise: free again).
            self.leasing.end_round(msg.round, self.node.now())
        log.info("round %d trained: %d samples, %d tokens, loss %.3f, %.1fs", msg.round,
                 sum(x.num_samples for x in trained.ranges), trained.tokens, trained.mean_loss, trained.seconds)
        # Inner steps are what the trainer timed; the rest of train() is encoding and publishing Δ.
        self.clock.add(msg.round, "compute", trained.seconds)
        self.clock.trained(msg.round, trained.tokens, trained.steps, trained.mean_loss)
        published = self.node.now()
        self.clock.add(msg.round, "publish", published - started - trained.seconds)
        if merge_ranges(trained.ranges) != merge_ranges(ranges):
            raise RuntimeError(f"round {msg.round}: the trainer trained other samples than the leased ones")
        deadline = self.node.now() + max(msg.deadline_s, self.lease_config.ttl)
        while (accounted := self.leasing.client.contribution(msg.round)) is None and self.node.now() < deadline:
            await asyncio.sleep(0.02)
        vouchers = accounted.vouchers if accounted is not None else ()
        self.clock.add(msg.round, "publish", self.node.now() - published)
        if accounted is None or merge_ranges(accounted.ranges) != merge_ranges(trained.ranges):
            why = self.leasing.client.lost_reasons[-1:] or ["no answer from the owners"]
            log.warning("round %d: not every trained sample was vouched (%s); the leader will exclude this "
                        "report and free its samples", msg.round, why[0])
        return self._report(msg.round, trained.ranges, trained.tokens, trained.root, vouchers)

    def _report(self, round_: int, ranges: tuple[SampleRange, ...], tokens: int, root: bytes,
                vouchers: tuple[Voucher, ...] = ()) -> r.Contribution:
        header = Header(SiteId(self.node.config.site), self.node.address, Epoch(0), round_ - 1)
        return r.Contribution(header, round_, self.node.config.site, self.node.address, tokens, ranges, root, vouchers)

    def _contribute(self, report: r.Contribution) -> None:
        """Tells the current leader: it may have changed while we trained (a successor reopens the
        same round)."""
        raft = self.node.consensus_core()
        leader = self.node.member(raft.leader) if raft.leader else None
        if leader is None:
            log.info("round %d: no leader known; the report waits for the next open", report.round)
            return
        header = replace(report.header, epoch=raft.hard.epoch)
        log.info("round %d: reported %d samples, %d tokens to %s", report.round,
                 sum(x.num_samples for x in report.ranges), report.tokens, leader.site)
        self.node.send_round_message(leader.address, replace(report, header=header))

    async def _decide(self, decide: r.Decide) -> None:
        try:
            for site, reason in decide.excluded:
                log.info("round %d: %s: %s", decide.round, site, reason)
                self.node.events.excluded[exclusion_kind(reason)] += 1
            admitted = list(decide.admitted)
            self._down_changed = asyncio.Event()
            while True:
                try:
                    outcome = await self._outcome_unless_down(decide.round, admitted)
                    break
                except _ContributorDown as err:
                    log.warning("round %d: %s: excluded: %s is dead (membership); deciding without it at once",
                                decide.round, err.site, err.site)
                    admitted = [c for c in admitted if c.site != err.site]
                except InvalidContribution as err:
                    log.warning("round %d: excluded: %s", decide.round, err)
                    admitted = [c for c in admitted if c.site != err.site]
                except Unavailable as err:
                    # A contributor that went away (crash, leave) costs only its own samples, which
                    # the commit frees; the others' work stands.
                    log.warning("round %d: %s: excluded: %s's pseudo-gradient cannot be fetched (%s); deciding "
                                "without it", decide.round, err.site, err.site, err)
                    admitted = [c for c in admitted if c.site != err.site]
                except Exception as err:
                    log.warning("round %d: could not pull every pseudo-gradient (%s); committing it empty",
                                decide.round, err)
                    admitted = []
            commit = RoundCommit(Round(decide.round), tuple(
                Contributor(SiteId(c.site), c.tokens, c.ranges, c.pseudo_gradient_root) for c in admitted),
                outcome.weights_hash)
            if not self.node.propose(commit) and self.leader is not None:
                self.leader.step_down()
        finally:
            self._deciding = False
            self._down_changed = None

    async def _outcome_unless_down(self, round_: int, admitted: Sequence[r.Contribution]) -> Outcome:
        """The round's outcome from `admitted`; raises _ContributorDown as soon as membership declares
        one of them dead, instead of letting the fetch retry a dead peer up to its deadline."""
        assert self._down_changed is not None
        fetch = asyncio.ensure_future(self.training.outcome(
            round_, [(c.site, c.address, c.pseudo_gradient_root, c.tokens) for c in admitted]))
        try:
            while True:
                down = sorted(c.site for c in admitted if not self._live(c.site))
                if down:
                    raise _ContributorDown(down[0])
                self._down_changed.clear()
                changed = asyncio.ensure_future(self._down_changed.wait())
                await asyncio.wait({fetch, changed}, return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                if fetch.done():
                    return fetch.result()
        finally:
            if not fetch.done():
                fetch.cancel()
                await asyncio.gather(fetch, return_exceptions=True)

    def _diverge(self, why: str) -> None:
        self.diverged = f"{why}; re-syncing by state transfer"
        self._resync = True
        log.error("θ diverged from the log: %s", self.diverged)

    async def _catch_up(self, addresses: dict[str, str]) -> bool:
        """State transfer of the newest committed round from a peer whose θ hashes as the log says."""
        raft = self.node.consensus_core()
        rnd, rnd_index, weights_hash = raft.log.last_round_entry(raft.commit_index)
        if not await self.training.catch_up(rnd, rnd_index, weights_hash, addresses):
            return False
        if self._resync:
            self._resync = False
            self.diverged = self.diverged.replace("re-syncing", f"re-synced to round {rnd}")
            log.warning("θ re-synced: %s", self.diverged)
        return True

    async def _apply_loop(self) -> None:
        """Applies committed rounds strictly in log order. A pseudo-gradient nobody serves any more
        (this peer fell behind) is replaced by a state transfer of the newest committed round; so is
        this peer's θ when its hash disagrees with the log (I7: a bug or a memory or disk error
        here), with the reason in `diverged`; other failures are retried."""
        while True:
            if self._resync:
                index, commit = 0, None
            else:
                index, commit = await self._applies.get()
                self._applies.task_done()
                if commit.round <= self.training.applied_round:
                    continue  # covered by a state transfer
            for attempt in range(1, 1_000_000):
                addresses = {v.site: v.address for v in self.node.members() if v.state.name == "ALIVE"}
                try:
                    if self._resync:
                        if await self._catch_up(addresses):
                            break
                    elif commit is not None:
                        await self.training.apply(index, commit, addresses)
                        break
                except (HashMismatch, InvalidContribution) as err:
                    self._diverge(str(err))
                    continue  # at once: the θ we hold is wrong, retrying the same round cannot help
                except Unavailable as err:
                    log.info("%s; catching up by state transfer", err)
                    if await self._catch_up(addresses):
                        break
                except Exception as err:  # noqa: BLE001 - logged and retried
                    log.warning("apply attempt %d (round %s) failed: %s", attempt,
                                commit.round if commit else "state transfer", err)
                await asyncio.sleep(min(0.5 * attempt, 5.0))
            log.info("round %d applied: θ %s, %d/%d samples committed", self.training.applied_round,
                     self.training.weights_hash.hex()[:16], self.samples_committed, self.samples_total)
            self._finish_timeline(self.training.applied_round)

    def _book_spent(self, round_: int) -> None:
        for phase, seconds in self.training.take_spent().items():
            self.clock.add(round_, phase, seconds)

    def _finish_timeline(self, round_: int) -> None:
        """Closes this site's record of `round_` (θ_round applied): timeline.jsonl and status."""
        self._book_spent(round_)
        record = self.clock.finish(round_, self.node.now())
        self.last_timeline = record
        try:
            timeline.append(self.node.data_dir, record)
        except OSError as err:  # the timeline is for people: a full disk must not stop the round
            log.warning("round %d: timeline not written: %s", round_, err)
