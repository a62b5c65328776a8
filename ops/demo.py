"""`ops demo`: a local multi-site training run on embedded defaults, narrated.

    ops demo                          # 3 sites, tiny Qwen3, the shipped corpus, until the epoch ends
    ops demo --sites 2 --rounds 4     # shorter

Starts one `peer serve --train` per site on loopback, all at once (the first founds the run, the
others join it), says who has joined while they start, then prints every committed round with its
seconds (the slowest site's), tokens per second, overhead share (1 - compute / wall, peer/core/timeline.py),
and, from the commit log (ops/round_log.py), the leader that committed it, the voters then, the
samples committed through it and θ's hash, with whether every live peer holds that θ (I7), under a
progress bar over the data epoch on a terminal. One site leaves gracefully half way (the run goes
on without it). It ends with `ops audit`, the held-out perplexity of the final checkpoint (loaded
with `AutoModelForCausalLM.from_pretrained`) next to the untrained model's and a centralised run on
the same tokens (ops/baseline.py; `--no-baseline` skips it), and the path of the PNG report
(ops/report.py), whose held-out panel draws the checkpoints' curve and the baseline's at the same
tokens (also written to `baseline.json`, for `ops report --reference`).
Exit status 0 when all of that held.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from ops import baseline, local_mesh, report, round_log
from ops.certs import make_run
from ops.mesh import status_document
from ops.round_log import CommittedRound
from peer import timeline_file
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.core.timeline import RoundTimeline
from peer.logstore import CorruptStore
from peer.transport.channels import Credentials, open_blocking_channel

if TYPE_CHECKING:  # imported where used: it pulls in torch, and `ops` starts fast
    from peer.trainer.blocks import BlockIndex

DEMO_INNER_LR = 1e-3
"""The demo's inner learning rate: see docs/decisions/ops-demo-verdict.md."""
SITE_NAMES = ("snellius", "lumi", "frontier", "leonardo", "mareNostrum", "jupiter")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a local multi-site training run (the README's main job)")
    p.add_argument("--sites", type=int, default=3, help="number of local sites (default 3)")
    p.add_argument("--model", default="tiny", help="model preset (default tiny, ~1M parameters)")
    p.add_argument("--rounds", type=int, default=0, help="stop after this many rounds (default: the whole epoch)")
    p.add_argument("--inner-steps", type=int, default=10, help="H, inner steps per round (default 10)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per inner step per site (default 8)")
    p.add_argument("--inner-lr", type=float, default=DEMO_INNER_LR,
                   help=f"peak inner AdamW learning rate, the sites' and the baseline's (default {DEMO_INNER_LR}; "
                        "docs/decisions/ops-demo-verdict.md)")
    p.add_argument("--max-documents", type=int, default=100,
                   help="documents of the shipped corpus to use (default 100: a few minutes on 2 cores)")
    p.add_argument("--leave-at", type=int, default=-1,
                   help="round after which the last site leaves gracefully (default: half way; 0 = never)")
    p.add_argument("--workdir", type=Path, default=Path("runs") / "demo", help="where sites keep their state")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up after this many seconds")
    p.add_argument("--overlap", choices=("on", "off"), default="on",
                   help="on (peer serve's default): a site trains the next round while this one is exchanged; "
                        "off: serial rounds")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the centralised baseline on the same tokens (and the time it trains)")
    p.set_defaults(func=run)


def _run_certificates(certs: Path, sites: list[str]) -> Credentials:
    """The demo's own run CA, a certificate per site and one for the demo as operator: the sites
    talk mutual TLS as a real run does (README, Security)."""
    make_run("demo", certs, sites, operators=("operator",))
    return Credentials.from_dir(certs, "operator")


def _status(address: str, creds: Credentials) -> dict[str, Any] | None:
    try:
        with open_blocking_channel(address, creds) as channel:
            return status_document(admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=5))
    except grpc.RpcError:
        return None


