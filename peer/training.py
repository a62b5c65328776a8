"""The node's training edge: θ and outer momentum, the trainer process, the pseudo-gradient exchange.

Every peer holds θ_r and the outer momentum m_r as a pure function of the commit log and the
streamed pseudo-gradients (architecture.md, "State that matters"). For a committed round it pulls
each contributor's pseudo-gradient (blake3-verified chunks), averages them weighted by tokens in
a fixed order, applies the Nesterov outer step and checks blake3(θ_r) against the hash the leader
put in the entry (I7). The trainer runs in its own process (peer/trainer/process.py); tensors
cross as safetensors files.

State on disk (`<data dir>/state/`): `weights-<round>.safetensors` holds θ and m of a round;
`applied.json` names the newest one with its log index, and is replaced atomically after the
weights file is durable, so a crash never leaves a pointer to a half-written state.

A peer whose θ disagrees with the log (a hash mismatch when applying a round, or a state on disk
whose hash is not the committed one) re-syncs by state transfer (`catch_up`) from a healthy peer.
Fault injection for tests only: `SITEMESH_FAULT_FLIP_THETA_AFTER_ROUND=N` flips one bit of θ in
memory after the first round >= N this process applies (a silent memory error, the hash left
stale), so the next round's hash check must catch it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from peer.core.audit import universe_to_json
from peer.core.commitlog import RoundCommit, SampleRange
from peer.durable import replace_atomic, temp_sibling, write_atomic
from peer.exchange import codec
from peer.exchange.allreduce import all_to_all_mean, publish_pseudo_gradient, reduce_scatter_mean, reduce_shard
from peer.exchange.buffers import EncodeBuffers, ExchangeMemory
from peer.exchange.bulk import BulkConfig, BulkServer
from peer.exchange.client import ExchangeClient, FetchStats, fetch_into, fetch_manifest
from peer.exchange.store import ExchangeStore
from peer.exchange.planes import DEFAULT_PLANE
from peer.exchange.feedback import ErrorFeedback
from peer.exchange.store import MeanInputs
from peer.outer import outer_step, state_dict_hash
from peer.outer_config import OuterConfig
from peer.trainer.checkpoint import Checkpoint, save_checkpoint
from peer.trainer.config import TrainerConfig
from peer.trainer.process import Evaluation, TrainerError, TrainerProcess
from peer.trainer.tensor_files import map_state, read_state, write_state
from peer.transport.channels import PLAINTEXT, Credentials

log = logging.getLogger("sitemesh.training")

MOMENTUM_PREFIX = "outer_momentum."
FLIP_THETA_ENV = "SITEMESH_FAULT_FLIP_THETA_AFTER_ROUND"
"""Test-only fault injection (see the module docstring); never set in a real run."""
RESIDUAL_FILE = "wire-residual.safetensors"
"""int8/int4/sparse error feedback: the part of this site's last pseudo-gradients not sent."""
OWNER_WAIT_S = 120.0
"""How long a peer waits for a shard owner's mean shard before reducing that shard itself: a
stuck owner then costs a round this much and all-to-all bytes for its shard, never the round."""
KEEP_EXCHANGE_ROUNDS = 4
"""Pseudo-gradients stay served this many rounds after their commit, for peers that lag."""


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


class InvalidContribution(RuntimeError):
    """A contributor's pseudo-gradient does not match what the round says of it (its manifest's root
    hash or tokens, the averaging weight, differ from what it reported / the commit names)."""

    def __init__(self, message: str, site: str) -> None:
        super().__init__(message)
        self.site = site
        """Whose contribution is invalid (a leader deciding a round excludes that site)."""


class Unavailable(RuntimeError):
    """A pseudo-gradient named by a committed round is no longer served by anyone reachable:
    this peer must catch up by state transfer instead of recomputing the round."""

    def __init__(self, message: str, site: str) -> None:
        super().__init__(message)
        self.site = site
        """Whose pseudo-gradient is missing (a leader deciding a round leaves that site out)."""


