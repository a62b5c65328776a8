"""The trainer worker subprocess driven by `TrainerProcess`: real process, real pipes, micro model.

One worker serves the module's tests in turn: starting one (mostly importing torch and
transformers) is the main cost on a loaded 2-core box. The kill -9, node-death and bad-config
tests start their own.

Try it:
    .venv/bin/python -m pytest -q tests/integration/test_trainer_process.py
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from peer.outer import state_dict_hash
from peer.trainer.checkpoint import load_checkpoint
from peer.trainer.config import MODEL_PRESETS, REPO_ROOT, DataConfig, InnerConfig, TrainerConfig
from peer.trainer.model import build_model, count_parameters, weights
from peer.trainer.process import (
    LOG_FILE,
    Hello,
    TrainerError,
    TrainerProcess,
    default_shm_dir,
)
from peer.trainer.tensor_files import read_state, write_state

MICRO = MODEL_PRESETS["micro"]
BATCH, SEQ = 8, 32


def config(cache_dir: Path, **data: object) -> TrainerConfig:
    # The unit tests' data: 40 documents, 32-token samples, 16-sample blocks -> ~180 blocks.
    base: dict[str, object] = dict(max_documents=40, seq_len=SEQ, block_samples=16, heldout_per_mille=100,
                                   cache_dir=str(cache_dir))
    base.update(data)
    # device="cpu" even where a GPU is present: the assertions below rely on fp32 CPU determinism.
    inner = InnerConfig(lr=3e-3, warmup_steps=1, total_steps=20, batch_size=BATCH, micro_batch_size=BATCH,
                        device="cpu")
    return TrainerConfig(MICRO, DataConfig.shipped(**base), inner, eval_samples=16)  # type: ignore[arg-type]


def test_config_survives_the_json_the_worker_reads(tmp_path: Path) -> None:
    cfg = config(tmp_path, heldout_shards=("a.jsonl", "b.jsonl"))
    again = TrainerConfig.from_json(cfg.to_json())
    assert again == cfg and isinstance(again.data.shards, tuple) and isinstance(again.inner.betas, tuple)
    with pytest.raises(ValueError, match="unknown fields"):
        TrainerConfig.from_dict({**cfg.to_dict(), "inner": {"learning_rate": 1.0}})


@dataclass
class Started:
    loop: asyncio.AbstractEventLoop
    proc: TrainerProcess
    hello: Hello
    dir: Path

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # No pytest-asyncio here: one loop owns the module's worker (its pipes are bound to a loop).
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def worker(loop: asyncio.AbstractEventLoop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    root = tmp_path_factory.mktemp("trainer-worker")
    proc = TrainerProcess(threads=1)  # one thread: two thrash on a busy 2-core box (test_trainer_train.py)
    hello = loop.run_until_complete(proc.start(config(root / "tokens"), root / "work"))
    yield Started(loop, proc, hello, root)
    shm = proc.shm_dir
    assert loop.run_until_complete(proc.stop()) == 0
    assert shm is not None and not shm.exists()


def test_hello_names_the_seeded_init_every_site_shares(worker: Started) -> None:
    h = worker.hello
    model = build_model(MICRO, seed=0)
    assert h.weights_hash == state_dict_hash(weights(model))
    assert state_dict_hash(read_state(h.weights)) == h.weights_hash
    assert h.parameters == count_parameters(model)
    assert h.seq_len == SEQ and h.device == "cpu"
    assert len(h.blocks) > 20 and all(0 < n <= 16 for _, n in h.blocks)
    assert len({b for b, _ in h.blocks}) == len(h.blocks)


def test_two_steps_return_a_pseudo_gradient_of_what_was_trained(worker: Started) -> None:
    (b0, n0), (b1, n1) = worker.hello.blocks[:2]
    given = [(b0, 3, n0), (b1, 0, n1)]
    assert (n0 - 3) + n1 > 2 * BATCH  # more than the two steps asked for: the rest stays untrained
    out = worker.run(worker.proc.train(1, worker.hello.weights, given, steps=2, start_step=0))
    assert out.steps == 2 and out.tokens == 2 * BATCH * SEQ
    assert len(out.losses) == 2
    assert 7.0 < out.mean_loss < 9.5  # ~ln(4096) = 8.3 at random init
    trained = {(b, i) for b, s, e in out.trained for i in range(s, e)}
    assert len(trained) == 2 * BATCH
    assert trained <= {(b, i) for b, s, e in given for i in range(s, e)}
    theta0, delta = read_state(worker.hello.weights), read_state(out.pseudo_gradient)
    assert delta.keys() == theta0.keys()
    # Handed over in the wire dtype (bf16 by default, config.HANDOFF_DTYPES): the node encodes it in place.
    assert all(t.dtype == torch.bfloat16 and torch.isfinite(t).all() for t in delta.values())
    assert any(t.abs().max() > 0 for t in delta.values())
    # θ_local = θ_0 − Δ is the better model on held-out data than θ_0.
    local = write_state(worker.dir / "local.safetensors", {n: theta0[n] - delta[n] for n in theta0})
    before = worker.run(worker.proc.evaluate(worker.hello.weights)).perplexity
    after = worker.run(worker.proc.evaluate(local)).perplexity
    assert math.isfinite(before) and before == pytest.approx(4096, rel=0.5)
    assert after < before


def test_inner_optimizer_state_persists_across_rounds(worker: Started) -> None:
    # Same θ, same samples, same LR step twice: only the AdamW moments carried over can differ.
    b, n = worker.hello.blocks[5]
    first = worker.run(worker.proc.train(7, worker.hello.weights, [(b, 0, BATCH)], steps=1, start_step=3))
    d1 = read_state(first.pseudo_gradient)
    second = worker.run(worker.proc.train(8, worker.hello.weights, [(b, 0, BATCH)], steps=1, start_step=3))
    d2 = read_state(second.pseudo_gradient)
    assert first.losses == second.losses  # the same forward pass
    assert any(not torch.equal(d1[k], d2[k]) for k in d1)


def test_checkpoint_loads_with_transformers(worker: Started) -> None:
    theta = read_state(worker.hello.weights)
    theta = {n: t * 0.5 for n, t in theta.items()}
    w = write_state(worker.dir / "theta.safetensors", theta)
    m = write_state(worker.dir / "momentum.safetensors",
                    {n: torch.full_like(t, 0.25) for n, t in theta.items()})
    b, n = worker.hello.blocks[0]
    ckpt_dir = worker.dir / "ckpt"
    got = worker.run(worker.proc.checkpoint(w, ckpt_dir, round=3, momentum_path=m, cursor=[(b, 0, n)],
                                            extra={"epoch": 2, "round": 99}))
    assert got == ckpt_dir
    hf = AutoModelForCausalLM.from_pretrained(ckpt_dir)
    assert state_dict_hash(weights(hf)) == state_dict_hash(theta)
    ck = load_checkpoint(ckpt_dir)
    assert ck.meta == {"epoch": 2, "round": 3, "weights_hash": state_dict_hash(theta)}
    assert ck.inner_state is not None and ck.inner_state["step"] > 0
    assert [(r.block_id, r.start, r.end) for r in ck.cursor] == [(b, 0, n)]
    assert torch.equal(ck.momentum["model.norm.weight"], torch.full_like(theta["model.norm.weight"], 0.25))


def test_bad_commands_get_a_clear_error_and_the_worker_keeps_serving(worker: Started) -> None:
    p, h = worker.proc, worker.hello
    (b, n), foreign = h.blocks[0], h.blocks[0][0] ^ (1 << 60)

    def error(coro) -> str:  # type: ignore[no-untyped-def]
        with pytest.raises(TrainerError) as e:
            worker.run(coro)
        return str(e.value)

    assert "does not belong to this data config" in error(p.train(1, h.weights, [(foreign, 0, 4)], 1))
    assert "ends past the block's" in error(p.train(1, h.weights, [(b, 0, n + 1)], 1))
    assert "ranges overlap" in error(p.train(1, h.weights, [(b, 0, 8), (b, 4, 12)], 1))
    assert "does not exist" in error(p.evaluate(worker.dir / "nowhere.safetensors"))
    theta = read_state(h.weights)
    theta["model.norm.weight"] = torch.ones(3)
    wrong = write_state(worker.dir / "wrong.safetensors", theta)
    assert ("model.norm.weight is torch.float32 (3,), model micro needs torch.float32 (32,)"
            in error(p.evaluate(wrong)))
    assert "unknown command 'fly'" in error(p._call({"cmd": "fly"}))
    no_steps = {"cmd": "train", "round": 1, "weights": "x", "ranges": []}
    assert "missing field 'steps'" in error(p._call(no_steps))
    assert "budget_s must be null or seconds > 0, got -1" in error(p.train(1, h.weights, [(b, 0, 4)], 1, budget_s=-1))
    assert worker.run(p.train(1, h.weights, [(b, 0, 8)], 4, budget_s=1e-6)).steps == 1  # a time box
    assert math.isfinite(worker.run(p.evaluate(h.weights)).perplexity)  # still serving


def test_a_cancelled_call_does_not_hand_its_late_reply_to_the_next(worker: Started) -> None:
    async def scenario() -> float:
        b, n = worker.hello.blocks[0]
        train = asyncio.ensure_future(worker.proc.train(2, worker.hello.weights, [(b, 0, n)], steps=2))
        await asyncio.sleep(0)  # the command is on the pipe; the worker is busy with it
        train.cancel()
        # The worker still answers the train first; that reply must be skipped, not returned here.
        return (await worker.proc.evaluate(worker.hello.weights)).perplexity

    assert math.isfinite(worker.run(scenario()))


def _hold_pipe_write_ends(pid: int) -> list[int]:
    """Open the write ends of `pid`'s pipes (its reply pipe) as a forked child of it would hold them:
    its death then brings no EOF to the reader, only an exit status."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # a short-lived descriptor (a file being read) closed meanwhile; the pipe stays
        if target.startswith("pipe:") and flags & os.O_ACCMODE == os.O_WRONLY:
            held.append(os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY))
    return held


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_fails_the_pending_and_every_later_call(tmp_path: Path) -> None:
    async def scenario() -> list[str]:
        proc = TrainerProcess(threads=1)
        hello = await proc.start(config(tmp_path / "tokens"), tmp_path / "work")
        everything = [(b, 0, n) for b, n in hello.blocks]
        pending = asyncio.ensure_future(proc.train(1, hello.weights, everything, steps=10_000))
        queued = asyncio.ensure_future(proc.evaluate(hello.weights))  # waits for the lock
        await asyncio.sleep(0)  # let `pending` send its command and wait for the reply
        assert proc.pid is not None
        held = _hold_pipe_write_ends(proc.pid)
        assert held, "found no reply pipe to hold"
        try:
            os.kill(proc.pid, signal.SIGKILL)
            errors = []
            for call in (pending, queued, proc.evaluate(hello.weights)):
                with pytest.raises(TrainerError) as e:
                    await asyncio.wait_for(call, 30)
                errors.append(str(e.value))
            assert await asyncio.wait_for(proc.stop(), 30) == -signal.SIGKILL
        finally:
            for fd in held:
                os.close(fd)
        return errors

    pending, queued, later = asyncio.run(scenario())
    assert "died during 'train': killed by SIGKILL (exit -9)" in pending
    assert "trainer ready" in pending  # the log tail comes with it
    assert queued == later == pending