def _serve_args(args: argparse.Namespace, workdir: Path, total_steps: int) -> list[str]:
    return ["--preset", "lan", "--train", args.model, "--max-documents", str(args.max_documents),
            "--inner-steps", str(args.inner_steps), "--batch-size", str(args.batch_size),
            "--inner-lr", str(args.inner_lr),
            "--total-steps", str(total_steps), "--round-deadline", "600", "--checkpoint-every", "1",
            "--overlap", args.overlap,
            "--certs", str(workdir / "certs")]


def schedule_steps(samples: int, sites: int, batch: int, inner_steps: int, leave_at: int) -> int:
    """Inner steps a site that stays to the end trains over the epoch: the length of its LR schedule,
    so that it ends where the run does, as the baseline's ends where its run does. All `sites` train
    `leave_at` rounds of `inner_steps` together, then one fewer share the rest (`leave_at` 0: none
    leaves)."""
    if sites > 1 and leave_at:
        together = leave_at * inner_steps * batch * sites
        return leave_at * inner_steps + math.ceil(max(0, samples - together) / (batch * (sites - 1)))
    return math.ceil(samples / (batch * sites))


def _listening(proc: subprocess.Popen[str], site: str, workdir: Path) -> str:
    """Waits for a site's "listening on" line (its trainer is built by then); returns its address."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise SystemExit(f"ops demo: {site} did not start; see {workdir / f'{site}.log'}")
    return line.strip().rsplit(" ", 1)[-1]


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.sites <= len(SITE_NAMES):
        print(f"ops demo: --sites must be 1..{len(SITE_NAMES)}", file=sys.stderr)
        return 2
    workdir = args.workdir / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    sites = list(SITE_NAMES[:args.sites])
    args.creds = _run_certificates(workdir / "certs", sites)
    print(f"sitemesh demo: {args.sites} sites ({', '.join(sites)}), model {args.model}, H={args.inner_steps}; "
          f"state and logs in {workdir}", flush=True)
    # SIGTERM must unwind through local_mesh.running, or the site processes outlive the demo.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    addresses: dict[str, str] = {}
    index = baseline.shipped_index(args.max_documents)  # once: the epoch's size, then the baseline's data
    samples = baseline.epoch_samples(index)
    if args.leave_at < 0:  # half way through the rounds all sites train together
        args.leave_at = max(1, samples // (args.inner_steps * args.batch_size * len(sites)) // 2) \
            if len(sites) > 1 else 0
    total_steps = schedule_steps(samples, len(sites), args.batch_size, args.inner_steps, args.leave_at)
    with local_mesh.running(workdir, sites, lambda _: _serve_args(args, workdir, total_steps)) as procs:
        print(f"  starting {len(sites)} peers (each builds its trainer: tokenizer, model, data blocks)...",
              flush=True)
        for site in sites:
            addresses[site] = _listening(procs[site], site, workdir)
            print(f"  {site} listening on {addresses[site]}", flush=True)
        return _watch(args, workdir, sites, procs, addresses, index)


def _wait_for_members(addresses: dict[str, str], deadline: float, creds: Credentials) -> bool:
    """A line each time another site joins, until every site is an alive member and training."""
    seen = -1
    while time.monotonic() < deadline:
        doc = _status(next(iter(addresses.values())), creds)
        alive = sorted(m["site"] for m in doc["members"] if m["state"] == "alive") if doc else []
        if len(alive) != seen:
            seen = len(alive)
            print(f"  waiting for the sites to join: {len(alive)}/{len(addresses)} alive "
                  f"({', '.join(alive) or 'none yet'})", flush=True)
        if seen == len(addresses):
            return True
        time.sleep(0.5)
    return False


def round_line(r: int, records: list[RoundTimeline], committed: CommittedRound, samples_total: int,
               same: bool) -> str:
    """One committed round: as the sites measured it (the slowest site's wall time, the tokens
    trained per second of it, the mean overhead share, the mean loss), then as the commit log
    records it (`committed`: the leader that committed it, the voters then, the samples committed
    through it, θ's hash) and whether every live peer holds that θ (`same`)."""
    wall = max(rec.wall_s for rec in records)
    tokens = sum(rec.tokens for rec in records)
    overhead = sum(rec.overhead_share for rec in records) / len(records)
    losses = [rec.loss for rec in records if rec.tokens and not math.isnan(rec.loss)]
    return (f"round {r:3d}  {wall:5.1f}s  {tokens / wall if wall else 0:6.0f} tok/s  overhead {100 * overhead:3.0f}%  "
            f"loss {sum(losses) / len(losses) if losses else float('nan'):.3f}  leader {committed.leader}  "
            f"voters {','.join(committed.voters)}  samples {committed.samples_committed}/{samples_total}  "
            f"θ {committed.weights_hash[:12]} "
            f"{'same on all live peers' if same else 'DIFFERS between peers (I7 violated)'}")


def _committed(workdir: Path, sites: list[str]) -> dict[str, dict[int, CommittedRound]] | None:
    """Each site's commit log by round; None when a copy caught a log mid-write (look again)."""
    try:
        return {s: round_log.read(workdir / s) for s in sites}
    except CorruptStore:
        return None


class _Narrator:
    """Prints round lines; on a terminal they scroll above a rich progress bar over the data epoch."""

    def __init__(self) -> None:
        self._progress: Any = None
        self._task: Any = None
        if sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("data epoch"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("samples"), TimeElapsedColumn())
            self._progress.start()

    def line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, highlight=False, markup=False)
        else:
            print(text, flush=True)

    def samples(self, committed: int, total: int) -> None:
        if self._progress is None or not total:
            return
        if self._task is None:
            self._task = self._progress.add_task("epoch", total=total)
        self._progress.update(self._task, completed=committed)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _watch(args: argparse.Namespace, workdir: Path, sites: list[str], procs: dict[str, subprocess.Popen[str]],
           addresses: dict[str, str], index: BlockIndex) -> int:
    start = time.monotonic()
    if not _wait_for_members(addresses, start + args.timeout, args.creds):
        print(f"ops demo: the sites did not all join within {args.timeout:.0f}s", file=sys.stderr)
        return 1
    narrator = _Narrator()
    try:
        status, live = _narrate(args, workdir, sites, procs, addresses, narrator, start)
    finally:
        narrator.close()
    if status is not None:
        return status
    ok = _audit(workdir, sites)
    ok &= _evaluate(workdir, sites, live[0], args, index)
    return 0 if ok else 1


