"""The node's handle on its trainer: a worker subprocess driven over pipes, tensors through files.

The peer daemon must never be starved by training (docs/decisions/trainer-worker-process.md), so
the `Trainer` lives in its own process, `python -m peer.trainer.worker` (see worker.py for the
protocol). `TrainerProcess` is the asyncio side: it spawns the worker, sends one JSON command per
line on its stdin and reads one JSON reply per line from its stdout. Weights and pseudo-gradients
never go through the pipe: they are safetensors files in a shared-memory directory (`/dev/shm`
when the machine has one), written whole and renamed into place (`write_state` / `read_state`).

One command is in flight at a time (an asyncio.Lock); every command carries an id that the reply
echoes, so a call cancelled while the worker is busy cannot hand its late reply to the next call.
If the worker dies (kill -9, OOM killer, a crash), the call in flight and every later call raise
`TrainerError` with the exit status and the last lines of the worker's log.

Try it (a micro model on the shipped corpus, CPU):
    .venv/bin/python -m pytest -q tests/integration/test_trainer_process.py
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import shutil
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


from peer.trainer import launch
from peer.trainer.config import TrainerConfig

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The directory holding the `peer` package, put on the worker's path for `-m peer.trainer.worker`."""
LOG_FILE = "trainer-worker.log"
"""The worker's stderr, appended to in the workdir: it survives the worker for post-mortems."""
_TAIL_LINES = 20
_MAX_REPLY_BYTES = 256 << 20
"""A reply line may be long: hello lists every block of the epoch (~30 bytes each)."""


class TrainerError(RuntimeError):
    """The worker refused a command (its error text) or is gone (exit status and log tail)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal
        """The trainer is gone or going (dead, or its ranks out of step and exiting): a new
        TrainerProcess must be started; otherwise the worker refused one command and serves on."""


@dataclass(frozen=True)
class Hello:
    """What the worker reports once its `Trainer` is built."""

    blocks: tuple[tuple[int, int], ...]
    """(block_id, num_samples) of every block, in the epoch's order."""
    parameters: int
    weights: Path
    """θ_0, the seeded initial model (identical on every site), fp32 safetensors in the shm dir."""
    weights_hash: str
    """`state_dict_hash(θ_0)`: sites compare it before round 1."""
    seq_len: int
    device: str
    """Where the worker trains (cuda:0, cpu, ...); rank 0's device with several ranks."""
    ranks: tuple[dict[str, Any], ...] = ()
    """Every rank of the site's job: {"rank", "host", "pid", "device"} (one entry with one rank)."""
    parallel: str = "none"
    """How the ranks share the model: "ddp", "fsdp", or "none" with one rank."""


@dataclass(frozen=True)
class TrainOutput:
    """One round of inner training (`Trainer.train_round`), with Δ left in a file."""

    pseudo_gradient: Path
    """Δ = θ_{r-1} − θ_local, fp32 safetensors in the shm dir; the caller owns it (delete it when
    done; `stop` removes the whole shm dir)."""
    tokens: int
    trained: tuple[tuple[int, int, int], ...]
    """(block_id, start, end) ranges actually trained, merged; a subset of the ranges given."""
    steps: int
    mean_loss: float
    """NaN when no step ran (fewer samples than one batch)."""
    seconds: float
    losses: tuple[float, ...]
    folded_at: int | None = None
    """Overlapped rounds: after how many steps θ_{r-1} was folded in; None: not (or not asked)."""


@dataclass(frozen=True)
class Evaluation:
    """Held-out perplexity of one θ (`Trainer.evaluate`)."""

    perplexity: float
    samples: int
    """Held-out samples evaluated: TrainerConfig.eval_samples, or all a smaller held-out split has."""
    seconds: float
    """The worker's own time for it, without the wait for a command in flight before it."""


