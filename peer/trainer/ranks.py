"""One rank of a site's torch.distributed job: joining the process group, and the control channel.

A site trains as one torch.distributed job (peer/trainer/launch.py starts it). Every rank runs the
trainer worker (worker.py); rank 0 alone talks to the node over its pipes and tells the other ranks
which collective command comes next. That happens on a *control* group of its own (gloo) with no
practical timeout, because between rounds the followers wait for as long as the mesh takes; the
training collectives run on the default group, whose timeout (`RanksConfig.collective_timeout_s`)
turns a hung or dead rank into an error. A rank that sees a collective fail names itself in the
log, and then tries to name the ranks that never arrived (`missing_ranks`, a monitored barrier on
the control group).

The environment is torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), set by the
elastic launcher; under srun it is derived from SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID.

Try it (two gloo ranks on this machine, through the launcher):
    .venv/bin/python -m pytest -q tests/integration/test_trainer_ranks.py
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from peer.trainer.config import RanksConfig

log = logging.getLogger("peer.trainer.ranks")

CONTROL_TIMEOUT = timedelta(days=30)
"""Followers wait for rank 0's next command this long: the mesh decides when rounds happen."""
MISSING_RANKS_TIMEOUT_S = 30.0
"""How long the ranks still alive wait for each other, after a failed collective, to name the absent."""


class CollectiveError(RuntimeError):
    """A collective failed or timed out: the job's ranks are out of step, so this rank must exit."""


@dataclass(frozen=True)
class Rank:
    """Where this process sits in the site's job."""

    rank: int
    world: int
    local_rank: int
    host: str
    control: Any = None
    """The control process group (None with one rank)."""

    @property
    def label(self) -> str:
        """How a rank names itself in logs and errors: rank, world, host and pid."""
        return f"rank {self.rank}/{self.world} on {self.host} pid {os.getpid()}"

    def tell(self, obj: Any) -> Any:
        """Rank 0 sends a small object (the next command) to every rank; every rank returns it."""
        if self.world == 1:
            return obj
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's small object, on every rank (in rank order)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def missing_ranks(self, timeout_s: float = MISSING_RANKS_TIMEOUT_S) -> str:
        """After a failed collective: which ranks did not reach a monitored barrier (hung or dead),
        as the barrier's own error text, or "" when every rank arrived (the failure was elsewhere)."""
        if self.world == 1:
            return ""
        try:
            dist.monitored_barrier(group=self.control, timeout=timedelta(seconds=timeout_s),
                                   wait_all_ranks=True)
        except Exception as e:  # noqa: BLE001 - the message is the answer
            return str(e).strip().splitlines()[0][:300]
        return ""


def _slurm_env() -> None:
    """srun starts one task per rank: give it torchrun's variables (kept when already set)."""
    env = os.environ
    if "RANK" in env or "SLURM_PROCID" not in env:
        return
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1"))
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")


def backend_for(cfg: RanksConfig, device: torch.device) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if device.type == "cuda" else "gloo"


def join(cfg: RanksConfig, device_spec: str) -> tuple[Rank, torch.device]:
    """Join the site's job as the environment says (one rank when it says nothing), and pick this
    rank's device: with several accelerators visible, LOCAL_RANK's; with one (srun's
    --gpus-per-task=1), that one."""
    from peer.trainer.model import pick_device

    if cfg.launcher == "srun":
        _slurm_env()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_spec)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    host = socket.gethostname()
    if world == 1:
        return Rank(0, 1, 0, host), device
    backend = backend_for(cfg, device)
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    kwargs: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timeout, **kwargs)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    me = Rank(rank, world, local, host, control)
    log.info("%s joined: backend %s, device %s, collective timeout %.0fs", me.label, backend, device,
             cfg.collective_timeout_s)
    return me, device


def leave(rank: Rank) -> None:
    if rank.world > 1 and dist.is_initialized():
        dist.destroy_process_group()
