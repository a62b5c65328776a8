"""The trainer worker: a `Trainer` in its own process, serving the node one command at a time.

The node (peer/node.py, through `peer.trainer.process.TrainerProcess`) must never be starved by
training, so it spawns this process and talks to it over pipes:

- stdin: one JSON command per line; stdout: one JSON reply per line, in order; stderr: logs.
- Tensors never go through the pipe: they are safetensors files in `--shm-dir` (the node puts
  it in /dev/shm when the machine has one); commands and replies carry their paths. Weights are in
  the parameters' dtype; a pseudo-gradient is in the wire dtype where the wire is bf16 or fp32
  (config.HANDOFF_DTYPES: the node then encodes it where it lies), else in the parameters' dtype.
- Every command may carry an "id", echoed in its reply so the node can match them.

Commands and replies (every reply has "ok"; on failure {"ok": false, "error": "..."} and the worker
keeps serving):
    {"cmd": "hello"}
        -> {"blocks": [[block_id, num_samples], ...] (epoch order), "parameters": N,
            "weights": PATH (θ_0, the seeded initial model), "weights_hash": state_dict_hash(θ_0),
            "seq_len": L, "device": "cpu"}
    {"cmd": "train", "round": r, "weights": PATH (θ_{r-1}) or null, "ranges": [[block_id, start, end], ...],
     "steps": H, "start_step": s or null, "budget_s": seconds or null (optional: a time-boxed round,
     at least one step, at most H), "fold": PATH or null (optional)}
        -> {"pseudo_gradient": PATH (Δ = θ_{r-1} − θ_local), "tokens": n, "trained": [[b, s, e], ...],
            "steps": k, "mean_loss": x or null (no step ran), "losses": [...], "seconds": t,
            "folded_at": k or null}
        An overlapped round (rounds-overlap-fold.md): "weights" null goes on from the model as the
        last round left it, and before every step the worker looks for the file "fold" names: once
        the node has written θ_{r-1} there, it is folded in (Trainer.train_round). "folded_at" says
        after how many steps; null: it came too late for this round (Δ is right either way). A
        fresh worker's model is θ_0, so the node then sends "weights" (its newest θ) with "fold".
    {"cmd": "evaluate", "weights": PATH} -> {"perplexity": p, "samples": n (held-out samples evaluated),
                                              "seconds": t (this command's, from the weights read on)}
        The model is left as it was (Trainer.evaluate): a round trained ahead goes on from it.
    {"cmd": "checkpoint", "weights": PATH, "momentum": PATH or null, "dir": DIR, "round": r,
     "cursor": [[b, s, e], ...] (optional), "extra": {...} (optional)}
        -> {"dir": DIR, "weights_hash": h}   (checkpoint.save_checkpoint: atomic, HF-loadable)
    {"cmd": "stop"} -> {} then exit 0 (as on end of stdin: the node is gone)

The `Trainer` lives as long as the process, so the inner AdamW state carries over between rounds
(DiLoCo keeps it site-local). A failed build (bad config, unreadable corpus) exits with status 2
after logging why; the node reports the log tail.

A site of several ranks (peer/trainer/launch.py) runs this worker on every rank. Rank 0 serves the
pipes as above; before a collective command (train, evaluate, checkpoint) it tells the other ranks
its name over the control group (peer/trainer/ranks.py) and they join it; `stop` and the end of
stdin stop them too. A refused command is refused on rank 0 before anyone is told, so the ranks
stay in step. A command that fails once the ranks have started it leaves them out of step: rank 0
replies with the error and "fatal": true, and every rank exits with status 3 (the node restarts
the job). "hello"
also lists the ranks: "ranks": [{"rank": r, "host": h, "pid": p, "device": d}, ...], and
"parallel": "ddp", "fsdp" or "none" (one rank).

Try it (by hand; θ_0's path comes back in the hello reply):
    .venv/bin/python -c "from peer.trainer.config import *; print(TrainerConfig(MODEL_PRESETS['micro'], \
DataConfig.shipped(max_documents=40, seq_len=32, block_samples=16)).to_json())" > /tmp/tc.json
    echo '{"cmd": "hello"}' | .venv/bin/python -m peer.trainer.worker --config /tmp/tc.json --shm-dir /tmp/tw
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from peer.outer import state_dict_hash
from peer.trainer.blocks import BlockIndex, SampleRange, merge_ranges
from peer.trainer.checkpoint import Checkpoint, save_checkpoint
from peer.trainer.config import HANDOFF_DTYPES, TrainerConfig
from peer.trainer.inner import Trainer
from peer.trainer.model import count_parameters
from peer.trainer.parent_death import die_with_parent
from peer.trainer.tensor_files import read_state, write_state
from peer.trainer.ranks import MISSING_RANKS_TIMEOUT_S, Rank, join, leave

EXIT_OUT_OF_STEP = 3
"""A command failed after the ranks started it: they are out of step and the job must restart."""

log = logging.getLogger("peer.trainer.worker")


class CommandError(Exception):
    """A command the worker refuses; the message goes back to the node as is."""


class OutOfStep(Exception):
    """A collective command failed part way: the ranks disagree on where they are; exit."""


def _get(msg: dict[str, Any], name: str, kind: type | tuple[type, ...], hint: str) -> Any:
    """Field `name` of a command, checked against `kind`; `hint` says what a valid value looks like."""
    if name not in msg:
        raise CommandError(f"missing field {name!r} ({hint})")
    value = msg[name]
    # bool is an int to Python, never to the protocol.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise CommandError(f"field {name!r} is {value!r}; expected {hint}")
    return value


def _int(msg: dict[str, Any], name: str, hint: str, minimum: int = 0) -> int:
    value = _get(msg, name, int, hint)
    if value < minimum:
        raise CommandError(f"field {name!r} is {value}; expected {hint}")
    return value


def _finite(x: float) -> float | None:
    """JSON has no NaN/inf (a diverged loss, no step run): they travel as null."""
    return x if math.isfinite(x) else None


def _ranges(value: Any, name: str) -> list[SampleRange]:
    hint = "a list of [block_id, start, end] integer triples"
    if not isinstance(value, list):
        raise CommandError(f"field {name!r} is {value!r}; expected {hint}")
    out = []
    for item in value:
        if (not isinstance(item, list) or len(item) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)):
            raise CommandError(f"{name}: {item!r} is not a [block_id, start, end] triple of integers")
        try:
            out.append(SampleRange(*item))
        except ValueError as e:
            raise CommandError(f"{name}: {e} (need 0 <= start < end)") from None
    return out


class Worker:
    """The command handlers around one `Trainer`; `serve` drives them from the pipes."""

    def __init__(self, trainer: Trainer, shm_dir: Path, rank: Rank | None = None) -> None:
        self.trainer = trainer
        self.shm_dir = shm_dir
        self.rank = rank or Rank(0, 1, 0, "localhost")
        self.shapes = {n: tuple(shape) for n, shape in trainer.full_shapes().items()}
        # θ_0 is taken once, before any training: hello must name the seeded init however often it
        # is asked, while the live model moves on. (A collective under FSDP: every rank takes it.)
        theta0 = trainer.model_weights()
        self.ranks = self.rank.gather({"rank": self.rank.rank, "host": self.rank.host, "pid": os.getpid(),
                                       "device": str(trainer.device)})
        if self.rank.rank == 0:
            self.theta0 = write_state(shm_dir / "theta0.safetensors", theta0)
            self.theta0_hash = state_dict_hash(theta0)
        del theta0
        self.followers: dict[str, Callable[[], object]] = {
            "train": lambda: trainer.train_round(None, None, None),
            "evaluate": lambda: trainer.evaluate(None),
            "checkpoint": trainer.inner_state,
        }
        """What the other ranks run when rank 0 tells them a command (their part of its collective)."""
        self.handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "hello": self.hello, "train": self.train, "evaluate": self.evaluate,
            "checkpoint": self.checkpoint,
        }

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg.get("cmd")
        handler = self.handlers.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            raise CommandError(f"unknown command {cmd!r}; known: {sorted([*self.handlers, 'stop'])}")
        try:
            return handler(msg)
        except CommandError as e:
            raise CommandError(f"{cmd}: {e}") from None

    def _collective(self, cmd: str, run: Callable[[], Any]) -> Any:
        """Tell the other ranks `cmd`, then run rank 0's part. From here on a failure leaves the
        ranks out of step (with one rank, the worker keeps serving as before)."""
        if self.rank.world == 1:
            return run()
        self.rank.tell(cmd)
        try:
            return run()
        except Exception as e:
            raise OutOfStep(self._failed(cmd, e)) from e

    def _failed(self, cmd: str, e: BaseException) -> str:
        """Log (and return) a failed collective command, naming this rank and any absent ones."""
        log.exception("%s: %s failed", self.rank.label, cmd)
        why = f"{self.rank.label}: {cmd} failed: {type(e).__name__}: {str(e)[:300]}"
        missing = self.rank.missing_ranks(min(MISSING_RANKS_TIMEOUT_S, self.trainer.cfg.ranks.collective_timeout_s))
        if missing and "monitoredBarrier" not in missing:
            missing = "some rank is gone (" + missing[:120] + ")"
        if missing:
            log.error("%s: ranks that did not answer: %s", self.rank.label, missing)
            why += f"; ranks that did not answer: {missing}"
        return why

    def follow(self) -> int:
        """The other ranks' loop: run what rank 0 says until it says stop; the exit status."""
        while True:
            try:
                cmd = self.rank.tell(None)
            except Exception as e:  # noqa: BLE001 - rank 0 is gone (or the job is torn down)
                log.error("%s: lost rank 0 (%s: %s); exiting", self.rank.label, type(e).__name__, e)
                return EXIT_OUT_OF_STEP
            if cmd == "stop":
                log.info("%s: stop", self.rank.label)
                return 0
            try:
                self.followers[cmd]()
            except Exception as e:  # noqa: BLE001 - logged with this rank's name
                self._failed(cmd, e)
                return EXIT_OUT_OF_STEP

    def release_followers(self) -> None:
        """Rank 0 is done (stop, end of stdin): let the other ranks exit too."""
        if self.rank.world > 1:
            try:
                self.rank.tell("stop")
            except Exception as e:  # noqa: BLE001 - they are gone already
                log.warning("could not tell the other ranks to stop: %s", e)

    # -- files -------------------------------------------------------------------------------------
    def _read_weights(self, msg: dict[str, Any], name: str) -> dict[str, torch.Tensor]:
        """A weight dict named by a command, checked against the model before it touches it."""
        path = Path(_get(msg, name, str, "a path to an fp32 safetensors file"))
        if not path.is_file():
            raise CommandError(f"{name} file {path} does not exist (write it with "
                               f"peer.trainer.process.write_state before sending the command)")
        try:
            state = read_state(path)
        except Exception as e:  # safetensors raises its own error types for truncated/garbled files
            raise CommandError(f"{name} file {path} is not a readable safetensors file: {e}") from None
        missing, extra = self.shapes.keys() - state.keys(), state.keys() - self.shapes.keys()
        if missing or extra:
            raise CommandError(f"{name} file {path} does not fit model {self.trainer.cfg.model.name}: "
                               f"missing {sorted(missing)[:3]}, unexpected {sorted(extra)[:3]}")
        for n, shape in self.shapes.items():
            t = state[n]
            # Checked here because copy_ would broadcast a wrong shape silently.
            if tuple(t.shape) != shape or t.dtype != torch.float32:
                raise CommandError(f"{name} file {path}: {n} is {t.dtype} {tuple(t.shape)}, model "
                                   f"{self.trainer.cfg.model.name} needs torch.float32 {shape}")
        return state

    # -- commands ----------------------------------------------------------------------------------
    def hello(self, msg: dict[str, Any]) -> dict[str, Any]:
        t = self.trainer
        return {
            "blocks": [[b.block_id, b.num_samples] for b in t.index.epoch_order()],
            "parameters": count_parameters(t.module), "weights": str(self.theta0),
            "weights_hash": self.theta0_hash, "seq_len": t.cfg.data.seq_len, "device": str(t.device),
            "ranks": self.ranks, "parallel": "fsdp" if t.fsdp else "ddp" if t.ddp is not None else "none",
        }

    def train(self, msg: dict[str, Any]) -> dict[str, Any]:
        rnd = _int(msg, "round", "the round number, an integer >= 0")
        steps = _int(msg, "steps", "the inner steps H, an integer >= 0")
        start_step = msg.get("start_step")
        if start_step is not None:
            start_step = _int(msg, "start_step", "null or the schedule position, an integer >= 0")
        budget = msg.get("budget_s")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                   or not math.isfinite(budget) or budget <= 0):
            raise ValueError(f"budget_s must be null or seconds > 0, got {budget!r}")
        ranges = self._check_ranges(_ranges(_get(msg, "ranges", list, "[[block_id, start, end], ...]"),
                                            "ranges"))
        theta = None if msg.get("weights") is None else self._read_weights(msg, "weights")
        fold_path = msg.get("fold")
        if fold_path is not None and not isinstance(fold_path, str):
            raise CommandError(f"fold must be null or a path to the θ to fold in, got {fold_path!r}")
        fold = None if fold_path is None else self._fold_source(Path(fold_path))
        r = self._collective("train", lambda: self.trainer.train_round(theta, ranges, steps, start_step,
                                                                        budget_s=budget, fold=fold))
        handoff = HANDOFF_DTYPES.get(self.trainer.cfg.wire)
        out = write_state(self.shm_dir / f"pseudo_gradient-r{rnd}.safetensors", r.pseudo_gradient,
                          None if handoff is None else getattr(torch, handoff))
        log.info("round %d: %d steps, %d tokens, mean loss %.4f, %.1fs", rnd, r.steps, r.tokens,
                 r.mean_loss, r.seconds)
        return {
            "pseudo_gradient": str(out), "tokens": r.tokens,
            "trained": [[x.block_id, x.start, x.end] for x in r.trained], "steps": r.steps,
            "mean_loss": _finite(r.mean_loss), "losses": [_finite(x) for x in r.losses],
            "seconds": r.seconds, "folded_at": r.folded_at,
        }

    def _fold_source(self, path: Path) -> Callable[[], dict[str, torch.Tensor] | None]:
        """Before each step: θ once the node has renamed it into `path` (write_state is atomic, so
        a file that exists is whole); checked like any weights file. One stat per step: the step
        boundary is the only place a fold may happen, so this is not a polling loop."""
        def fold() -> dict[str, torch.Tensor] | None:
            return self._read_weights({"fold": str(path)}, "fold") if path.is_file() else None

        return fold

    def _check_ranges(self, ranges: list[SampleRange]) -> list[SampleRange]:
        """Refuse bad ranges before training starts: a failure halfway would leave steps taken."""
        index = self.trainer.index
        for r in ranges:
            try:
                info = index.info(r.block_id)
            except KeyError as e:
                raise CommandError(f"ranges: {e.args[0]} (block IDs come from hello)") from None
            if r.end > info.num_samples:
                raise CommandError(f"ranges: [{r.block_id}, {r.start}, {r.end}] ends past the block's "
                                   f"{info.num_samples} samples")
        if sum(r.num_samples for r in merge_ranges(ranges)) != sum(r.num_samples for r in ranges):
            raise CommandError("ranges overlap: a sample would be trained twice in one round")
        return ranges

    def evaluate(self, msg: dict[str, Any]) -> dict[str, Any]:
        state = self._read_weights(msg, "weights")
        started = time.perf_counter()
        ppl = self._collective("evaluate", lambda: self.trainer.evaluate(state))
        if not math.isfinite(ppl):
            raise CommandError(f"perplexity is {ppl}: the weights hold NaN or inf")
        return {"perplexity": ppl, "samples": len(self.trainer.heldout()), "seconds": time.perf_counter() - started}

    def checkpoint(self, msg: dict[str, Any]) -> dict[str, Any]:
        rnd = _int(msg, "round", "the round number, an integer >= 0")
        directory = Path(_get(msg, "dir", str, "the checkpoint directory"))
        extra = msg.get("extra") or {}
        if not isinstance(extra, dict):
            raise CommandError(f"field 'extra' is {extra!r}; expected a JSON object or null")
        cursor = _ranges(msg.get("cursor") or [], "cursor")
        theta = self._read_weights(msg, "weights")
        momentum = self._read_weights(msg, "momentum") if msg.get("momentum") is not None else {}
        digest = state_dict_hash(theta)
        # round and hash last: extra cannot mislabel the checkpoint.
        meta = {**extra, "round": rnd, "weights_hash": digest}
        inner_state = self._collective("checkpoint", self.trainer.inner_state)
        save_checkpoint(directory, self.trainer.cfg.model, Checkpoint(
            weights=theta, momentum=momentum, inner_state=inner_state, cursor=cursor, meta=meta))
        return {"dir": str(directory), "weights_hash": digest}