def check_weights(round_: int, named: dict[str, int], served: dict[str, int]) -> None:
    """The tokens each manifest carries are the weights of the mean; they must be the tokens the
    round names for that site, or a site could weigh itself up after the leader admitted it."""
    for site in sorted(named):
        if served.get(site) != named[site]:
            raise InvalidContribution(
                f"round {round_}: {site}'s pseudo-gradient manifest says {served.get(site)} tokens, the round "
                f"names {named[site]}: its averaging weight does not match its report", site)


class SiteTraining:
    def __init__(self, site: str, data_dir: Path, trainer_config: TrainerConfig, outer: OuterConfig,
                 creds: Credentials = PLAINTEXT, plane: str = DEFAULT_PLANE, threads: int | None = None) -> None:
        self._threads = threads
        """Torch intra-op threads of the trainer worker (None: torch's default, one per core)."""
        self._creds = creds
        """How this site dials other sites' exchange services (mutual TLS, or plaintext)."""
        self._plane = plane
        """Where chunks travel: "bulk" (the bulk data plane where a peer offers it) or "grpc"."""
        self._bulk: BulkServer | None = None
        self.site = site
        self.dir = data_dir / "state"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.trainer_config = trainer_config
        self.outer = outer
        self.store = ExchangeStore()
        self.store.on_mean_request = self._mean_requested
        self.process = TrainerProcess(threads)
        self.blocks: list[tuple[int, int]] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.momentum: dict[str, torch.Tensor] = {}
        self.weights_hash = b""
        self.applied_round = 0
        self.applied_index = 0
        self._clients: dict[str, ExchangeClient] = {}
        self._cache: Outcome | None = None
        # The last round's mean destination, written again by the next round: fresh memory for a
        # model-sized mean every round cost more than the exchange itself (exchange-buffer-reuse.md).
        self._spare_mean: dict[str, torch.Tensor] | None = None
        self._encode_buffers = EncodeBuffers()  # likewise for the pseudo-gradients this site encodes
        self._memory = ExchangeMemory()  # and what its mean exchanges receive into and encode mean shards into
        # This site's mean-shard reductions, one per (round, contributors' sites and roots): shared by
        # outcome() and by peers' requests (a leader asks before the commit names the contributors).
        self._shards: dict[tuple[int, tuple[tuple[str, bytes], ...]], asyncio.Future[codec.Encoded]] = {}
        self._feedback: ErrorFeedback | None = None
        """int8/int4/sparse: what this site's last pseudo-gradients did not send (site-local, on disk)."""
        self.last_loss = float("nan")
        self._fault_done = False  # FLIP_THETA_ENV fires once per process
        self._restart: asyncio.Future[None] | None = None
        """A trainer that died (or whose ranks fell out of step) being replaced by a fresh one."""
        self.restarts = 0
        self.clock: Callable[[], float] = time.monotonic
        """The clock `spent` is measured on (the node gives its own)."""
        self.spent: dict[str, float] = {}
        """Seconds per round phase (peer/core/timeline.py: exchange, outer, persist) since `take_spent`."""
        self.fetched: dict[str, FetchStats] = {}
        """Pseudo-gradient fetches per remote site since start: bytes and the faults survived."""
        self._writing: asyncio.Future[None] | None = None
        """The last applied round's persist, GLOBAL_STATE publish and checkpoint, in the background."""
        self.background_s = 0.0
        """Seconds those background writes took since start (overlapped with the next round's work)."""
        self._model_of: TrainerProcess | None = None
        """The trainer whose model is where this site's last round left it (a round trained ahead
        goes on from there); None after a failed round, and a restarted trainer is another one."""

    # ----- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        hello = await self.process.start(self.trainer_config, self.dir)
        self.blocks = [(b, n) for b, n in hello.blocks]
        # The epoch's blocks, beside the commit log, so `ops audit` can prove I4/I5 from disk alone.
        universe = self.dir.parent / "leases" / "universe.json"
        universe.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(universe, universe_to_json(dict(self.blocks)))
        pointer = self._read_pointer()
        if pointer is None:
            self.weights = await asyncio.to_thread(read_state, hello.weights)
            self.momentum = {n: torch.zeros_like(t) for n, t in self.weights.items()}
        else:
            self.applied_index, self.applied_round = int(pointer["index"]), int(pointer["round"])
            both = await asyncio.to_thread(load_file, self.dir / str(pointer["file"]))
            self.weights, self.momentum = self._split_state(both)
        self.weights_hash = bytes.fromhex(await asyncio.to_thread(state_dict_hash, self.weights))
        if codec.WireDtype.named(self.trainer_config.wire).quantized:
            self._feedback = await asyncio.to_thread(ErrorFeedback, self.dir / RESIDUAL_FILE, self.weights,
                                                     self.trainer_config.decay)
        await self._publish_state(self.applied_round, self.weights, self.momentum)
        log.info("training state: round %d, θ %s, %d blocks", self.applied_round, self.weights_hash.hex()[:16],
                 len(self.blocks))

    async def close(self) -> None:
        try:
            await self.settle()  # a graceful stop leaves the last applied round durable
        finally:
            await self.process.stop()
        for client in self._clients.values():
            await client.close()
        if self._bulk is not None:
            self._bulk.close()

    def bulk_refusals(self) -> dict[str, int]:
        """Bulk data-plane connections this peer refused, by status name (none without the plane)."""
        return self._bulk.refusals() if self._bulk is not None else {}

    def serve_bulk(self, host: str) -> BulkServer | None:
        """Starts this site's bulk data plane on `host` (the gRPC listen host), unless the plane is
        "grpc"; the node hands it to add_exchange_service. Call on the event loop."""
        if self._plane == "bulk":
            self._bulk = BulkServer(self.store, BulkConfig(host=host), self._creds)
            log.info("exchange bulk data plane on %s:%d", host, self._bulk.start())
        return self._bulk

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
        # A round this site trained in an earlier process (restarted before the round was decided)
        # is trained again; the earlier, never-committed pseudo-gradient of the round is withdrawn.
        self.store.drop(codec.ObjectKey(round_, self.site))
        wire = codec.WireDtype.named(self.trainer_config.wire)
        if self._feedback is not None:  # int8/int4/sparse: what the last rounds did not send is sent now
            await asyncio.to_thread(self._feedback.add_to, delta)
        # bf16/fp32: the trainer handed Δ over in the wire layout (config.HANDOFF_DTYPES), so it is
        # encoded where it lies; otherwise it is converted into a buffer reused round after round.
        in_place = codec.laid_out_in(delta, handed, wire)
        if not in_place and wire in codec.PLACEABLE:  # the worker hands these over in the wire layout
            log.warning("round %d: the trainer's pseudo-gradient is not in the %s wire layout; converting it "
                        "into a buffer instead of encoding it where it lies", round_, wire.name)
        keep = self.trainer_config.sparse_keep
        chunk = codec.SPARSE_CHUNK_BYTES if keep else codec.DEFAULT_CHUNK_BYTES
        buffer = handed if in_place else self._encode_buffers.take(codec.encoded_nbytes(delta, wire, chunk, keep))
        encoded = await publish_pseudo_gradient(self.store, delta, round=round_, site=self.site, tokens=out.tokens,
                                                wire=wire, out=buffer, keep=keep, chunk_size=chunk,
                                                param_dtypes={n: t.dtype for n, t in self.weights.items()})
        if not in_place:
            self._encode_buffers.lend(buffer, encoded)
        if self._feedback is not None:
            await asyncio.to_thread(self._feedback.keep, delta, encoded)
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
        contributions = []
        started = self.clock()
        if contributors:
            sites = {site: (None if site == self.site else self._client(address)) for site, address, _, _ in contributors}
            await self._check_roots(round_, [(s, a, root) for s, a, root, _ in contributors])
            mean = self._take_mean()
            inputs: MeanInputs = tuple(sorted((s, a, root) for s, a, root, _ in contributors))
            if self.trainer_config.wire == "sparse":  # all-gathered: every peer sums them itself
                report = await all_to_all_mean(round_, sites, self.store, mean,
                                               roots={s: root for s, _, root in inputs})
            else:
                report = await reduce_scatter_mean(round_, self.site, sites, self.store, mean, inputs=inputs,
                                                   my_shard=lambda: self._mean_shard(round_, inputs),
                                                   owner_wait_s=OWNER_WAIT_S, memory=self._memory)
            if report.reduced_here:
                log.warning("round %d: reduced the shards of %s here (all-to-all for them)", round_,
                            report.reduced_here)
            check_weights(round_, {site: tokens for site, _, _, tokens in contributors}, report.tokens)
            contributions = [(mean, sum(report.tokens.values()))]
            for site, stats in report.stats.items():
                self.fetched.setdefault(site, FetchStats()).add(stats)
        started = self._book("exchange", started)
        # Seconds of CPU for a large model: off the event loop, which must keep heartbeating.
        weights, momentum = await asyncio.to_thread(outer_step, self.weights, self.momentum, contributions,
                                                    lr=self.outer.lr, mu=self.outer.momentum)
        if contributions:  # outer_step has read the mean and kept none of it: the next round writes it again
            self._spare_mean = contributions[0][0]
        digest = await asyncio.to_thread(state_dict_hash, weights)
        self._book("outer", started)
        self._cache = Outcome(round_, roots, weights, momentum, bytes.fromhex(digest))
        return self._cache

    def _take_mean(self) -> dict[str, torch.Tensor]:
        """A destination for a round's mean: the spare one if it still fits the weights (an outcome
        running at the same time allocates its own), else fresh memory."""
        spare, self._spare_mean = self._spare_mean, None
        # In the parameters' dtype, not the wire's (which the bulk plane could receive into in place):
        # with a bf16 mean, scripts/run.sh's perplexity ratio was 1.32 and 1.78 in two runs against
        # 1.02 with fp32, cause not found (docs/decisions/exchange-mean-in-place.md).
        if spare is not None and spare.keys() == self.weights.keys() and all(
            (spare[n].shape, spare[n].dtype, spare[n].device) == (t.shape, t.dtype, t.device)
            for n, t in self.weights.items()
        ):
            return spare
        return {n: torch.empty_like(t) for n, t in self.weights.items()}

    async def apply(self, index: int, commit: RoundCommit, addresses: dict[str, str]) -> None:
        """Makes the committed round this peer's state: verify the hash (I7), then persist, serve and
        checkpoint it in the background (`settle` waits for that)."""
        contributors = [(c.site, addresses.get(c.site, ""), c.pseudo_gradient_root, c.tokens)
                        for c in commit.contributors]
        result = await self.outcome(commit.round, contributors)
        if result.weights_hash != commit.weights_hash:
            raise HashMismatch(f"round {commit.round}: θ hash {result.weights_hash.hex()[:16]} != committed "
                               f"{commit.weights_hash.hex()[:16]} (I7): this peer must re-sync its state")
        started = self.clock()
        await self.settle()  # θ_{r-1}'s writes read self.weights: it moves on only after them
        self._book("persist", started)
        self.weights, self.momentum, self.weights_hash = result.weights, result.momentum, result.weights_hash
        self.applied_index, self.applied_round = index, commit.round
        self.store.drop_rounds_before(commit.round - KEEP_EXCHANGE_ROUNDS)
        self._shards = {k: f for k, f in self._shards.items() if k[0] > commit.round}
        # Off the critical path: the next round trains from θ_r in memory while θ_r and m_r are
        # written, fsynced and served. A crash before the pointer moves leaves θ_{r-1} on disk and
        # the log kept from there (node.py, keep_through), so the restarted peer applies r again.
        self._writing = asyncio.ensure_future(self._make_durable(index, commit.round, result))
        if not self._fault_done and commit.round >= int(os.environ.get(FLIP_THETA_ENV) or 1 << 62):
            self._fault_done = True
            self._flip_one_bit()

    async def _make_durable(self, index: int, round_: int, result: Outcome) -> None:
        """θ_round and m_round to disk (the pointer last), served as GLOBAL_STATE, checkpointed when due."""
        started = self.clock()
        await asyncio.to_thread(self._persist, index, round_, result)
        await self._publish_state(round_, result.weights, result.momentum)
        await self._checkpoint_if_due(round_ - 1)
        self.background_s += self.clock() - started

    async def settle(self) -> None:
        """Waits for the last applied round's writes (see apply); raises, once, why they failed."""
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
            client = self._client(address)
            key = codec.ObjectKey(round_, site, codec.ObjectKind.GLOBAL_STATE)
            try:
                manifest = await fetch_manifest(key, [client], wait_s=2.0)
                dest = {n: torch.empty_like(t) for n, t in self._state_tensors(self.weights, self.momentum).items()}
                await fetch_into(manifest, [client], dest)
            except Exception as err:  # noqa: BLE001 - try the next peer
                log.info("state of round %d from %s not available: %s", round_, site, err)
                continue
            weights, momentum = self._split_state(dest)
            got = bytes.fromhex(await asyncio.to_thread(state_dict_hash, weights))
            if got != weights_hash:
                log.warning("state of round %d from %s has θ hash %s, committed %s: refused", round_, site,
                            got.hex()[:16], weights_hash.hex()[:16])
                continue
            result = Outcome(round_, (), weights, momentum, got)
            await self.settle()
            await asyncio.to_thread(self._persist, index, round_, result)
            before = self.applied_round
            self.weights, self.momentum, self.weights_hash = weights, momentum, got
            self.applied_index, self.applied_round = index, round_
            self._cache = None
            # A peer whose θ on disk diverged served it at start as this round's state: that one is
            # wrong, and the store refuses a second object under the same key with another root.
            self.store.drop(codec.ObjectKey(round_, self.site, codec.ObjectKind.GLOBAL_STATE))
            await self._publish_state(round_, weights, momentum)
            log.info("caught up by state transfer from %s: round %d, θ %s", site, round_, got.hex()[:16])
            if self._feedback is not None:  # it was meant for the rounds this site missed
                await asyncio.to_thread(self._feedback.reset)
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
        target = self.dir.parent / "checkpoints" / f"round-{self.applied_round:06d}"
        ckpt = Checkpoint(weights=self.weights, momentum=self.momentum,
                          meta={"round": self.applied_round, "site": self.site})
        # weights_hash is the log's hash of θ_applied_round (apply and catch_up checked it): the
        # checkpoint is refused unless θ, as held and as written, still hashes to it.
        await asyncio.to_thread(save_checkpoint, target, self.trainer_config.model, ckpt, self.weights_hash.hex())
        latest = self.dir.parent / "checkpoints" / "latest"
        tmp = temp_sibling(latest)
        tmp.symlink_to(target.name)
        replace_atomic(tmp, latest)
        return target

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

    @staticmethod
    def _state_tensors(weights: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**weights, **{MOMENTUM_PREFIX + n: t for n, t in momentum.items()}}

    @staticmethod
    def _split_state(both: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The inverse of _state_tensors: (θ, outer momentum)."""
        weights = {n: t for n, t in both.items() if not n.startswith(MOMENTUM_PREFIX)}
        momentum = {n[len(MOMENTUM_PREFIX):]: t for n, t in both.items() if n.startswith(MOMENTUM_PREFIX)}
        return weights, momentum

    async def _publish_state(self, round_: int, weights: dict[str, torch.Tensor],
                             momentum: dict[str, torch.Tensor]) -> None:
        """Serves θ and m of applied round `round_` (exact fp32) for peers that fell behind; only the
        newest state is kept."""
        encoded = await asyncio.to_thread(
            codec.encode, self._state_tensors(weights, momentum), round=round_, site=self.site,
            tokens=0, wire=codec.WireDtype.FP32, kind=codec.ObjectKind.GLOBAL_STATE)
        await self.store.publish(encoded)
        for old in range(max(0, round_ - KEEP_EXCHANGE_ROUNDS), round_):
            self.store.drop(codec.ObjectKey(old, self.site, codec.ObjectKind.GLOBAL_STATE))

    def _fold_path(self, round_: int) -> Path:
        """Where θ_round is written for the round trained ahead of it (the worker looks there)."""
        return self._shm(f"fold-r{round_}")

    def _shm(self, name: str) -> Path:
        assert self.process.shm_dir is not None, "trainer not started"
        return self.process.shm_dir / f"{name}.safetensors"

    def _client(self, address: str) -> ExchangeClient:
        if address not in self._clients:
            self._clients[address] = ExchangeClient(address, self._creds, self._plane)
        return self._clients[address]

    def _mean_shard(self, round_: int, inputs: MeanInputs) -> asyncio.Future[codec.Encoded]:
        """This site's mean shard of `round_` over `inputs`: reduced once, however many ask."""
        key = (round_, tuple((s, r) for s, _, r in inputs))
        held = self._shards.get(key)
        if held is None or (held.done() and (held.cancelled() or held.exception() is not None)):
            sites = {s: None if s == self.site else self._client(a) for s, a, _ in inputs}
            # What it pulls from the other contributors counts as received from them (the metrics),
            # whether the reduction was started by this peer's own mean or by a peer's request.
            held = asyncio.ensure_future(reduce_shard(round_, self.site, sites, self.store,
                                                      roots={s: r for s, _, r in inputs}, fetched=self.fetched,
                                                      memory=self._memory))
            self._shards[key] = held
        return asyncio.shield(held)

    def _mean_requested(self, round_: int, inputs: MeanInputs) -> None:
        """A peer (the deciding leader, or one that applies the commit before us) asks for our shard."""
        if round_ <= self.applied_round or self.site not in {s for s, _, _ in inputs}:
            return  # an old round (answered from the store or not at all), or not one of ours

        def done(f: asyncio.Future[codec.Encoded]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.warning("round %d: reducing our mean shard for a peer failed: %s", round_, f.exception())

        log.info("round %d: reducing our mean shard over %s for a peer's request", round_, [s for s, _, _ in inputs])
        self._mean_shard(round_, inputs).add_done_callback(done)

    async def _check_roots(self, round_: int, contributors: Sequence[tuple[str, str, bytes]]) -> None:
        for site, address, root in contributors:
            key = codec.ObjectKey(round_, site)
            if site == self.site:
                held = self.store.get(key)
                manifest = held.manifest if held is not None else None
            elif not address:
                manifest = None
            else:
                try:
                    manifest = await self._client(address).get_manifest(key, wait_s=10.0)
                except Exception as err:
                    raise Unavailable(f"round {round_}: {site}'s pseudo-gradient: {err}", site) from err
            if manifest is None:
                raise Unavailable(f"round {round_}: nobody serves {site}'s pseudo-gradient any more", site)
            if manifest.root_hash != root:
                # The contributor's own word is wrong (a bug or a forgery): a leader excludes it alone
                # instead of committing the round empty; a follower applying the commit re-syncs.
                raise InvalidContribution(f"round {round_}: {site} serves a pseudo-gradient with root "
                                          f"{manifest.root_hash.hex()[:16]}, the round names {root.hex()[:16]}", site)

    def pointer(self) -> tuple[int, int]:
        """(log index, round) of the state on disk; (0, 0) before the first round."""
        p = self._read_pointer()
        return (0, 0) if p is None else (int(p["index"]), int(p["round"]))

    def _read_pointer(self) -> dict[str, int | str] | None:
        try:
            return json.loads((self.dir / "applied.json").read_text())
        except FileNotFoundError:
            return None

    def _persist(self, index: int, round_: int, result: Outcome) -> None:
        name = f"weights-{round_:06d}.safetensors"
        tensors = self._state_tensors(result.weights, result.momentum)
        tmp = temp_sibling(self.dir / name)
        save_file({n: t.contiguous() for n, t in tensors.items()}, tmp)
        replace_atomic(tmp, self.dir / name)
        write_atomic(self.dir / "applied.json", json.dumps({"index": index, "round": round_, "file": name}))
        for old in self.dir.glob("weights-*.safetensors"):
            if old.name != name:
                old.unlink()
