"""The site's trainer: DiLoCo's inner loop (H AdamW steps from the global weights) and evaluation.

DiLoCo (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1, lines 3-8): a site copies the global
weights θ, runs H inner AdamW steps on its own data, and returns the pseudo-gradient Δ = θ − θ_H
together with the tokens it trained. The inner optimizer state (AdamW moments, step count) stays on
the site across rounds, as in the paper; it is never averaged.

Inside a site the trainer is data-parallel over torch.distributed when the process group is
initialised (peer/trainer/launch.py, `torchrun`, `srun`): DDP averages gradients, gradient
accumulation skips the all-reduce on all but the last micro-step. With `RanksConfig.parallel =
"fsdp"` the model is sharded with FSDP2 (`fully_shard` per decoder layer and at the root) instead,
and the weight dict is gathered in full on every rank (docs/decisions/trainer-ranks.md). Rank 0
talks to the mesh; `train_round` broadcasts rank 0's arguments, so the other ranks may pass None.
Every inner step consumes `batch_size` samples for the whole site, split across ranks by stride,
so the samples trained (and the global batch) do not depend on the world size.

Try it (one site, shipped corpus, a few steps):
    .venv/bin/python -c "from peer.trainer.inner import demo; demo()"
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from peer.trainer.blocks import BlockIndex, SampleRange, merge_ranges, take_samples
from peer.trainer.config import DataConfig, InnerConfig, TrainerConfig
from peer.trainer.evaluate import perplexity
from peer.trainer.model import autocast, build_model, load_weights, pick_device, weights


SLOW_ENV = "SITEMESH_FAULT_SLOW_TRAINER"
"""Test and benchmark fault, never set in a real run: a factor F > 1 makes every inner step take F
times as long (the trainer sleeps after each step), as on a slower accelerator."""


def _slowdown() -> float:
    raw = os.environ.get(SLOW_ENV, "")
    try:
        factor = float(raw) if raw else 1.0
    except ValueError:
        raise ValueError(f"{SLOW_ENV}={raw!r}: expected a factor >= 1") from None
    if not factor >= 1:
        raise ValueError(f"{SLOW_ENV}={raw!r}: expected a factor >= 1")
    return factor


@dataclass
class RoundResult:
    """What a site returns after a round; rank 0's copy is the one the mesh uses."""

    pseudo_gradient: dict[str, torch.Tensor]
    """θ_global − θ_local by parameter name, fp32 on CPU."""
    tokens: int
    """Tokens trained in this round by the whole site (samples x seq_len); the outer-step weight."""
    trained: list[SampleRange]
    """Exactly the samples trained (merged ranges); untrained samples of the given ranges are not
    here and go back to the lease pool."""
    steps: int
    mean_loss: float
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    """Per-step training loss (site mean), for logs and benches."""
    folded_at: int | None = None
    """Overlapped rounds: after how many of the steps the newest global θ was folded in (0: before
    the first); None: no fold was offered or none came before the round ended."""