def _narrate(args: argparse.Namespace, workdir: Path, sites: list[str], procs: dict[str, subprocess.Popen[str]],
             addresses: dict[str, str], narrator: _Narrator, start: float) -> tuple[int | None, list[str]]:
    """Rounds as they commit, the graceful leave half way; (exit status if it failed, live sites)."""
    printed, leave_at, left = 0, args.leave_at, False
    live = list(sites)
    ok = True
    while time.monotonic() - start < args.timeout:
        time.sleep(0.25)
        docs = {s: d for s in live if (d := _status(addresses[s], args.creds)) is not None}
        if not docs or any(d["training"] is None for d in docs.values()):
            continue
        any_doc = next(iter(docs.values()))
        t = any_doc["training"]
        narrator.samples(t["samples_committed"], t["samples_total"])
        rounds = {d["training"]["applied_round"] for d in docs.values()}
        # Hashes are comparable only between peers that applied the same round: wait for that.
        if len(rounds) != 1 or min(rounds) <= printed:
            continue
        applied = min(rounds)
        records = {s: timeline_file.read(workdir / s) for s in docs}
        # Every peer has committed (durably, before applying) the rounds it applied.
        if (logs := _committed(workdir, list(docs))) is None:
            continue
        held = {d["training"]["weights_hash"] for d in docs.values()}
        log = next(iter(logs.values()))
        # A site writes its record just after status shows the round applied; a round a state
        # transfer skipped has no record at that site, but a later one does.
        done = min((recs[-1].round if recs else 0) for recs in records.values())
        for r in range(printed + 1, min(applied, done) + 1):
            # One hash for r in every peer's log; each peer checked its θ_r against it when it
            # applied r (a mismatch makes it re-sync), and for the round applied now their θ is here.
            same = len({each[r].weights_hash for each in logs.values()}) == 1
            same &= r != applied or held == {log[r].weights_hash}
            ok &= same
            if this := [rec for recs in records.values() for rec in recs if rec.round == r]:
                narrator.line(round_line(r, this, log[r], t["samples_total"], same))
            printed = r
        if printed < applied:
            continue
        if leave_at and applied >= leave_at and not left and len(live) > 1:
            gone = live.pop()
            with open_blocking_channel(addresses[gone], args.creds) as channel:
                admin_pb2_grpc.AdminStub(channel).Leave(admin_pb2.LeaveRequest(), timeout=10)
            procs[gone].wait(timeout=120)
            left = True
            narrator.line(f"  {gone} left gracefully (exit {procs[gone].returncode}); the run goes on with "
                          f"{', '.join(live)}")
        if t["epoch_complete"] or (args.rounds and applied >= args.rounds):
            return (None if ok else 1), live
    print(f"ops demo: timed out after {args.timeout:.0f}s at round {printed}", file=sys.stderr)
    return 1, live


