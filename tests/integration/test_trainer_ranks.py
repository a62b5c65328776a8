"""A site of several ranks through the real launcher (peer/trainer/launch.py): 2 gloo ranks on CPU.

`TrainerProcess` spawns the launcher, which starts the ranks with torch.distributed.elastic; rank 0
serves the pipes. The 2-rank site's pseudo-gradient must equal a 1-rank site's for the same samples
and the same global batch; a rank killed with SIGKILL takes the job down (the call fails, naming
the rank); a rank that hangs (SIGSTOP) makes the collective time out, and the error names it.

Try it:
    .venv/bin/python -m pytest -q tests/integration/test_trainer_ranks.py
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from peer.trainer.config import MODEL_PRESETS, DataConfig, InnerConfig, RanksConfig, TrainerConfig
from peer.trainer.inner import SLOW_ENV
from peer.trainer.process import TrainerError, TrainerProcess
from peer.trainer.tensor_files import read_state, write_state

STEPS, BATCH, SEQ = 3, 8, 32
SLOWDOWN = 50
"""The kill tests' trainer steps take this many times as long (SLOW_ENV): see _train_then_kill."""


@pytest.fixture
def slow_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's steps take SLOWDOWN times as long (its ranks inherit the environment)."""
    monkeypatch.setenv(SLOW_ENV, str(SLOWDOWN))


