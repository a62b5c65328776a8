"""Atomic checkpoints: the global model as a Hugging Face checkpoint, plus everything to resume.

Layout of a checkpoint directory:
    config.json, model.safetensors   `save_pretrained` of the global θ: `AutoModelForCausalLM.from_pretrained(dir)`
    outer_momentum.safetensors       the outer Nesterov buffers m (fp32; absent before the first round)
    inner_state.pt                   this site's AdamW state and inner step (site-local, optional)
    cursor.json                      the samples already trained, as merged (block_id, start, end) ranges
    meta.json                        free-form run metadata (round, epoch, hashes, ...)

Integrity: `meta["weights_hash"]` is the blake3 of θ (`peer/outer.py state_dict_hash`), the hash the
commit log names for the round (I7). `save_checkpoint` with `committed_hash` refuses to write a θ
that does not hash to it, and re-reads the model file it wrote before the checkpoint goes in place;
`load_checkpoint` refuses a checkpoint whose θ does not hash to its recorded hash. Either raises
`CheckpointMismatch`.

Atomicity: everything is written into a temporary sibling directory, each file fsynced, then the
directory is renamed into place (an existing checkpoint is first moved aside and deleted after the
rename), and the parent directory is fsynced. A crash leaves either the old or the new checkpoint,
never a mix.

Try it:
    .venv/bin/python -m pytest -q tests/unit/test_trainer_checkpoint.py
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from peer.durable import fsync_tree, replace_atomic
from peer.outer import state_dict_hash
from peer.trainer.blocks import SampleRange, merge_ranges
from peer.trainer.config import ModelConfig

MODEL_FILE = "model.safetensors"
MOMENTUM_FILE = "outer_momentum.safetensors"
INNER_FILE = "inner_state.pt"
CURSOR_FILE = "cursor.json"
META_FILE = "meta.json"


class CheckpointMismatch(ValueError):
    """A checkpoint's θ is not the θ the log committed (or recorded) for its round."""


@dataclass
class Checkpoint:
    weights: dict[str, torch.Tensor]
    """Global θ by parameter name (fp32)."""
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    inner_state: dict[str, Any] | None = None
    """`Trainer.inner_state()`; None when the checkpoint carries only global state."""
    cursor: list[SampleRange] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(path: str | Path, model_cfg: ModelConfig, ckpt: Checkpoint,
                    committed_hash: str | None = None) -> Path:
    """Write `ckpt` atomically to directory `path` (replacing any checkpoint there).

    With `committed_hash` (hex, the log's hash of θ for this round) the θ is checked against it
    before anything is written and, as written, before the checkpoint replaces the old one; it is
    recorded as `meta["weights_hash"]`."""
    path = Path(path)
    if committed_hash is not None:
        got = state_dict_hash(ckpt.weights)
        if got != committed_hash:
            raise CheckpointMismatch(
                f"{path}: θ to checkpoint has hash {got[:16]}, the log committed {committed_hash[:16]} for round "
                f"{ckpt.meta.get('round', '?')}: refusing to write a θ the mesh did not agree on (this peer must "
                "re-sync its state)")
        ckpt.meta = {**ckpt.meta, "weights_hash": committed_hash}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        # Imported here: the peer process needs transformers only to write a checkpoint, and its
        # import (5-10 s on a busy node) would otherwise delay every job's start-up.
        from transformers import Qwen3ForCausalLM

        from peer.trainer.model import hf_config

        # A meta-device model takes the tensors by reference (assign=True): no second copy of θ.
        with torch.device("meta"):
            model = Qwen3ForCausalLM(hf_config(model_cfg))
        model.load_state_dict(ckpt.weights, strict=False, assign=True)
        model.tie_weights()
        model.save_pretrained(tmp, safe_serialization=True)
        if ckpt.momentum:
            save_file({n: t.contiguous() for n, t in ckpt.momentum.items()}, tmp / MOMENTUM_FILE)
        if ckpt.inner_state is not None:
            torch.save(ckpt.inner_state, tmp / INNER_FILE)
        cursor = [[r.block_id, r.start, r.end] for r in merge_ranges(ckpt.cursor)]
        (tmp / CURSOR_FILE).write_text(json.dumps(cursor))
        (tmp / META_FILE).write_text(json.dumps(ckpt.meta, sort_keys=True, indent=1))
        fsync_tree(tmp)
        if committed_hash is not None:
            _verify(tmp, load_file(tmp / MODEL_FILE), committed_hash, "as written")
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old-"))
            os.replace(path, old / "ckpt")
        replace_atomic(tmp, path)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _verify(path: Path, weights: dict[str, torch.Tensor], want: str, what: str) -> None:
    got = state_dict_hash(weights)
    if got != want:
        raise CheckpointMismatch(f"{path}: θ {what} has hash {got[:16]}, its round's committed hash is {want[:16]}: "
                                 "the checkpoint is damaged; use an earlier one or write it again from a peer")


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint written by `save_checkpoint` (tensors on CPU); a θ that does not hash to
    the recorded `meta["weights_hash"]` raises CheckpointMismatch."""
    path = Path(path)
    weights = load_file(path / MODEL_FILE)
    momentum = load_file(path / MOMENTUM_FILE) if (path / MOMENTUM_FILE).exists() else {}
    inner = torch.load(path / INNER_FILE, weights_only=True) if (path / INNER_FILE).exists() else None
    cursor = [SampleRange(*r) for r in json.loads((path / CURSOR_FILE).read_text())]
    meta = json.loads((path / META_FILE).read_text())
    if "weights_hash" in meta:
        _verify(path, weights, str(meta["weights_hash"]), "on disk")
    return Checkpoint(weights=weights, momentum=momentum, inner_state=inner, cursor=cursor, meta=meta)