def _audit(workdir: Path, sites: list[str]) -> bool:
    """`ops audit` over every site's lease ledger: each sample committed once, none lost (I4, I5)."""
    cmd = [sys.executable, "-m", "ops.cli", "audit", *(a for s in sites for a in ("--data-dir", str(workdir / s)))]
    print("$ ops audit " + " ".join(f"--data-dir {workdir / s}" for s in sites), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    print(result.stdout + result.stderr, end="", flush=True)
    return result.returncode == 0


def _evaluate(workdir: Path, sites: list[str], site: str, args: argparse.Namespace,
              index: BlockIndex) -> bool:
    """Loads the final checkpoint the way a user would, compares it with the untrained model and
    (unless --no-baseline) a centralised run on the same tokens, and writes the PNG report with the
    mesh's held-out curve (its checkpoints) and, beside it, the baseline's at the same tokens."""
    ckpt = (workdir / site / "checkpoints" / "latest").resolve()
    final_round = int(ckpt.name.removeprefix("round-"))
    heldout = report.heldout_samples(args.max_documents)
    final = report.checkpoint_perplexity(ckpt, heldout)
    initial = report.untrained_perplexity(args.model, args.max_documents)
    print(f"final checkpoint {ckpt} (round {final_round}) loads with AutoModelForCausalLM.from_pretrained")
    line = f"held-out perplexity: untrained {initial:.1f} -> sitemesh {final:.1f}"
    # The mesh's curve: its checkpoints on the same held-out samples, by the tokens committed then.
    data = report.collect([workdir / s for s in sites], heldout_documents=args.max_documents)
    committed = data.committed_tokens()
    reference = ""
    if args.baseline:
        print("training the centralised baseline on the same tokens (one trainer, all sites' batch), "
              "evaluated at the mesh's checkpoints' tokens...", flush=True)
        data.reference = baseline.centralised_curve(args.model, index, args.sites, args.batch_size,
                                                    heldout, [committed[r] for r, _ in data.perplexity if r in committed],
                                                    args.inner_lr)
        path = workdir / "baseline.json"
        path.write_text(json.dumps([{"tokens": t, "perplexity": p} for t, p in data.reference], indent=1))
        reference = f" --reference {path}"
        central = report.interpolate(data.reference, committed[final_round])
        assert central is not None, "the baseline is evaluated around the final checkpoint's tokens"
        line += f"; centralised on the same tokens {central:.1f} (ratio {final / central:.3f})"
    print(line, flush=True)
    out = workdir / "report.png"
    report.render(data, out)
    print(f"report: {out}  (ops report --data-dir ...{reference} --format md for text)", flush=True)
    return final < initial