def serve(worker: Worker, commands: IO[str], replies: IO[str]) -> int:
    """Answer commands until "stop" or end of input; returns the exit status."""
    for line in commands:
        if not line.strip():
            continue
        msg: Any = None
        out_of_step = False
        t0 = time.perf_counter()
        try:
            msg = json.loads(line)
            if not isinstance(msg, dict):
                raise CommandError(f"a command is a JSON object, got {line.strip()[:80]!r}")
            if msg.get("cmd") == "stop":
                reply: dict[str, Any] = {"ok": True}
            else:
                reply = {"ok": True, **worker.handle(msg)}
        except json.JSONDecodeError as e:
            reply = {"ok": False, "error": f"not JSON ({e}): {line.strip()[:80]!r}"}
        except CommandError as e:
            reply = {"ok": False, "error": str(e)}
        except OutOfStep as e:
            reply = {"ok": False, "error": f"{e} (the site's ranks are out of step: restart them)", "fatal": True}
            out_of_step = True
        except Exception as e:  # the trainer's own failure (e.g. CUDA OOM): report it, keep serving
            log.exception("command failed")
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        cmd = msg.get("cmd") if isinstance(msg, dict) else None
        if isinstance(msg, dict) and "id" in msg:
            reply["id"] = msg["id"]
        log.info("%s -> %s in %.2fs", cmd, "ok" if reply["ok"] else reply["error"], time.perf_counter() - t0)
        replies.write(json.dumps(reply, allow_nan=False) + "\n")
        replies.flush()
        if cmd == "stop":
            return 0
        if out_of_step:
            return EXIT_OUT_OF_STEP
    log.info("stdin closed (the node is gone): exiting")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, type=Path,
                    help="TrainerConfig as JSON (TrainerConfig.to_json)")
    ap.add_argument("--shm-dir", required=True, type=Path,
                    help="where tensor files are written (the node picks /dev/shm when present)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s trainer-worker[%(process)d] %(levelname)s %(message)s")
    # stdout carries replies only: keep a private handle on it and point fd 1 at stderr, so a stray
    # print (ours, a library's, a C extension's) cannot corrupt the protocol.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    # The node owns shutdown: a Ctrl-C in its terminal reaches this process group too, and the node
    # may still want a final checkpoint from us. We exit on "stop" or when stdin closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    try:
        cfg = TrainerConfig.from_json(args.config.read_text())
        rank, _ = join(cfg.ranks, cfg.inner.device)
    except Exception:
        log.exception("cannot join the site's ranks with %s", args.config)
        return 2
    try:
        index = BlockIndex(cfg.data)
        if rank.rank == 0:
            args.shm_dir.mkdir(parents=True, exist_ok=True)
            _ = index.blocks  # tokenizes the corpus now (once per machine), not in the first command
        rank.gather(None)  # the other ranks read rank 0's token cache rather than tokenize again
        worker = Worker(Trainer(cfg, index), args.shm_dir, rank)
        blocks = len(index.blocks)
    except Exception:
        log.exception("%s: cannot build the trainer from %s", rank.label, args.config)
        return 2
    log.info("%s: trainer ready in %.1fs: model %s on %s, %d blocks, shm %s", rank.label,
             time.perf_counter() - t0, cfg.model.name, worker.trainer.device, blocks, args.shm_dir)
    try:
        if rank.rank != 0:
            return worker.follow()
        code = serve(worker, sys.stdin, replies)
        if code == 0:
            worker.release_followers()
        return code
    finally:
        leave(rank)

if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stderr.flush()
    # Skip interpreter finalization: tearing down torch and transformers takes seconds (3-7 s on a
    # loaded 2-core box), and nothing needs cleaning up: every file is already whole (temp + rename)
    # and every reply flushed.
    os._exit(code)
