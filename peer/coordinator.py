"""Runs DiLoCo outer rounds on a node: the leader schedules and decides, every site trains and applies.

Glue between three parts that know nothing of each other: the round scheduling core
(peer/rounds.py), the consensus core (peer/consensus.py, through the node) and the training edge
(peer/training.py). A round, end to end:

1. The leader opens round r once r-1 is committed and applied here, granting uncommitted samples.
2. Each granted site trains its grant from θ_{r-1} in its trainer process, publishes Δ in its
   exchange store and tells the leader (Contribution).
3. The leader admits contributions (I6), pulls and averages them, applies the outer step, and
   proposes RoundCommit(r, contributors, hash θ_r) to the log.
4. Every peer applies each committed round in log order: pulls the contributors' Δ, recomputes
   θ_r, checks the hash (I7), persists it.

A failure in 3 (a contributor's pseudo-gradient cannot be fetched) commits the round without any
contributor: nothing is lost, its samples stay free and are granted again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from peer import rounds as r
from peer.commitlog import Contributor, RoundCommit, SampleRange
from peer.election import Header, Role, SiteId
from peer.training import HashMismatch, SiteTraining, Unavailable

if TYPE_CHECKING:
    from peer.node import Node

log = logging.getLogger("sitemesh.rounds")


@dataclass(frozen=True)
class _Done:
    round: int
    base: bytes
    tokens: int
    ranges: tuple[SampleRange, ...]
    root: bytes


class Coordinator:
    def __init__(self, node: Node, training: SiteTraining, config: r.RoundsConfig) -> None:
        self.node = node
        self.training = training
        self.config = config
        self.leader: r.RoundLeader | None = None
        self._applies: asyncio.Queue[tuple[int, RoundCommit]] = asyncio.Queue()
        self._busy = False
        self._deciding = False
        self.epoch_complete = False
        self.samples_total = 0
        self._done: _Done | None = None
        """This site's last trained round, kept to answer a reopened round without retraining."""
        self.diverged = ""
        """Why this peer stopped applying rounds (an I7 violation), empty while healthy."""

    async def start(self) -> None:
        await self.training.start()
        ledger = r.Ledger(self.training.blocks)
        self.samples_total = ledger.total
        raft = self.node.consensus_core()
        # The ledger is rebuilt from the commit log alone (entries this peer already applied are
        # not replayed as Committed effects).
        for index in range(raft.log.snapshot.last_index + 1, raft.applied_index + 1):
            entry = raft.log.entry(index)
            if entry is not None and isinstance(entry.body, RoundCommit):
                ledger.commit(rng for c in entry.body.contributors for rng in c.ranges)
        self.leader = r.RoundLeader(self.config, ledger)
        self.node.spawn(self._apply_loop())

    @property
    def samples_committed(self) -> int:
        return self.leader.ledger.committed_samples if self.leader else 0

    # ----- from the node -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        raft = self.node.consensus_core()
        if self.leader is None or raft.role is not Role.LEADER or self._deciding:
            return
        status = raft.status()
        if self.training.applied_round != status.committed_round or not self._applies.empty():
            return  # θ_{r-1} must be ours before we open r
        live = [v.site for v in self.node.members() if v.state.name in ("ALIVE", "SUSPECT")]
        header = Header(SiteId(self.node.config.site), self.node.address, status.epoch, status.committed_round)
        for effect in self.leader.tick(now, header, status.committed_round, live, self.training.weights_hash):
            self._run(effect)

    def on_leader_changed(self, leader: str | None) -> None:
        if leader != self.node.config.site and self.leader is not None:
            self.leader.step_down()

    def on_committed(self, index: int, commit: RoundCommit) -> None:
        if self.leader is not None:
            self.leader.on_commit(commit)
        self._applies.put_nowait((index, commit))

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

    # ----- internals -----------------------------------------------------------------------
    def _run(self, effect: r.Effect) -> None:
        if isinstance(effect, r.Broadcast):
            log.info("round %d open: %s", effect.msg.round,
                     ", ".join(f"{g.site}={sum(x.end - x.start for x in g.ranges)} samples" for g in effect.msg.grants))
            for view in self.node.members():
                if view.state.name == "ALIVE":
                    self.node.send_round_message(view.address, effect.msg)
        elif isinstance(effect, r.Decide):
            self._deciding = True
            self.node.spawn(self._decide(effect))
        elif isinstance(effect, r.EpochComplete):
            self.epoch_complete = True
            log.info("data epoch complete: all %d samples committed exactly once", effect.samples)

    def _on_open(self, msg: r.RoundOpen) -> None:
        grant = next((g for g in msg.grants if g.site == self.node.config.site), None)
        if grant is None:
            return
        done = self._done
        if (done is not None and done.round == msg.round and done.base == msg.base_weights_hash
                and all(r.within_grant(t, grant.ranges) for t in done.ranges)):
            # A new leader reopened a round we already trained, and our samples are still ours.
            self._contribute(done)
            return
        if self._busy:
            log.info("round %d: still training the previous round, skipping", msg.round)
            return
        self._busy = True
        self.node.spawn(self._train(msg, grant))

    async def _train(self, msg: r.RoundOpen, grant: r.RoundGrant) -> None:
        try:
            # θ_{r-1} may still be being applied here (its commit raced the open): wait briefly.
            for _ in range(100):
                if self.training.applied_round >= msg.round - 1 and self._applies.empty():
                    break
                await asyncio.sleep(0.05)
            if self.training.applied_round != msg.round - 1 or self.training.weights_hash != msg.base_weights_hash:
                log.warning("round %d: not at θ_%d (have round %d), not contributing", msg.round, msg.round - 1,
                            self.training.applied_round)
                return
            trained = await self.training.train(msg.round, grant.ranges, msg.inner_steps)
            log.info("round %d trained: %d tokens, loss %.3f, %.1fs", msg.round, trained.tokens,
                     trained.mean_loss, trained.seconds)
            self._done = _Done(msg.round, msg.base_weights_hash, trained.tokens, trained.ranges, trained.root)
            self._contribute(self._done)
        except Exception:  # a failed round costs this site its contribution, never the peer
            log.exception("round %d: training failed", msg.round)
        finally:
            self._busy = False

    def _contribute(self, done: _Done) -> None:
        """Tells the current leader: it may have changed while we trained (a successor reopens the
        same round over the same free samples)."""
        raft = self.node.consensus_core()
        leader = next((v.address for v in self.node.members() if v.site == raft.leader), None)
        if leader is None:
            log.info("round %d: no leader known; the contribution waits for the next open", done.round)
            return
        header = Header(SiteId(self.node.config.site), self.node.address, raft.hard.epoch, done.round - 1)
        self.node.send_round_message(leader, r.Contribution(
            header, done.round, self.node.config.site, self.node.address, done.tokens, done.ranges, done.root))

    async def _decide(self, decide: r.Decide) -> None:
        try:
            for site, reason in decide.excluded:
                log.info("round %d: %s", decide.round, reason)
            admitted = list(decide.admitted)
            try:
                outcome = await self.training.outcome(
                    decide.round, [(c.site, c.address, c.pseudo_gradient_root) for c in admitted])
            except Exception as err:
                log.warning("round %d: could not pull every pseudo-gradient (%s); committing it empty", decide.round, err)
                admitted = []
                outcome = await self.training.outcome(decide.round, [])
            commit = RoundCommit(decide.round, tuple(
                Contributor(SiteId(c.site), c.tokens, c.ranges, c.pseudo_gradient_root) for c in admitted),
                outcome.weights_hash)
            if not self.node.propose(commit) and self.leader is not None:
                self.leader.step_down()
        finally:
            self._deciding = False

    async def _apply_loop(self) -> None:
        """Applies committed rounds strictly in log order. A pseudo-gradient nobody serves any more
        (this peer fell behind) is replaced by a state transfer of the newest committed round; other
        failures are retried; a hash mismatch stops applying: this peer's θ is wrong (I7)."""
        while True:
            index, commit = await self._applies.get()
            self._applies.task_done()
            if commit.round <= self.training.applied_round:
                continue  # covered by a state transfer
            for attempt in range(1, 1_000_000):
                addresses = {v.site: v.address for v in self.node.members() if v.state.name == "ALIVE"}
                try:
                    await self.training.apply(index, commit, addresses)
                    break
                except HashMismatch as err:
                    self.diverged = str(err)
                    log.error("%s", err)
                    return
                except Unavailable as err:
                    raft = self.node.consensus_core()
                    rnd, rnd_index, weights_hash = raft.log.last_round_entry(raft.commit_index)
                    log.info("%s; catching up to round %d by state transfer", err, rnd)
                    if await self.training.catch_up(rnd, rnd_index, weights_hash, addresses):
                        break
                except Exception as err:  # noqa: BLE001 - logged and retried
                    log.warning("round %d: apply attempt %d failed: %s", commit.round, attempt, err)
                await asyncio.sleep(min(0.5 * attempt, 5.0))
            log.info("round %d applied: θ %s, %d/%d samples committed", self.training.applied_round,
                     self.training.weights_hash.hex()[:16], self.samples_committed, self.samples_total)
