"""θ and the outer momentum on disk: the applied state a restarted peer starts from, and checkpoints.

`<data dir>/state/weights-<round>.safetensors` holds θ and m of a round; the applied pointer
(applied_pointer.py) names the newest one with its log index, and moves only after the weights file
is durable, so a crash never leaves a pointer to a half-written state. Checkpoints are Hugging Face directories under
`<data dir>/checkpoints/`, `latest` a symlink to the newest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from peer.applied_pointer import Applied, AppliedPointer
from peer.durable import replace_atomic, temp_sibling
from peer.trainer.checkpoint import Checkpoint, save_checkpoint
from peer.trainer.config import ModelConfig

MOMENTUM_PREFIX = "outer_momentum."


@dataclass(frozen=True)
class AppliedState:
    """θ_round and m_round of the round applied at log index `index`."""

    index: int
    round: int
    weights: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]


def state_tensors(weights: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """θ and m as one dict (what is written and what peers serve each other)."""
    return {**weights, **{MOMENTUM_PREFIX + n: t for n, t in momentum.items()}}


def split_state(both: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The inverse of state_tensors: (θ, outer momentum)."""
    weights = {n: t for n, t in both.items() if not n.startswith(MOMENTUM_PREFIX)}
    momentum = {n[len(MOMENTUM_PREFIX):]: t for n, t in both.items() if n.startswith(MOMENTUM_PREFIX)}
    return weights, momentum


class ThetaStore:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self._pointer = AppliedPointer(self.dir)

    def pointer(self) -> tuple[int, int]:
        """(log index, round) of the state on disk; (0, 0) before the first round."""
        return self._pointer.pointer()

    def load(self) -> AppliedState | None:
        """The applied state on disk, or None before the first round. Blocking."""
        pointer = self._pointer.load()
        if not pointer.file:
            return None
        weights, momentum = split_state(load_file(self.dir / pointer.file))
        return AppliedState(pointer.index, pointer.round, weights, momentum)

    def persist(self, state: AppliedState) -> None:
        """Writes the state durably, then moves the pointer to it and deletes the older one. Blocking."""
        name = f"weights-{state.round:06d}.safetensors"
        tensors = state_tensors(state.weights, state.momentum)
        tmp = temp_sibling(self.dir / name)
        save_file({n: t.contiguous() for n, t in tensors.items()}, tmp)
        replace_atomic(tmp, self.dir / name)
        self._pointer.save(Applied(state.index, state.round, name))
        for old in self.dir.glob("weights-*.safetensors"):
            if old.name != name:
                old.unlink()

    def checkpoint(self, model: ModelConfig, state: AppliedState, site: str, weights_hash: bytes) -> Path:
        """A Hugging Face checkpoint of θ (+ outer momentum) that from_pretrained loads. Blocking."""
        target = self.dir.parent / "checkpoints" / f"round-{state.round:06d}"
        ckpt = Checkpoint(weights=state.weights, momentum=state.momentum, meta={"round": state.round, "site": site})
        # weights_hash is the log's hash of θ_round (apply and catch_up checked it): the checkpoint
        # is refused unless θ, as held and as written, still hashes to it.
        save_checkpoint(target, model, ckpt, weights_hash.hex())
        latest = self.dir.parent / "checkpoints" / "latest"
        tmp = temp_sibling(latest)
        tmp.symlink_to(target.name)
        replace_atomic(tmp, latest)
        return target
