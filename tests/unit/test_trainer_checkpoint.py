"""Checkpoints: HF-loadable round trip, atomic replacement, and resume == no stop (bit for bit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import peer.trainer.checkpoint as ckpt_mod
from peer.outer import outer_step, state_dict_hash
from peer.trainer.blocks import BlockIndex, SampleRange, subtract_ranges, take_samples
from peer.trainer.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from peer.trainer.config import MODEL_PRESETS, DataConfig, InnerConfig, TrainerConfig
from peer.trainer.inner import Trainer

MICRO = MODEL_PRESETS["micro"]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> BlockIndex:
    torch.set_num_threads(1)  # see test_trainer_train.py: two threads thrash on a busy 2-core box
    data = DataConfig.shipped(max_documents=40, seq_len=32, block_samples=16, heldout_per_mille=100,
                              cache_dir=str(tmp_path_factory.mktemp("tokens")))
    return BlockIndex(data)


def trainer(index: BlockIndex) -> Trainer:
    inner = InnerConfig(lr=3e-3, warmup_steps=2, total_steps=12, batch_size=8, micro_batch_size=4)
    return Trainer(TrainerConfig(MICRO, index.cfg, inner, eval_samples=16), index=index)


def test_round_trip_and_hf_loads_it(index: BlockIndex, tmp_path: Path) -> None:
    t = trainer(index)
    theta = t.model_weights()
    r = t.train_round(theta, [b.full_range() for b in index.epoch_order()[:2]], 3)
    theta, momentum = outer_step(theta, {}, [(r.pseudo_gradient, r.tokens)])
    ck = Checkpoint(weights=theta, momentum=momentum, inner_state=t.inner_state(), cursor=r.trained,
                    meta={"round": 1, "hash": state_dict_hash(theta)})
    save_checkpoint(tmp_path / "ck", MICRO, ck)
    back = load_checkpoint(tmp_path / "ck")
    assert state_dict_hash(back.weights) == state_dict_hash(theta)
    assert state_dict_hash(back.momentum) == state_dict_hash(momentum)
    assert back.cursor == r.trained and back.meta == ck.meta
    assert back.inner_state is not None and back.inner_state["step"] == 3
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ck")
    t.load_global(theta)
    x = index.read(index.blocks[0].full_range())[:2]
    assert torch.equal(hf(input_ids=x).logits, t.module(input_ids=x).logits)


def test_save_is_atomic(index: BlockIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    theta = trainer(index).model_weights()
    save_checkpoint(tmp_path / "ck", MICRO, Checkpoint(theta, meta={"round": 1}))
    cursor = [SampleRange(5, 0, 3), SampleRange(5, 3, 7)]

    def broken(*a: object, **k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "ck", MICRO, Checkpoint(theta, momentum=theta, meta={"round": 2}))
    assert load_checkpoint(tmp_path / "ck").meta == {"round": 1}  # the old one, intact
    monkeypatch.undo()
    save_checkpoint(tmp_path / "ck", MICRO, Checkpoint(theta, cursor=cursor, meta={"round": 2}))
    assert load_checkpoint(tmp_path / "ck").cursor == [SampleRange(5, 0, 7)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temp or old directories left


def run_rounds(t: Trainer, theta: dict, momentum: dict, queue: list[SampleRange], rounds: int) -> tuple:
    for _ in range(rounds):
        ranges, queue = take_samples(queue, 3 * 8)  # 24 samples: blocks of 16 end mid-round
        r = t.train_round(theta, ranges, 3)
        theta, momentum = outer_step(theta, momentum, [(r.pseudo_gradient, r.tokens)])
    return theta, momentum, queue


def test_resume_gives_the_same_next_step_as_no_stop(index: BlockIndex, tmp_path: Path) -> None:
    queue = [b.full_range() for b in index.epoch_order()]
    straight = trainer(index)
    theta, momentum, rest = run_rounds(straight, straight.model_weights(), {}, queue, 3)
    trained = subtract_ranges(queue, rest)  # the cursor: what rounds 1-3 consumed (4.5 blocks)
    assert trained[-1].num_samples == 8
    save_checkpoint(tmp_path / "ck", MICRO, Checkpoint(theta, momentum, straight.inner_state(), trained))
    want, _, _ = run_rounds(straight, theta, momentum, rest, 1)

    resumed = trainer(index)  # a new process: fresh model and optimizer
    ck = load_checkpoint(tmp_path / "ck")
    assert ck.inner_state is not None
    resumed.load_inner_state(ck.inner_state)
    todo = subtract_ranges(queue, ck.cursor)
    assert todo == rest
    got, _, _ = run_rounds(resumed, ck.weights, ck.momentum, todo, 1)
    assert state_dict_hash(got) == state_dict_hash(want)


def test_a_checkpoint_of_an_uncommitted_theta_is_refused(index: BlockIndex, tmp_path: Path) -> None:
    """θ is compared with the log's hash on write (as held, and as read back) and on load."""
    theta = trainer(index).model_weights()
    committed = state_dict_hash(theta)
    bad = {n: t.clone() for n, t in theta.items()}
    name = min(bad)
    bad[name].view(-1).view(torch.int32)[0] ^= 1  # one bit: a memory error after the hash check
    with pytest.raises(ckpt_mod.CheckpointMismatch, match="the log committed"):
        save_checkpoint(tmp_path / "ck", MICRO, Checkpoint(bad, meta={"round": 4}), committed)
    assert not (tmp_path / "ck").exists(), "nothing written"

    save_checkpoint(tmp_path / "ck", MICRO, Checkpoint(theta, meta={"round": 4}), committed)
    assert load_checkpoint(tmp_path / "ck").meta["weights_hash"] == committed
    # The model file damaged on disk afterwards: loading it is refused with the reason.
    from safetensors.torch import load_file, save_file

    stored = load_file(tmp_path / "ck" / ckpt_mod.MODEL_FILE)
    key = min(stored)
    stored[key] = stored[key].clone()
    stored[key].view(-1).view(torch.int32)[0] ^= 1
    save_file(stored, tmp_path / "ck" / ckpt_mod.MODEL_FILE, metadata={"format": "pt"})
    with pytest.raises(ckpt_mod.CheckpointMismatch, match="the checkpoint is damaged"):
        load_checkpoint(tmp_path / "ck")


def test_a_write_that_does_not_round_trip_is_refused(index: BlockIndex, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The model file as written is hashed before the checkpoint goes in place: a writer that
    changed θ (here: it stores bf16-rounded weights) leaves the old checkpoint in place."""
    theta = trainer(index).model_weights()
    committed = state_dict_hash(theta)
    save_checkpoint(tmp_path / "ck", MICRO, Checkpoint(theta, meta={"round": 1}), committed)
    real = ckpt_mod.load_file

    def rounded(path: object, *a: object, **k: object) -> dict[str, torch.Tensor]:
        return {n: t.to(torch.bfloat16).to(torch.float32) for n, t in real(path, *a, **k).items()}  # type: ignore[arg-type]

    monkeypatch.setattr(ckpt_mod, "load_file", rounded)
    with pytest.raises(ckpt_mod.CheckpointMismatch, match="as written"):
        save_checkpoint(tmp_path / "ck", MICRO, Checkpoint(theta, meta={"round": 2}), committed)
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "ck").meta["round"] == 1, "the old checkpoint, intact"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