# A stand-in for the node: starts a worker on a long round, prints the worker's pid, waits forever.
FAKE_NODE = """
import asyncio, sys
from pathlib import Path
from peer.trainer.config import TrainerConfig
from peer.trainer.process import TrainerProcess

async def main() -> None:
    proc = TrainerProcess(threads=1)
    hello = await proc.start(TrainerConfig.from_json(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
    asyncio.ensure_future(proc.train(1, hello.weights, [(b, 0, n) for b, n in hello.blocks], 10_000))
    await asyncio.sleep(0)
    print(proc.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    """Running, and not a zombie (a container's pid 1 may never reap the orphan)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_worker_mid_round_dies_with_its_node(tmp_path: Path) -> None:
    # The tiny preset over the whole corpus: a round of ~20 s, far longer than the wait below, so
    # only the death signal (not the end of stdin after the round) can end the worker in time.
    cfg = config(tmp_path / "tokens")
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(TrainerConfig(MODEL_PRESETS["tiny"], cfg.data, cfg.inner, eval_samples=16).to_json())
    node = subprocess.Popen([sys.executable, "-c", FAKE_NODE, str(cfg_path), str(tmp_path / "work")],
                            stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        assert node.stdout is not None
        pid = int(node.stdout.readline())
    finally:
        node.kill()
        node.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphan = _alive(pid)
    if orphan:
        os.kill(pid, signal.SIGKILL)
    # Nobody stopped this worker: its files stay in RAM until the node restarts (start clears them).
    shutil.rmtree(default_shm_dir(tmp_path / "work"), ignore_errors=True)
    assert not orphan, "the worker outlived its node"
    log = (tmp_path / "work" / LOG_FILE).read_text()
    assert "round 1:" not in log and "stdin closed" not in log


def test_a_config_the_worker_cannot_build_fails_start_with_the_reason(tmp_path: Path) -> None:
    cfg = config(tmp_path / "tokens")
    missing = DataConfig(shards=(str(tmp_path / "missing.jsonl"),), cache_dir=str(tmp_path))
    cfg = TrainerConfig(cfg.model, missing, cfg.inner, eval_samples=16)
    proc = TrainerProcess(threads=1)
    with pytest.raises(TrainerError) as e:
        asyncio.run(proc.start(cfg, tmp_path / "work"))
    assert "died during 'hello': exit code 2" in str(e.value) and "missing.jsonl" in str(e.value)
    assert proc.shm_dir is not None and not proc.shm_dir.exists()