def default_shm_dir(workdir: Path) -> Path:
    """The tensor directory for a workdir: in /dev/shm (RAM, no disk traffic for multi-GB θ and Δ
    every round) when the machine has it, else under the workdir. Named after the workdir, so a node
    restarted after a crash reuses (and `start` clears) the files its last worker left in RAM."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        return workdir / "shm"
    tag = hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:16]
    return base / f"sitemesh-trainer-{os.getuid()}-{tag}"


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol plus a future resolved when the worker is reaped. `proc.wait()`
    (Python < 3.12) resolves only once the pipes close too, and a forked child of the worker (a
    data-loader or compile worker) may hold them long after the worker itself is gone."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _spawn(*args: str, log: IO[bytes], env: Mapping[str, str]) -> tuple[asyncio.subprocess.Process,
                                                                              asyncio.Future[None]]:
    """`asyncio.create_subprocess_exec` with pipes for stdin/stdout, and the worker's exit future."""
    loop = asyncio.get_running_loop()
    protocol = _ExitProtocol(_MAX_REPLY_BYTES, loop)
    transport, _ = await loop.subprocess_exec(lambda: protocol, *args, stdin=asyncio.subprocess.PIPE,
                                              stdout=asyncio.subprocess.PIPE, stderr=log, env=env)
    return asyncio.subprocess.Process(transport, protocol, loop), protocol.exited