def config(cache_dir: Path, ranks: int, timeout_s: float = 600.0, parallel: str = "ddp") -> TrainerConfig:
    data = DataConfig.shipped(max_documents=40, seq_len=SEQ, block_samples=16, heldout_per_mille=100,
                              cache_dir=str(cache_dir))
    # Global batch 8 either way: one rank x 8, or two ranks x 2 micro-steps x 2 samples.
    inner = InnerConfig(lr=3e-3, warmup_steps=1, total_steps=10, batch_size=BATCH,
                        micro_batch_size=BATCH // (2 * ranks) if ranks > 1 else BATCH, device="cpu")
    # wire="fp32": the worker hands Δ over in the wire dtype, and the ranks are compared at fp32 tolerance.
    return TrainerConfig(MODEL_PRESETS["micro"], data, inner, eval_samples=16,
                         ranks=RanksConfig(nproc_per_node=ranks, collective_timeout_s=timeout_s,
                                           parallel=parallel), wire="fp32")


async def _round(cfg: TrainerConfig, workdir: Path) -> tuple[dict[str, torch.Tensor], object, object]:
    proc = TrainerProcess(threads=1)
    hello = await proc.start(cfg, workdir)
    try:
        ranges = [(b, 0, n) for b, n in hello.blocks[:3]]
        out = await proc.train(1, hello.weights, ranges, STEPS, 0)
        return read_state(out.pseudo_gradient), out, hello
    finally:
        await proc.stop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_rank_site_delta_equals_one_rank_site_delta(tmp_path: Path, parallel: str) -> None:
    cache = tmp_path / "tokens"
    d1, out1, hello1 = asyncio.run(_round(config(cache, 1), tmp_path / "one"))
    d2, out2, hello2 = asyncio.run(_round(config(cache, 2, parallel=parallel), tmp_path / "two"))
    assert [r["rank"] for r in hello2.ranks] == [0, 1] and len(hello1.ranks) == 1  # type: ignore[attr-defined]
    assert (hello1.parallel, hello2.parallel) == ("none", parallel)  # type: ignore[attr-defined]
    assert hello1.weights_hash == hello2.weights_hash  # type: ignore[attr-defined]
    # The same samples, each trained once, and the same global batch: the same tokens and cursor.
    assert out1.tokens == out2.tokens == STEPS * BATCH * SEQ  # type: ignore[attr-defined]
    assert out1.trained == out2.trained  # type: ignore[attr-defined]
    for n, d in d1.items():
        # fp32 tolerance: the 2 ranks sum per-rank means, then all-reduce (see test_trainer_ddp.py).
        torch.testing.assert_close(d2[n], d, rtol=1e-4, atol=1e-5)
    assert out2.losses == pytest.approx(out1.losses, rel=1e-5)  # type: ignore[attr-defined]


async def _resumed_round(cfg: TrainerConfig, workdir: Path, evaluate: bool) -> tuple[dict[str, torch.Tensor],
                                                                                      float | None]:
    """Round 1 from θ_0, maybe an evaluation of θ_0 (as the leader evaluates the committed θ between
    rounds), then round 2 going on from the model (a round trained ahead): its Δ."""
    proc = TrainerProcess(threads=1)
    hello = await proc.start(cfg, workdir)
    try:
        (b1, _), (b2, _) = hello.blocks[:2]
        await proc.train(1, hello.weights, [(b1, 0, BATCH)], 1, 0)
        ppl = (await proc.evaluate(hello.weights)).perplexity if evaluate else None
        out = await proc.train(2, None, [(b2, 0, BATCH)], 1, 1)
        return read_state(out.pseudo_gradient), ppl
    finally:
        await proc.stop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_an_evaluation_between_rounds_leaves_every_ranks_model_as_it_was(tmp_path: Path, parallel: str) -> None:
    cache = tmp_path / "tokens"
    plain, _ = asyncio.run(_resumed_round(config(cache, 2, parallel=parallel), tmp_path / "plain", evaluate=False))
    evaluated, ppl = asyncio.run(_resumed_round(config(cache, 2, parallel=parallel), tmp_path / "eval", evaluate=True))
    _, one_rank = asyncio.run(_resumed_round(config(cache, 1), tmp_path / "one", evaluate=True))
    for n, d in plain.items():  # round 2 went on from round 1's model, not from the θ evaluated
        torch.testing.assert_close(evaluated[n], d)
    assert ppl == pytest.approx(one_rank, rel=1e-5)  # the ranks' slices add up to the whole set


async def _tail_round(cfg: TrainerConfig, workdir: Path, tail: int = 5) -> tuple[tuple, int]:
    proc = TrainerProcess(threads=1)
    hello = await proc.start(cfg, workdir)
    try:
        block = hello.blocks[0][0]
        # 2 full batches of 8, then the `tail` samples left (5: ranks get 3 and 2; 1: rank 1 none).
        out = await proc.train(1, hello.weights, [(block, 0, 16), (hello.blocks[1][0], 0, tail)], 5, 0)
        return out.trained, out.steps
    finally:
        await proc.stop()


@pytest.mark.timeout(600)
def test_fsdp_site_trains_an_uneven_last_batch(tmp_path: Path) -> None:
    cfg = config(tmp_path / "tokens", 2, timeout_s=20.0, parallel="fsdp")  # unequal forwards would hang
    trained, steps = asyncio.run(_tail_round(cfg, tmp_path / "w"))
    assert steps == 3
    assert sum(e - s for _, s, e in trained) == 21


@pytest.mark.timeout(600)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_last_batch_smaller_than_the_ranks_is_trained(tmp_path: Path, parallel: str) -> None:
    """The epoch's last sample at a 2-rank site: trained (rank 1 takes a step that counts for
    nothing), not left out, or the site takes it again every round and the epoch never ends."""
    cfg = config(tmp_path / "tokens", 2, timeout_s=20.0, parallel=parallel)  # a missing collective would hang
    trained, steps = asyncio.run(_tail_round(cfg, tmp_path / "w", tail=1))
    assert steps == 3
    assert sum(e - s for _, s, e in trained) == 17


def _rank_pid(hello: object, rank: int) -> int:
    return next(int(r["pid"]) for r in hello.ranks if r["rank"] == rank)  # type: ignore[attr-defined]


async def _train_then_kill(cfg: TrainerConfig, workdir: Path, sig: signal.Signals) -> str:
    """Start a round, send `sig` to rank 1 while it trains; the error of the call that fails."""
    proc = TrainerProcess(threads=1)
    hello = await proc.start(cfg, workdir)
    victim = _rank_pid(hello, 1)
    try:
        ranges = [(b, 0, n) for b, n in hello.blocks[:40]]
        weights = write_state(proc.shm_dir / "base.safetensors", read_state(hello.weights))  # type: ignore[operator]
        # The round must outlast the wait before the kill on any machine. Asking for many steps does
        # not do it: the test corpus holds ~80 steps' worth, which a quiet fast machine trained in
        # under the second waited below, and the call then rightly raised nothing. So the steps are
        # slowed down (the slow_steps fixture): 80 steps of >= 1 ms each take >= 4 s.
        assert os.environ.get(SLOW_ENV) == str(SLOWDOWN), "a kill test must use the slow_steps fixture"
        train = asyncio.ensure_future(proc.train(1, weights, ranges, 600, 0))
        await asyncio.sleep(1.0)  # into the round's steps
        os.kill(victim, sig)
        with pytest.raises(TrainerError) as err:
            await asyncio.wait_for(train, 300)
        if sig is signal.SIGSTOP:
            # The call failed: let the hung rank go on, so the launcher's SIGTERM ends it now rather
            # than after its 30 s grace period (measured: exit 30 s later with the rank still stopped).
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
        # Either rank 0 saw its peer go (an out-of-step reply) or the launcher stopped it first (the
        # worker died): both are fatal, and the whole job exits.
        assert err.value.fatal
        assert await asyncio.wait_for(proc.exited(), 120) != 0
        print(err.value)
        return str(err.value) + "\n" + proc.log_path.read_text()  # type: ignore[union-attr]
    finally:
        if sig is signal.SIGSTOP:
            with contextlib.suppress(ProcessLookupError):  # the launcher killed it already
                os.kill(victim, signal.SIGCONT)
        await proc.stop()


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("slow_steps")
def test_killed_rank_takes_the_site_job_down_and_is_named(tmp_path: Path) -> None:
    error = asyncio.run(_train_then_kill(config(tmp_path / "tokens", 2), tmp_path / "w", signal.SIGKILL))
    assert re.search(r"trainer rank 1 \(pid \d+\) failed: signal SIGKILL", error), error


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("slow_steps")
def test_hung_rank_times_out_the_collective_and_is_named(tmp_path: Path) -> None:
    cfg = config(tmp_path / "tokens", 2, timeout_s=5.0)
    error = asyncio.run(_train_then_kill(cfg, tmp_path / "w", signal.SIGSTOP))
    assert "rank 0/2" in error, error  # the rank that timed out names itself...
    assert re.search(r"[Rr]ank 1\b.*monitoredBarrier|monitoredBarrier.*[Rr]ank 1\b", error), error  # ...and the hung one


def test_batch_must_split_evenly_over_the_ranks(tmp_path: Path) -> None:
    cfg = config(tmp_path, 2)
    with pytest.raises(ValueError, match="multiple of nproc_per_node=2"):
        dataclasses.replace(cfg, inner=dataclasses.replace(cfg.inner, batch_size=6, micro_batch_size=2))
    with pytest.raises(ValueError, match="launcher"):
        RanksConfig(launcher="mpirun")
