"""Starting a site's trainer as a torch.distributed job: the command the node spawns, and the launcher.

The node (peer/trainer/process.py) spawns one child and talks to its stdin/stdout. With one rank
that child is the worker itself (worker.py). With more (`RanksConfig`), it is this launcher:

- "local" (`nproc_per_node` N on this node, like `torchrun --nproc-per-node N`): the launcher
  runs torch.distributed.elastic's agent (`elastic_launch`: c10d rendezvous on a free loopback
  port, one worker process per rank with RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* set, no restarts).
  The ranks inherit the launcher's stdin and stdout, the node's pipes; only rank 0 reads or writes
  them. When a rank dies, the agent stops the others and the launcher exits 1 after logging which
  rank died and how: the node sees its trainer exit, reports nothing for the round and restarts.
- "srun" (a Slurm allocation, `nproc_per_node` ranks on each of its nodes): the launcher replaces
  itself with `srun` (one job step, one task per rank, `--kill-on-bad-exit`, stdin to task 0 only),
  the rendezvous (MASTER_ADDR/MASTER_PORT) on this host, the job's first node, where the peer runs.

Either way the launcher asks Linux to kill it when the node dies (as the worker does), and each
rank asks the same of its own parent, so a dead node leaves no ranks holding accelerators.

Try it (two gloo ranks of a micro model; the hello reply lists both ranks):
    .venv/bin/python -c "from peer.trainer.config import *; print(TrainerConfig(MODEL_PRESETS['micro'], \
DataConfig.shipped(max_documents=40, seq_len=32, block_samples=16), InnerConfig(batch_size=2, \
micro_batch_size=1), ranks=RanksConfig(nproc_per_node=2)).to_json())" > /tmp/tc.json
    echo '{"cmd": "hello"}' | .venv/bin/python -m peer.trainer.launch --config /tmp/tc.json --shm-dir /tmp/tw
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import socket
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from peer.trainer.config import RanksConfig, TrainerConfig
from peer.trainer.parent_death import die_with_parent

log = logging.getLogger("peer.trainer.launch")

WORKER = ("-m", "peer.trainer.worker")
SRUN_ARGS_ENV = "SITEMESH_SRUN_ARGS"
"""More srun options from the environment: the site's sbatch template sets its GPU/CPU binding here."""
EXIT_RANK_FAILED = 1


def command(ranks: RanksConfig, worker_args: Sequence[str]) -> list[str]:
    """The argv the node spawns for a trainer with `ranks`: the worker itself for one local rank,
    else this launcher (which gets the worker's own arguments and reads `ranks` from --config)."""
    module = WORKER if not ranks.distributed else ("-m", "peer.trainer.launch")
    return [sys.executable, *module, *worker_args]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def srun_command(ranks: RanksConfig, worker_args: Sequence[str], env: dict[str, str]) -> list[str]:
    """srun over the whole allocation: `nproc_per_node` tasks (ranks) on each of its nodes."""
    if "SLURM_JOB_ID" not in env:
        raise SystemExit("launcher 'srun' needs a Slurm allocation (no SLURM_JOB_ID): start the peer "
                         "inside sbatch/salloc, or use launcher = \"local\"")
    nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes * ranks.nproc_per_node}",
            f"--ntasks-per-node={ranks.nproc_per_node}", "--kill-on-bad-exit=1", "--input=0",
            "--export=ALL", *ranks.srun_args, *shlex.split(env.get(SRUN_ARGS_ENV, "")), sys.executable, *WORKER,
            *worker_args]


def _local(ranks: RanksConfig, worker_args: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=ranks.nproc_per_node, run_id=f"sitemesh-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port('127.0.0.1')}", max_restarts=0,
        # The node restarts the job itself (it must first report nothing for the round); a rank's
        # death is noticed within a tenth of a second.
        monitor_interval=0.1,
    )
    try:
        elastic_launch(config, sys.executable)(*WORKER, *worker_args)
    except ChildFailedError as e:
        for rank, failure in sorted(e.failures.items()):
            how = f"signal {failure.signal_name()}" if failure.signal_name() != "<N/A>" else \
                f"exit code {failure.exitcode}"
            log.error("trainer rank %d (pid %d) failed: %s; the other ranks were stopped", rank, failure.pid, how)
        return EXIT_RANK_FAILED
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, type=Path, help="TrainerConfig as JSON (its `ranks` say how)")
    ap.add_argument("--shm-dir", required=True, type=Path)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)  # the same arguments as the worker: checked here, passed on as they are
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s trainer-launch[%(process)d] %(levelname)s %(message)s")
    # Our own output must not reach the node's reply pipe, which the ranks inherit as fd 1.
    sys.stdout = sys.stderr
    die_with_parent()
    ranks = TrainerConfig.from_json(args.config.read_text()).ranks
    if ranks.launcher == "srun":
        env = dict(os.environ)
        if not env.get("MASTER_ADDR"):  # the sbatch templates set the job's first node; this is it
            env["MASTER_ADDR"] = socket.gethostname()
        env.setdefault("MASTER_PORT", str(_free_port("0.0.0.0")))
        srun_argv = srun_command(ranks, argv, env)
        srun = shutil.which("srun")
        if srun is None:
            raise SystemExit("launcher 'srun' but no srun on PATH")
        log.info("starting the ranks: %s (rendezvous %s:%s)", " ".join(srun_argv), env["MASTER_ADDR"],
                 env["MASTER_PORT"])
        os.execve(srun, srun_argv, env)
    log.info("starting %d local ranks", ranks.nproc_per_node)
    return _local(ranks, argv)


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    os._exit(code)