async def _exit_status(proc: asyncio.subprocess.Process, exited: asyncio.Future[None]) -> int:
    """The worker's exit status, as soon as it is reaped (see _ExitProtocol)."""
    await asyncio.shield(exited)
    assert proc.returncode is not None  # set by the transport before process_exited
    return proc.returncode


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit {code})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class TrainerProcess:
    """A trainer worker subprocess. Not thread-safe; use from one event loop."""

    def __init__(self, threads: int | None = None, env: Mapping[str, str] | None = None) -> None:
        """threads: torch intra-op threads in the worker (None: torch's default, one per core).
        env: extra environment variables for the worker (e.g. CUDA_VISIBLE_DEVICES)."""
        self._threads = threads
        self._env = dict(env or {})
        self._proc: asyncio.subprocess.Process | None = None
        self._exited: asyncio.Future[None] | None = None
        """Resolved when the worker is reaped."""
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._dead: TrainerError | None = None
        """Set once the worker is gone: every later call raises it."""
        self._log_path: Path | None = None
        self._log_start = 0
        """Offset where this worker's lines begin in the (appended) log file."""
        self.shm_dir: Path | None = None
        self._owns_shm = False
        """True when `start` made the shm dir, so `stop` removes it."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    async def exited(self) -> int:
        """Wait until the worker (the launcher, with several ranks) has exited; its exit status."""
        assert self._proc is not None and self._exited is not None, "not started"
        return await _exit_status(self._proc, self._exited)

    @property
    def spawned(self) -> bool:
        """True once `spawn` (or `start`) ran: what is left is `hello`."""
        return self._proc is not None

    async def start(self, config: TrainerConfig, workdir: Path, shm_dir: Path | None = None) -> Hello:
        """`spawn`, then `hello`: the worker with `config`, once its `Trainer` is built."""
        await self.spawn(config, workdir, shm_dir)
        return await self.hello()

    async def spawn(self, config: TrainerConfig, workdir: Path, shm_dir: Path | None = None) -> None:
        """Spawn the worker with `config` and return at once; it builds its `Trainer` (imports, the
        model, tokenizing the corpus on first use) while the caller goes on (peer/head_start.py).
        The config and the log go to `workdir`; tensor files to `shm_dir` (default:
        `default_shm_dir(workdir)`, emptied now and removed by `stop`). One TrainerProcess per
        workdir at a time: the config, log and shm dir are named after it. Call it from the event
        loop's thread and keep that thread alive: Linux kills the worker when the thread that
        spawned it exits (parent_death.py)."""
        if self._proc is not None:
            raise TrainerError("this TrainerProcess was already started; make a new one")
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self._owns_shm = shm_dir is None
        self.shm_dir = Path(shm_dir) if shm_dir is not None else default_shm_dir(workdir)
        if self._owns_shm:
            shutil.rmtree(self.shm_dir, ignore_errors=True)  # a crashed predecessor's θ and Δ
        self.shm_dir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "trainer-config.json"
        config_path.write_text(config.to_json())
        self._log_path = workdir / LOG_FILE
        worker_args = ["--config", str(config_path), "--shm-dir", str(self.shm_dir)]
        if self._threads is not None:
            worker_args += ["--threads", str(self._threads)]
        # One rank: the worker itself; more: the launcher, which starts one worker per rank.
        args = launch.command(config.ranks, worker_args)
        env = {**os.environ, **self._env}
        # This very `peer` package, even when sitemesh is not installed in sys.executable's environment.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
        with open(self._log_path, "ab") as log:
            self._log_start = log.tell()
            self._proc, self._exited = await _spawn(*args, log=log, env=env)

    async def hello(self) -> Hello:
        """Wait until the spawned worker's `Trainer` is built; what it trains. On failure the worker
        is reaped and the shm dir removed; the TrainerError says why."""
        assert self._proc is not None, "spawn first"
        try:
            r = await self._call({"cmd": "hello"})
        except BaseException:
            await self.stop()  # reap the worker and remove the shm dir; the error says why
            raise
        return Hello(
            blocks=tuple((int(b), int(n)) for b, n in r["blocks"]), parameters=int(r["parameters"]),
            weights=Path(r["weights"]), weights_hash=str(r["weights_hash"]), seq_len=int(r["seq_len"]),
            device=str(r["device"]), ranks=tuple(r.get("ranks", ())), parallel=str(r.get("parallel", "none")),
        )

    async def train(
        self,
        round: int,
        weights_path: str | Path | None,
        ranges: Iterable[Sequence[int]],
        steps: int,
        start_step: int | None = None,
        budget_s: float | None = None,
        fold_path: str | Path | None = None,
    ) -> TrainOutput:
        """Up to `steps` inner steps from θ_{r-1} (`weights_path`) on the samples of `ranges`
        ((block_id, start, end) each, trained in the order given). `start_step` places the round on
        the LR schedule (round x H); None continues the worker's own step counter. `budget_s`: a
        time-boxed round (Trainer.train_round). An overlapped round: `weights_path` None goes on from
        the model, and θ_{r-1} is folded in once it is written to `fold_path` (worker.py)."""
        r = await self._call({
            "cmd": "train", "round": round, "weights": None if weights_path is None else str(weights_path),
            "ranges": [[int(b), int(s), int(e)] for b, s, e in ranges], "steps": steps,
            "start_step": start_step, "budget_s": budget_s,
            "fold": None if fold_path is None else str(fold_path),
        })
        return TrainOutput(
            pseudo_gradient=Path(r["pseudo_gradient"]), tokens=int(r["tokens"]),
            trained=tuple((int(b), int(s), int(e)) for b, s, e in r["trained"]), steps=int(r["steps"]),
            mean_loss=float("nan") if r["mean_loss"] is None else float(r["mean_loss"]),
            seconds=float(r["seconds"]), losses=tuple(float(x) for x in r["losses"]),
            folded_at=None if r.get("folded_at") is None else int(r["folded_at"]),
        )

    async def evaluate(self, weights_path: str | Path) -> Evaluation:
        """Held-out perplexity of the weights in `weights_path` (the model is left as it was)."""
        r = await self._call({"cmd": "evaluate", "weights": str(weights_path)})
        return Evaluation(float(r["perplexity"]), int(r["samples"]), float(r["seconds"]))

    async def checkpoint(
        self,
        weights_path: str | Path,
        dir: str | Path,
        round: int,
        momentum_path: str | Path | None = None,
        cursor: Iterable[Sequence[int]] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write an atomic Hugging Face checkpoint of θ (`weights_path`) to `dir`, with the outer
        momentum, the worker's inner optimizer state, the trained-samples cursor and
        meta = {round, weights_hash, **extra}. Returns `dir`."""
        r = await self._call({
            "cmd": "checkpoint", "weights": str(weights_path),
            "momentum": None if momentum_path is None else str(momentum_path), "dir": str(dir),
            "round": round, "cursor": [[int(b), int(s), int(e)] for b, s, e in cursor],
            "extra": dict(extra or {}),
        })
        return Path(r["dir"])

    async def stop(self, timeout: float = 30.0) -> int | None:
        """Ask the worker to exit (kill it if it does not within `timeout`, which includes waiting
        for a command in flight), remove the shm dir if this object made it, and return the exit
        status (None if never started). Later calls raise `TrainerError`."""
        proc = self._proc
        if proc is None:
            return None
        if self._dead is None and proc.returncode is None:
            try:
                await asyncio.wait_for(self._ask_to_exit(proc), timeout)
            except (TrainerError, asyncio.TimeoutError):
                pass  # dead already, or wedged: the kill below settles it either way
        if proc.returncode is None:
            proc.kill()
            await self.exited()
        if self._dead is None:
            self._dead = TrainerError(f"trainer worker (pid {proc.pid}) was stopped", fatal=True)
        if self._owns_shm and self.shm_dir is not None:
            shutil.rmtree(self.shm_dir, ignore_errors=True)
        return proc.returncode

    async def _ask_to_exit(self, proc: asyncio.subprocess.Process) -> None:
        await self._call({"cmd": "stop"})
        await self.exited()

    # -- the pipe ------------------------------------------------------------------------------------
    async def _call(self, command: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            proc = self._proc
            if proc is None:
                raise TrainerError("trainer worker not started: call start() first")
            if self._dead is not None:
                raise self._dead
            assert proc.stdin is not None and proc.stdout is not None
            cid = next(self._ids)
            try:
                proc.stdin.write(json.dumps({**command, "id": cid}).encode() + b"\n")
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                raise await self._died(command["cmd"]) from None
            while True:
                line = await self._next_line(proc.stdout)
                if not line:
                    raise await self._died(command["cmd"])
                try:
                    reply = json.loads(line)
                except json.JSONDecodeError:
                    raise TrainerError(f"trainer worker wrote a non-JSON line on its reply pipe: "
                                       f"{line[:200]!r}") from None
                # A reply to an earlier, cancelled call: its caller is gone, skip it.
                if reply.get("id") == cid:
                    break
            if not reply.get("ok"):
                raise TrainerError(str(reply.get("error", reply)), fatal=bool(reply.get("fatal")))
            return reply

    async def _next_line(self, stdout: asyncio.StreamReader) -> bytes:
        """The next reply line, or b"" once the worker has exited. EOF alone is not enough: a forked
        child of the worker (a data-loader or compile worker) may hold the pipe open after it died."""
        assert self._exited is not None
        read = asyncio.ensure_future(stdout.readline())
        try:
            waiters: set[asyncio.Future[Any]] = {read, self._exited}
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not read.done():
                read.cancel()
        # Both may be done: a last reply written just before the exit still counts.
        return read.result() if read.done() and not read.cancelled() else b""

    async def _died(self, during: str) -> TrainerError:
        assert self._proc is not None
        code = await self.exited()
        self._dead = TrainerError(
            f"trainer worker (pid {self._proc.pid}) died during {during!r}: {_describe_exit(code)}. "
            f"Last lines of {self._log_path}:\n{self._log_tail()}", fatal=True)
        return self._dead

    def _log_tail(self) -> str:
        assert self._log_path is not None
        try:
            with open(self._log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(self._log_start, size - 16384))
                text = f.read().decode(errors="replace")
        except OSError as e:
            return f"(log unreadable: {e})"
        return "\n".join(text.splitlines()[-_TAIL_LINES:]) or "(empty)"