def lr_at(cfg: InnerConfig, step: int) -> float:
    """Linear warm-up to `lr`, then cosine to `lr * min_lr_ratio` at `total_steps`, then flat."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _dist() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Trainer:
    """One site's trainer. Construct on every rank of the site with the same config."""

    def __init__(self, cfg: TrainerConfig, index: BlockIndex | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.cfg = cfg
        self.clock = clock
        """Times rounds and their compute budget (injected in tests)."""
        self.slowdown = _slowdown()
        self.rank, self.world = _dist()
        inner = cfg.inner
        if inner.batch_size % (self.world * inner.micro_batch_size):
            raise ValueError(f"batch_size={inner.batch_size} is not a multiple of world={self.world} "
                             f"x micro_batch_size={inner.micro_batch_size}")
        self.accum = inner.batch_size // (self.world * inner.micro_batch_size)
        self.device = pick_device(inner.device)
        if self.device.type == "cuda" and self.world > 1:
            # torchrun/srun launch one rank per accelerator of a node; LOCAL_RANK names it. Where
            # srun binds one device per task (--gpus-per-task=1) each rank sees only its own.
            local = int(os.environ.get("LOCAL_RANK", self.rank))
            self.device = torch.device("cuda", local % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        self.index = index or BlockIndex(cfg.data)
        if self.index.cfg != cfg.data:
            raise ValueError("the block index was built for a different DataConfig")
        if self.index.corpus.tokenizer.vocab_size > cfg.model.vocab_size:
            raise ValueError(f"tokenizer has {self.index.corpus.tokenizer.vocab_size} tokens, model "
                             f"{cfg.model.name} only {cfg.model.vocab_size} embedding rows")
        self.module = build_model(cfg.model, self.device, seed=inner.seed)
        self.module.train()
        self.ddp: DistributedDataParallel | None = None
        self.fsdp = self.world > 1 and cfg.ranks.parallel == "fsdp"
        self._shapes = {n: p.shape for n, p in self.module.named_parameters()}
        if self.fsdp:
            _fully_shard(self.module, self.device, inner.autocast_bf16)
        elif self.world > 1:
            self.ddp = DistributedDataParallel(
                self.module, device_ids=[self.device] if self.device.type == "cuda" else None)
        net: torch.nn.Module = self.ddp or self.module
        self.net = torch.compile(net) if inner.compile else net
        # fp32 master weights and AdamW state; bf16 only inside autocast (or FSDP's param_dtype).
        decay = [p for p in self.module.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.module.parameters() if p.ndim < 2]  # norms: decay would only shrink them
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": inner.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=inner.lr, betas=inner.betas, eps=inner.eps, fused=self.device.type == "cuda" and not self.fsdp,
        )
        self.step = 0
        """Inner steps this site has taken over the run (drives the LR schedule)."""
        self._heldout: torch.Tensor | None = None

    # -- weights ---------------------------------------------------------------------------------
    def model_weights(self) -> dict[str, torch.Tensor]:
        """The model's current weights as a weight dict (fp32, CPU): θ_0 before the first round.
        Under FSDP a collective (every rank gathers the full tensors)."""
        if self.fsdp:
            return {n: p.full_tensor().detach().to("cpu", torch.float32, copy=True)  # type: ignore[attr-defined]
                    for n, p in self.module.named_parameters()}
        return weights(self.module)

    def full_shapes(self) -> dict[str, torch.Size]:
        """Every parameter's full (unsharded) shape, by weight-dict name."""
        return dict(self._shapes)

    def load_global(self, state: dict[str, torch.Tensor]) -> None:
        """Set the model to the global weights θ (every rank must pass the same state; not FSDP)."""
        load_weights(self.module, state)

    def inner_state(self) -> dict[str, Any]:
        """Site-local state to checkpoint: AdamW moments and the inner step count. Under FSDP a
        collective that gathers the full optimizer state (on CPU)."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            full = get_optimizer_state_dict(self.module, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return {"optimizer": full, "step": self.step}
        return {"optimizer": self.optimizer.state_dict(), "step": self.step}

    def load_inner_state(self, state: dict[str, Any]) -> None:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(self.module, self.optimizer, state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])

    # -- training --------------------------------------------------------------------------------
    def _broadcast(self, obj: Any) -> Any:
        """Rank 0's small Python object, on every rank."""
        if self.world == 1:
            return obj
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @torch.no_grad()
    def _load_from_rank0(self, state: dict[str, torch.Tensor] | None) -> None:
        """Rank 0 loads `state`; the weights then go to the other ranks tensor by tensor (no pickling)."""
        if self.rank == 0:
            assert state is not None, "rank 0 must pass the weights"
        if self.fsdp:
            from torch.distributed.tensor import distribute_tensor

            # Rank 0 scatters each full tensor; every rank keeps its own shard.
            for n, p in self.module.named_parameters():
                full = (state[n] if state is not None and self.rank == 0
                        else torch.empty(self._shapes[n])).to(self.device, torch.float32)
                shard = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=0)  # type: ignore[attr-defined]
                p.to_local().copy_(shard.to_local())  # type: ignore[attr-defined]
            return
        if self.rank == 0:
            assert state is not None
            self.load_global(state)
        if self.world > 1:
            for p in self.module.parameters():
                dist.broadcast(p.data, src=0)

    def train_round(
        self,
        global_state: dict[str, torch.Tensor] | None,
        ranges: list[SampleRange] | None,
        inner_steps: int | None,
        start_step: int | None = None,
        budget_s: float | None = None,
        fold: Callable[[], dict[str, torch.Tensor] | None] | None = None,
    ) -> RoundResult:
        """Run up to `inner_steps` AdamW steps from `global_state` on the samples of `ranges`.
        With `budget_s` (a time-boxed round), stop after the first step that ends past it: at least
        one step, at most `inner_steps`; the samples not reached are absent from `trained`.

        Samples are taken in the order of `ranges`, `batch_size` per step; a remainder smaller than
        one batch is left untrained (and absent from `trained`). `start_step` places the round on the
        LR schedule (the node passes round x H so that a site that rejoins uses the run's current
        LR); by default the site's own step counter continues. With torch.distributed, only rank 0's
        arguments count.

        Overlapped rounds (docs/decisions/rounds-overlap-fold.md): `global_state` None continues from
        the model as the last round left it (this site's own progress, before the mesh's mean of that
        round exists), and `fold` (rank 0's) is asked before every step for that mean, θ_{r-1} (any
        start works: a fresh trainer is given the newest global θ it has and folds too); the
        first time it has it, the model moves by θ_{r-1} − start (every step trained so far is kept,
        translated onto θ_{r-1}) and θ_{r-1} becomes the start the pseudo-gradient is measured from.
        A translation leaves start − local unchanged, so Δ is right whenever (and whether) the fold
        comes: the fold only decides from where the remaining steps compute their gradients.
        """
        ranges, inner_steps, start_step, budget_s, resume, watching = self._broadcast(  # rank 0's say
            (ranges, inner_steps, start_step, budget_s, global_state is None, fold is not None))
        assert ranges is not None and inner_steps is not None, "rank 0 must pass ranges and inner_steps"
        if inner_steps < 0:
            raise ValueError(f"inner_steps={inner_steps} must be >= 0")
        if budget_s is not None and not budget_s > 0:
            raise ValueError(f"budget_s={budget_s} must be > 0 seconds (or None: no time box)")
        if start_step is not None:
            self.step = start_step
        t0 = self.clock()
        if not resume:
            self._load_from_rank0(global_state)
        start = self.model_weights()  # bit-equal to global_state on rank 0; the broadcast copy elsewhere
        inner, L = self.cfg.inner, self.cfg.data.seq_len
        queue, trained, losses = list(ranges), [], []
        folded_at: int | None = None
        for step in range(inner_steps):
            if watching and folded_at is None:
                start, folded = self._fold(start, fold)
                folded_at = step if folded else None
            batch_ranges, queue = take_samples(queue, inner.batch_size)
            n = sum(r.num_samples for r in batch_ranges)
            # A short batch is trained only when it ends the ranges handed over (the data epoch's
            # tail): otherwise those samples could never be trained and the epoch never completes.
            # That holds for a tail smaller than the ranks too (a rank without a sample takes a
            # step that counts for nothing): a 2-rank site left 1 sample of an epoch trained it 0
            # times, put it back on its lease and took it again, round after round.
            if n == 0 or (n < inner.batch_size and queue):
                break
            step_started = time.perf_counter()
            losses.append(self._step(self.index.read_ranges(batch_ranges)))
            if self.slowdown > 1:  # test/bench fault: a slower accelerator (SLOW_ENV)
                time.sleep((self.slowdown - 1) * (time.perf_counter() - step_started))
            trained.extend(batch_ranges)
            # Rank 0's clock decides for every rank: they must run the same number of steps.
            if budget_s is not None and self._broadcast(self.clock() - t0 >= budget_s):
                break
        local = self.model_weights()
        delta = {n: torch.sub(start[n], local[n]) for n in local}
        samples = sum(r.num_samples for r in trained)
        return RoundResult(
            pseudo_gradient=delta, tokens=samples * L, trained=merge_ranges(trained),
            steps=len(losses), mean_loss=sum(losses) / len(losses) if losses else float("nan"),
            seconds=self.clock() - t0, losses=losses, folded_at=folded_at,
        )

    @torch.no_grad()
    def _fold(self, start: dict[str, torch.Tensor],
              fold: Callable[[], dict[str, torch.Tensor] | None] | None) -> tuple[dict[str, torch.Tensor], bool]:
        """One fold check between steps: if rank 0's `fold` has θ, model ← θ + (model − start) on every
        rank and θ is the new start. Rank 0 decides for all (they must fold at the same step)."""
        theta = fold() if self.rank == 0 and fold is not None else None
        if not self._broadcast(theta is not None):
            return start, False
        local = self.model_weights()  # a collective under FSDP: every rank takes part
        moved = {n: theta[n] + (local[n] - start[n]) for n in local} if theta is not None else None
        self._load_from_rank0(moved)
        # Only rank 0's pseudo-gradient is used: the other ranks keep their start (no collective).
        return (dict(theta) if theta is not None else start), True

    def _step(self, batch: torch.Tensor) -> float:
        """One optimizer step on this site's batch [batch_size, L]; returns the site-mean loss."""
        inner = self.cfg.inner
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(inner, self.step)
        mine = batch[self.rank::self.world].to(self.device, non_blocking=True)
        total = torch.zeros((), device=self.device)
        micro = list(mine.split(inner.micro_batch_size))  # fewer than accum only in a short last batch
        if self.fsdp:
            # Every forward is a collective under FSDP, so every rank runs as many micro-steps as the
            # rank with the most samples, also in an uneven short last batch (an empty one below).
            most = -(-len(batch) // self.world)
            micro = list(mine.tensor_split(-(-most // inner.micro_batch_size)))
        for i, x in enumerate(micro):
            last = i == len(micro) - 1
            # DDP all-reduces (FSDP reduce-scatters) on every backward unless told not to: only
            # the last micro-step syncs.
            sync = self.ddp.no_sync() if self.ddp is not None and not last else nullcontext()
            if self.fsdp:
                self.module.set_requires_gradient_sync(last)  # type: ignore[operator]
            with sync:
                with autocast(self.device, inner.autocast_bf16):
                    if len(x):
                        # Each micro-batch weighs by its share of this rank's samples (1/accum when full).
                        loss = self.net(input_ids=x, labels=x).loss / (len(mine) / len(x))
                    else:  # a padding step that counts for nothing (FSDP's uneven tail, a rank
                        # without a sample): every rank must run the collectives of a step
                        pad = batch[:1].to(self.device, non_blocking=True)
                        loss = self.net(input_ids=pad, labels=pad).loss * 0.0
                loss.backward()
            total += loss.detach()
        if inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), inner.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self.world > 1:
            dist.all_reduce(total)
            total /= self.world
        return float(total)

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self, state: dict[str, torch.Tensor] | None = None, batch_size: int = 16) -> float:
        """Held-out perplexity of `state` (default: the current weights) on the fixed held-out set.

        The model is left as it was: a round trained ahead (overlap) goes on from it, so the node's
        evaluation of the committed θ between two rounds must not replace it (peer/heldout.py). A
        collective under torch.distributed: every rank calls it, rank 0's `state` (or None) counts,
        and ranks evaluate interleaved slices of the set.
        """
        kept = self.model_weights() if self._broadcast(state is not None) else None
        if kept is not None:
            self._load_from_rank0(state)
        heldout, bf16 = self.heldout(), self.cfg.inner.autocast_bf16
        if self.fsdp:
            # Every forward is a collective under FSDP: all ranks evaluate the whole set together
            # (each its own copy of it), so their forward counts agree.
            ppl = perplexity(self.module, heldout, self.device, bf16, batch_size)
            # A forward without a backward leaves the root's parameters unsharded (FSDP2 keeps them
            # for the backward): shard them again, or loading weights and gathering them fail.
            self.module.reshard()  # type: ignore[operator]
        else:
            ppl = perplexity(self.module, heldout[self.rank::self.world], self.device, bf16, batch_size, self.world)
        if kept is not None:  # not after a failure: the worker ends a collective that failed (fatal)
            self._load_from_rank0(kept)
        return ppl

    def heldout(self) -> torch.Tensor:
        """The fixed held-out set: `eval_samples` samples, or every one a smaller held-out split has."""
        if self._heldout is None:
            self._heldout = self.index.corpus.heldout(self.cfg.eval_samples, at_most=True)
        return self._heldout


def _fully_shard(model: torch.nn.Module, device: torch.device, bf16: bool) -> None:
    """FSDP2 over the default process group: one unit per decoder layer, then the root (embeddings,
    final norm, the tied head). On accelerators the layers compute in bf16 and reduce gradients in
    fp32 over fp32 sharded master weights; CPU stays fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16 and device.type != "cpu" else MixedPrecisionPolicy())
    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def demo(steps: int = 20) -> None:
    """Train the tiny preset for a few steps on the shipped corpus and print loss and perplexity."""
    from peer.trainer.config import MODEL_PRESETS

    torch.set_num_threads(2)
    cfg = TrainerConfig(MODEL_PRESETS["tiny"], DataConfig.shipped(), InnerConfig(total_steps=steps, warmup_steps=5),
                        eval_samples=64)
    t = Trainer(cfg)
    theta = t.model_weights()
    print(f"held-out ppl at init: {t.evaluate(theta):.1f}")
    queue = [b.full_range() for b in t.index.epoch_order()]
    r = t.train_round(theta, queue, steps)
    print(f"{r.steps} steps, {r.tokens} tokens, loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}, {r.seconds:.1f}s")
    local = {n: theta[n] - r.pseudo_gradient[n] for n in theta}
    print(f"held-out ppl after: {t.evaluate(local):.1f}")
