"""The node's training edge: θ and outer momentum, the trainer process, the pseudo-gradient exchange.

Every peer holds θ_r and the outer momentum m_r as a pure function of the commit log and the
streamed pseudo-gradients (architecture.md, "State that matters"). For a committed round it pulls
each contributor's pseudo-gradient (blake3-verified chunks), averages them weighted by tokens in
a fixed order, applies the Nesterov outer step and checks blake3(θ_r) against the hash the leader
put in the entry (I7). The trainer runs in its own process (peer/trainer/process.py); tensors
cross as safetensors files.

The applied state lives on disk through theta_store.py (written after each round, off the critical
path); the exchange's per-site part (publish, serve, the committed round's mean) is round_exchange.py.

A peer whose θ disagrees with the log (a hash mismatch when applying a round, or a state on disk
whose hash is not the committed one) re-syncs by state transfer (`catch_up`) from a healthy peer.
Fault injection for tests only: `SITEMESH_FAULT_FLIP_THETA_AFTER_ROUND=N` flips one bit of θ in
memory after the first round >= N this process applies (a silent memory error, the hash left
stale), so the next round's hash check must catch it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from peer.core.audit import universe_to_json
from peer.applied_pointer import state_dir
from peer.core.commitlog import RoundCommit, SampleRange
from peer.durable import write_atomic
from peer.exchange.planes import DEFAULT_PLANE
from peer.outer import nesterov_step, state_dict_hash
from peer.outer_config import OuterConfig
from peer.round_exchange import RoundExchange
from peer.theta_store import AppliedState, ThetaStore, split_state, state_tensors
from peer.trainer.config import TrainerConfig
from peer.trainer.process import Evaluation, TrainerError, TrainerProcess
from peer.trainer.tensor_files import map_state, read_state, write_state
from peer.transport.channels import PLAINTEXT, Credentials
from peer.transport.dialer import Dialer

log = logging.getLogger("sitemesh.training")

FLIP_THETA_ENV = "SITEMESH_FAULT_FLIP_THETA_AFTER_ROUND"
"""Test-only fault injection (see the module docstring); never set in a real run."""


@dataclass(frozen=True)
class Outcome:
    """θ_r and m_r computed for one candidate commit, with the hash that goes into the entry."""

    round: int
    roots: tuple[tuple[bytes, int], ...]
    """(pseudo-gradient root, tokens) of each contributor, in order: what the round averaged."""
    weights: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    weights_hash: bytes


@dataclass(frozen=True)
class Trained:
    round: int
    tokens: int
    ranges: tuple[SampleRange, ...]
    root: bytes
    mean_loss: float
    seconds: float
    steps: int = 0
    """Inner optimizer steps the trainer ran."""
    folded_at: int | None = None
    """Trained ahead: after how many steps θ_{round-1} was folded in (None: it came too late)."""


class HashMismatch(RuntimeError):
    """This peer computed a θ_r other than the one committed (an I7 violation)."""


class SiteTraining:
    def __init__(self, site: str, data_dir: Path, trainer_config: TrainerConfig, outer: OuterConfig,
                 creds: Credentials = PLAINTEXT, plane: str = DEFAULT_PLANE, threads: int | None = None,
                 dialer: Dialer | None = None, process: TrainerProcess | None = None) -> None:
        """process: a trainer already spawned in `state_dir(data_dir)` (peer/head_start.py); None: `start`
        spawns one."""
        self._threads = threads
        """Torch intra-op threads of the trainer worker (None: torch's default, one per core)."""
        self.site = site
        self.states = ThetaStore(state_dir(data_dir))
        self.dir = self.states.dir
        self.trainer_config = trainer_config
        self.outer = outer
        self.exchange = RoundExchange(site, trainer_config, creds, plane, dialer)
        self.process = process or TrainerProcess(threads)
        self.blocks: list[tuple[int, int]] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.momentum: dict[str, torch.Tensor] = {}
        self.weights_hash = b""
        self.applied_round = 0
        self.applied_index = 0
        self._cache: Outcome | None = None
        self.last_loss = float("nan")
        self._fault_done = False  # FLIP_THETA_ENV fires once per process
        self._restart: asyncio.Future[None] | None = None
        """A trainer that died (or whose ranks fell out of step) being replaced by a fresh one."""
        self.restarts = 0
        self.clock: Callable[[], float] = time.monotonic
        """The clock `spent` is measured on (the node gives its own)."""
        self.spent: dict[str, float] = {}
        """Seconds per round phase (peer/core/timeline.py: exchange, outer, persist) since `take_spent`."""
        self._installing = asyncio.Lock()
        """One state installed at a time: an apply cancelled too late (its recompute already done)
        still installs while the state transfer that replaced it runs."""
        self._writing: asyncio.Future[None] | None = None
        """The last applied round's persist, GLOBAL_STATE publish and checkpoint, in the background."""
        self._model_of: TrainerProcess | None = None
        """The trainer whose model is where this site's last round left it (a round trained ahead
        goes on from there); None after a failed round, and a restarted trainer is another one."""

    # ----- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.process.spawned:  # else the head start spawned it (peer/head_start.py)
            await self.process.spawn(self.trainer_config, self.dir)
        hello = await self.process.hello()
        self.blocks = [(b, n) for b, n in hello.blocks]
        # The epoch's blocks, beside the commit log, so `ops audit` can prove I4/I5 from disk alone.
        universe = self.dir.parent / "leases" / "universe.json"
        universe.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(universe, universe_to_json(dict(self.blocks)))
        applied = await asyncio.to_thread(self.states.load)
        if applied is None:
            self.weights = await asyncio.to_thread(read_state, hello.weights)
            self.momentum = {n: torch.zeros_like(t) for n, t in self.weights.items()}
        else:
            self.applied_index, self.applied_round = applied.index, applied.round
            self.weights, self.momentum = applied.weights, applied.momentum
            self.exchange.applied(self.applied_round)
        self.weights_hash = bytes.fromhex(await asyncio.to_thread(state_dict_hash, self.weights))
        await self.exchange.load_feedback(self.dir, self.weights)
        await self.exchange.publish_state(self.applied_round, state_tensors(self.weights, self.momentum))
        log.info("training state: round %d, θ %s, %d blocks", self.applied_round, self.weights_hash.hex()[:16],
                 len(self.blocks))

    async def close(self) -> None:
        try:
            await self.settle()  # a graceful stop leaves the last applied round durable
        finally:
            await self.process.stop()
        await self.exchange.close()

    # ----- a site's part of a round ----------------------------------------------------------
    async def train(self, round_: int, ranges: Sequence[SampleRange], inner_steps: int,
                    budget_s: float | None = None, ahead: bool = False) -> Trained:
        """Trains `ranges` from θ_{round-1} in the trainer process and publishes the pseudo-gradient
        (`budget_s`: a time-boxed round, Trainer.train_round). `ahead` (overlap): θ_{round-1} is not
        applied yet; the trainer goes on from its model and folds θ_{round-1} in when `fold` writes
        it (a fresh trainer, whose model is θ_0, starts from the newest θ applied here instead)."""
        await self._restarted()
        process = self.process
        fold = self._fold_path(round_ - 1) if ahead else None
        for old in process.shm_dir.glob("fold-r*.safetensors") if process.shm_dir else ():
            if old != fold:
                old.unlink(missing_ok=True)  # θs of earlier rounds, written after their round was done
        base = None
        if not ahead or self._model_of is not process:
            base = await asyncio.to_thread(write_state, self._shm("base"), self.weights)
        if fold is not None and self.applied_round >= round_ - 1:
            await self.fold(round_ - 1)  # applied while this call started: fold before the first step
        try:
            out = await process.train(round_, base, [(r.block_id, r.start, r.end) for r in ranges],
                                      inner_steps, (round_ - 1) * inner_steps, budget_s, fold)
        except TrainerError as err:
            self._model_of = None
            if err.fatal:  # the round reports nothing (the caller); the next one trains on fresh ranks
                self._restart = asyncio.ensure_future(self._restart_trainer())
            raise
        # A round trained ahead whose θ_{round-1} came only after its last step left the model on
        # this site's own line, which no fold brought back to the committed θ: the next round starts
        # from the newest θ applied here instead (Δ is the same either way; the local line is not).
        self._model_of = process if not ahead or out.folded_at is not None else None
        # Mapped, not read: the file's pages are touched once, by the encode (the mapping outlives
        # the unlinked file for as long as the published object is served).
        delta, handed = await asyncio.to_thread(map_state, out.pseudo_gradient)
        out.pseudo_gradient.unlink(missing_ok=True)
        encoded = await self.exchange.publish(round_, delta, handed, out.tokens,
                                              {n: t.dtype for n, t in self.weights.items()})
        self.last_loss = out.mean_loss
        return Trained(round_, out.tokens, tuple(SampleRange(b, s, e) for b, s, e in out.trained),
                       encoded.manifest.root_hash, out.mean_loss, out.seconds, out.steps, out.folded_at)

    async def fold(self, round_: int) -> None:
        """Hands θ_round (applied here) to the round trained ahead of it: written whole and renamed
        into the path the trainer looks at between steps (write_state is atomic)."""
        if self.applied_round != round_ or self.process.shm_dir is None:
            return  # a later θ is here already (a state transfer): that round's fold never comes
        path = self._fold_path(round_)
        if path.is_file():
            # Handed over already: train() found θ_round applied when it started, and the core's
            # Fold for the same round follows. Only θ_round is ever written there, and atomically.
            return
        try:
            await asyncio.to_thread(write_state, path, self.weights)
        except OSError as err:  # the round then trains on unfolded: slower to converge, never wrong
            log.warning("round %d: θ not handed to the round trained ahead (%s); it goes on unfolded",
                        round_ + 1, err)

    # ----- every peer's part of a commit -----------------------------------------------------
    async def outcome(self, round_: int, contributors: Sequence[tuple[str, str, bytes, int]]) -> Outcome:
        """θ_round from θ_{round-1} and the (site, address, root, tokens) contributors, fetched and
        verified: roots against the manifests, and the manifests' tokens (the averaging weights)
        against `tokens`, what the site reported and the commit names."""
        roots = tuple((root, tokens) for _, _, root, tokens in contributors)
        if self._cache is not None and (self._cache.round, self._cache.roots) == (round_, roots):
            return self._cache
        started = self.clock()
        mean, tokens = await self.exchange.mean(round_, contributors, self.weights) if contributors else ({}, 0)
        started = self._book("exchange", started)
        if tokens > 0:  # the exchange formed the token-weighted mean; the outer step takes it as it is
            # Seconds of CPU for a large model: off the event loop, which must keep heartbeating.
            weights, momentum = await asyncio.to_thread(nesterov_step, self.weights, self.momentum, mean,
                                                        lr=self.outer.lr, mu=self.outer.momentum)
            self.exchange.give_back(mean)
        else:  # an empty round: θ and the momentum stay as they are (outer.py)
            weights, momentum = dict(self.weights), dict(self.momentum)
        digest = await asyncio.to_thread(state_dict_hash, weights)
        self._book("outer", started)
        self._cache = Outcome(round_, roots, weights, momentum, bytes.fromhex(digest))
        return self._cache

    async def recompute(self, commit: RoundCommit, addresses: dict[str, str]) -> Outcome:
        """θ and m of the committed round, from its contributors' pseudo-gradients (site -> address).
        Safe to cancel: it changes no state of this site."""
        contributors = [(c.site, addresses.get(c.site, ""), c.pseudo_gradient_root, c.tokens)
                        for c in commit.contributors]
        return await self.outcome(commit.round, contributors)

    async def install(self, index: int, commit: RoundCommit, result: Outcome) -> None:
        """Makes the recomputed round this peer's state: verify the hash (I7), then persist, serve and
        checkpoint it in the background (`settle` waits for that)."""
        if result.weights_hash != commit.weights_hash:
            raise HashMismatch(f"round {commit.round}: θ hash {result.weights_hash.hex()[:16]} != committed "
                               f"{commit.weights_hash.hex()[:16]} (I7): this peer must re-sync its state")
        async with self._installing:
            if commit.round <= self.applied_round:
                return  # a state transfer that ran meanwhile covered this round
            started = self.clock()
            await self.settle()  # θ_{r-1}'s writes read self.weights: it moves on only after them
            self._book("persist", started)
            self.weights, self.momentum, self.weights_hash = result.weights, result.momentum, result.weights_hash
            self.applied_index, self.applied_round = index, commit.round
            self.exchange.applied(commit.round)
            # Off the critical path: the next round trains from θ_r in memory while θ_r and m_r are
            # written, fsynced and served. A crash before the pointer moves leaves θ_{r-1} on disk and
            # the log kept from there (node.py, keep_through), so the restarted peer applies r again.
            self._writing = asyncio.ensure_future(self._make_durable(index, commit.round, result))
        if not self._fault_done and commit.round >= int(os.environ.get(FLIP_THETA_ENV) or 1 << 62):
            self._fault_done = True
            self._flip_one_bit()

    async def _make_durable(self, index: int, round_: int, result: Outcome) -> None:
        """θ_round and m_round to disk (the pointer last), served as GLOBAL_STATE, checkpointed when due."""
        await asyncio.to_thread(self.states.persist, AppliedState(index, round_, result.weights, result.momentum))
        await self.exchange.publish_state(round_, state_tensors(result.weights, result.momentum))
        await self._checkpoint_if_due(round_ - 1)

    async def settle(self) -> None:
        """Waits for the last applied round's writes (see install); raises, once, why they failed."""
        writing, self._writing = self._writing, None
        if writing is not None:
            await writing

    def take_spent(self) -> dict[str, float]:
        """The phase seconds booked since the last call, and a fresh count."""
        spent, self.spent = self.spent, {}
        return spent

    async def catch_up(self, round_: int, index: int, weights_hash: bytes, peers: dict[str, str]) -> bool:
        """State transfer: install θ_round and m_round from any peer (site -> address) that serves
        them, after checking blake3(θ) against the committed `weights_hash`. False if none could."""
        for site, address in sorted(peers.items()):
            if site == self.site:
                continue
            try:
                dest = await self.exchange.fetch_state(round_, site, address, state_tensors(self.weights, self.momentum))
            except Exception as err:  # noqa: BLE001 - try the next peer
                log.info("state of round %d from %s not available: %s", round_, site, err)
                continue
            weights, momentum = split_state(dest)
            got = bytes.fromhex(await asyncio.to_thread(state_dict_hash, weights))
            if got != weights_hash:
                log.warning("state of round %d from %s has θ hash %s, committed %s: refused", round_, site,
                            got.hex()[:16], weights_hash.hex()[:16])
                continue
            async with self._installing:
                await self.settle()
                await asyncio.to_thread(self.states.persist, AppliedState(index, round_, weights, momentum))
                before = self.applied_round
                self.weights, self.momentum, self.weights_hash = weights, momentum, got
                self.applied_index, self.applied_round = index, round_
                self._cache = None
                self.exchange.applied(round_)
                self.exchange.withdraw_state(round_)  # a θ on disk that diverged was served as it at start
                await self.exchange.publish_state(round_, state_tensors(weights, momentum))
            log.info("caught up by state transfer from %s: round %d, θ %s", site, round_, got.hex()[:16])
            await self.exchange.reset_feedback()
            await self._checkpoint_if_due(before)
            return True
        return False

    async def _checkpoint_if_due(self, before: int) -> None:
        """Checkpoints θ_applied_round when the step from round `before` crossed a multiple of
        checkpoint_every: a state transfer that skips rounds must not skip their checkpoint too."""
        every = self.outer.checkpoint_every
        if every and self.applied_round // every > before // every:
            await self.checkpoint()

    async def checkpoint(self) -> Path:
        """A Hugging Face checkpoint of θ (+ outer momentum) that from_pretrained loads."""
        state = AppliedState(self.applied_index, self.applied_round, self.weights, self.momentum)
        return await asyncio.to_thread(self.states.checkpoint, self.trainer_config.model, state, self.site,
                                       self.weights_hash)

    async def _restarted(self) -> None:
        """Wait for a restart under way; one that failed is tried again at the next call."""
        if self._restart is None:
            return
        task, self._restart = self._restart, None
        try:
            await task
        except Exception:
            self._restart = asyncio.ensure_future(self._restart_trainer())
            raise

    async def _restart_trainer(self) -> None:
        """A fresh trainer job (every rank) in place of one that died. Rounds start from the committed
        θ the node hands over, so only the site-local AdamW state starts over."""
        await self.process.stop()
        self.process = TrainerProcess(self._threads)
        hello = await self.process.start(self.trainer_config, self.dir)
        self.restarts += 1
        log.warning("trainer restarted (%d so far): %d rank(s)", self.restarts, len(hello.ranks))

    async def evaluate(self, weights: dict[str, torch.Tensor]) -> Evaluation:
        """Held-out perplexity of `weights` in the trainer process; its model stays as it was. A
        trainer that dies meanwhile is restarted by the next train() (its call fails at once)."""
        await self._restarted()
        base = await asyncio.to_thread(write_state, self._shm("eval"), weights)
        return await self.process.evaluate(base)

    def verify_against(self, index: int, round_: int, weights_hash: bytes) -> str:
        """Why the state loaded at start is not the committed θ of `round_` (log index `index`), or
        "" if it is (or the log no longer says: then the next round's hash check will)."""
        if (round_ == 0 or (self.applied_index, self.applied_round) != (index, round_)
                or self.weights_hash == weights_hash):
            return ""
        return (f"round {round_}: θ on disk has hash {self.weights_hash.hex()[:16]}, the log commits "
                f"{weights_hash.hex()[:16]} (I7)")

    def _flip_one_bit(self) -> None:
        """Test-only fault (FLIP_THETA_ENV): one bit of θ changes in memory, the hash is left stale."""
        name = min(self.weights)
        t = self.weights[name].clone()
        t.view(-1).view(torch.int32)[0] ^= 1
        self.weights = {**self.weights, name: t}
        log.warning("fault injected (%s): one bit of %s flipped after round %d", FLIP_THETA_ENV, name,
                    self.applied_round)

    # ----- internals -------------------------------------------------------------------------
    def _book(self, phase: str, started: float) -> float:
        """Books the seconds since `started` to `phase`; returns now (the next phase's start)."""
        now = self.clock()
        self.spent[phase] = self.spent.get(phase, 0.0) + max(now - started, 0.0)
        return now

    def _fold_path(self, round_: int) -> Path:
        """Where θ_round is written for the round trained ahead of it (the worker looks there)."""
        return self._shm(f"fold-r{round_}")

    def _shm(self, name: str) -> Path:
        assert self.process.shm_dir is not None, "trainer not started"
        return self.process.shm_dir / f"{name}.safetensors"

    def pointer(self) -> tuple[int, int]:
        """(log index, round) of the state on disk; (0, 0) before the first round."""
        return self.states.pointer()
