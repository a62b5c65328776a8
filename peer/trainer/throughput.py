"""Inner-loop throughput: the site trainer against a bare torch loop, and a site's ranks, measured.

Used by `scripts/bench_inner` (CPU here, GPU where present) and `scripts/gpu_check`. The bare loop
is what a person would write by hand for the same model, batch and optimizer: the same seeded
Qwen3, AdamW with the same groups and hyper-parameters, the same clipping and autocast, the same
batches already in memory, no schedule, no accounting, no pseudo-gradient. The site trainer runs
`Trainer.train_round` as the node does (load θ, H steps reading samples from the block index,
Δ = θ − θ_H). Both are timed in the same process, alternating, best of `repeats`, so that a
machine shared with other work slows both alike.

    .venv/bin/python scripts/bench_inner
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from peer.trainer.blocks import take_samples
from peer.trainer.config import RanksConfig, TrainerConfig
from peer.trainer.inner import Trainer
from peer.trainer.model import autocast, build_model


@dataclass(frozen=True)
class InnerVsBare:
    site_samples_per_s: float
    bare_samples_per_s: float
    site_step_s: float
    """Seconds per inner step of the site trainer (best repeat), Δ and weight loading included."""
    bare_step_s: float
    peak_memory_bytes: int
    """Accelerator memory high-water mark over both loops (0 on CPU)."""
    site_cpu_s: float = 0.0
    """CPU seconds of this process in the best site repeat: on a machine shared with other work
    the CPU time of a 1-thread CPU loop is steadier than its wall time."""
    bare_cpu_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.site_samples_per_s / self.bare_samples_per_s

    @property
    def cpu_ratio(self) -> float:
        """bare CPU time / site CPU time for the same samples (1.0: the trainer costs nothing extra)."""
        return self.bare_cpu_s / self.site_cpu_s if self.site_cpu_s else math.nan


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bare_loop(cfg: TrainerConfig, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model(cfg.model, device, seed=cfg.inner.seed)
    model.train()
    inner = cfg.inner
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": inner.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=inner.lr, betas=inner.betas, eps=inner.eps, fused=device.type == "cuda")
    return (torch.compile(model) if inner.compile else model), opt


def _bare_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, cfg: TrainerConfig, device: torch.device,
                batches: list[torch.Tensor]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of the bare loop over `batches`."""
    inner = cfg.inner
    _sync(device)
    c0, t0 = time.process_time(), time.perf_counter()
    for batch in batches:
        x = batch.to(device, non_blocking=True)
        parts = x.split(inner.micro_batch_size)
        for part in parts:
            with autocast(device, inner.autocast_bf16):
                loss = model(input_ids=part, labels=part).loss / len(parts)
            loss.backward()
        if inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), inner.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)
    return time.perf_counter() - t0, time.process_time() - c0


def inner_vs_bare(cfg: TrainerConfig, steps: int, repeats: int = 3) -> InnerVsBare:
    """Samples per second of `Trainer.train_round` and of the bare loop, same model/batch/optimizer."""
    trainer = Trainer(cfg)
    device = trainer.device
    theta = trainer.model_weights()
    queue = [b.full_range() for b in trainer.index.epoch_order()]
    need = steps * cfg.inner.batch_size * (repeats + 1)
    if sum(r.num_samples for r in queue) < need:
        raise ValueError(f"the corpus has fewer than the {need} samples the bench needs: use fewer --steps")
    rounds = []
    for _ in range(repeats + 1):
        ranges, queue = take_samples(queue, steps * cfg.inner.batch_size)
        rounds.append(ranges)
    batches = []
    for ranges in rounds:
        rest, per_round = ranges, []
        for _ in range(steps):
            b, rest = take_samples(rest, cfg.inner.batch_size)
            per_round.append(trainer.index.read_ranges(b))
        batches.append(per_round)
    model, opt = _bare_loop(cfg, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # Warm-up (allocator, kernels, compile) on the first slice, timed neither.
    trainer.train_round(theta, rounds[0], steps)
    _bare_steps(model, opt, cfg, device, batches[0])
    site_s = bare_s = site_cpu = bare_cpu = math.inf
    for i in range(1, repeats + 1):
        _sync(device)
        c0, t0 = time.process_time(), time.perf_counter()
        trainer.train_round(theta, rounds[i], steps)
        _sync(device)
        site_s, site_cpu = min(site_s, time.perf_counter() - t0), min(site_cpu, time.process_time() - c0)
        wall, cpu = _bare_steps(model, opt, cfg, device, batches[i])
        bare_s, bare_cpu = min(bare_s, wall), min(bare_cpu, cpu)
    samples = steps * cfg.inner.batch_size
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return InnerVsBare(samples / site_s, samples / bare_s, site_s / steps, bare_s / steps, peak, site_cpu, bare_cpu)


async def _site_round_seconds(cfg: TrainerConfig, workdir: Path, steps: int, repeats: int) -> float:
    """Best `Trainer.train_round` time of a site started as the node starts it (launcher, ranks)."""
    from peer.trainer.process import TrainerProcess

    proc = TrainerProcess(threads=1)
    hello = await proc.start(cfg, workdir)
    try:
        queue = [(b, 0, n) for b, n in hello.blocks]
        per_round = steps * cfg.inner.batch_size
        best = math.inf
        offset = 0
        for i in range(repeats + 1):
            ranges, taken = [], 0
            while taken < per_round:
                b, s, e = queue[offset]
                ranges.append((b, s, e))
                taken += e - s
                offset += 1
            out = await proc.train(i + 1, hello.weights, ranges, steps, 0)
            out.pseudo_gradient.unlink(missing_ok=True)
            if i:  # the first round warms up
                best = min(best, out.seconds)
        return best
    finally:
        await proc.stop()


def ranks_vs_one(cfg: TrainerConfig, ranks: int, workdir: Path, steps: int, repeats: int = 2) -> tuple[float, float]:
    """Samples per second of a 1-rank site and of a `ranks`-rank site (same global batch), both
    started through the launcher with one torch thread per rank."""
    one = replace(cfg, ranks=RanksConfig(nproc_per_node=1))
    micro = max(1, cfg.inner.batch_size // ranks)
    many = replace(cfg, inner=replace(cfg.inner, micro_batch_size=micro),
                   ranks=replace(cfg.ranks, nproc_per_node=ranks))
    samples = steps * cfg.inner.batch_size
    s1 = asyncio.run(_site_round_seconds(one, workdir / "one", steps, repeats))
    sn = asyncio.run(_site_round_seconds(many, workdir / "many", steps, repeats))
    return samples / s1, samples / sn
