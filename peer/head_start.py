"""What a training peer sets going before it imports torch: its data dir's lock and its trainer.

A job's fixed cost is paid twice over at start: the peer imports torch, numba and grpc (2 s on an
idle node, 8 s on the soak's loaded one, more from a parallel file system), and its trainer worker
imports torch and transformers and builds the model (4 s idle, 16 s loaded). Spawned from the node,
the worker began only after the peer's imports; spawned from here, before them, the two overlap
(docs/decisions/trainer-head-start.md). The lock comes first: the worker clears and writes files in
the data dir, which must not be another live peer's.

    .venv/bin/python -m pytest -q tests/integration/test_head_start.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from peer.applied_pointer import state_dir
from peer.config import PeerConfig
from peer.dirlock import lock_dir
from peer.trainer.process import TrainerProcess

__all__ = ["HeadStart", "head_start"]


@dataclass
class HeadStart:
    """The held lock and the spawned (not yet ready) trainer, handed to `Node`, which owns them."""

    lock: IO[str]
    trainer: TrainerProcess | None
    """None for a peer that does not train."""

    async def close(self) -> None:
        """For a peer that fails before its node takes these over: stop the worker, drop the lock."""
        try:
            if self.trainer is not None:
                await self.trainer.stop()
        finally:
            self.lock.close()


async def head_start(config: PeerConfig) -> HeadStart | None:
    """Lock `config.data_dir` (DirLocked, an OSError, if another peer holds it) and spawn the
    trainer worker there; None without a data dir (the node makes a temporary one)."""
    if config.data_dir is None:
        return None
    lock = lock_dir(config.data_dir)
    trainer, training = None, config.training()
    if training is not None:
        trainer = TrainerProcess(config.trainer_threads)
        try:
            await trainer.spawn(training[0], state_dir(config.data_dir))
        except BaseException:
            lock.close()
            raise
    return HeadStart(lock, trainer)
