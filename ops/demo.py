"""`ops demo`: a local multi-site training run on embedded defaults, narrated.

    ops demo                          # 3 sites, tiny Qwen3, the shipped corpus, until the epoch ends
    ops demo --sites 2 --rounds 4     # shorter

Starts one `peer serve --train` per site on loopback (the first founds the run, the others join),
prints every committed round with the leader, the voters, the samples committed and whether every
live peer holds the same θ (I7), makes one site leave gracefully half way (the run goes on without
it), and ends by loading the final checkpoint with `AutoModelForCausalLM.from_pretrained` and
measuring its held-out perplexity against the untrained model's. Exit status 0 when all of that held.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from ops.certs import make_run
from ops.mesh import status_document
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.transport.channels import Credentials, open_blocking_channel

SITE_NAMES = ("snellius", "lumi", "frontier", "leonardo", "mareNostrum", "jupiter")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a local multi-site training run (the README's main job)")
    p.add_argument("--sites", type=int, default=3, help="number of local sites (default 3)")
    p.add_argument("--model", default="tiny", help="model preset (default tiny, ~1M parameters)")
    p.add_argument("--rounds", type=int, default=0, help="stop after this many rounds (default: the whole epoch)")
    p.add_argument("--inner-steps", type=int, default=10, help="H, inner steps per round (default 10)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per inner step per site (default 8)")
    p.add_argument("--max-documents", type=int, default=100,
                   help="documents of the shipped corpus to use (default 100: a few minutes on 2 cores)")
    p.add_argument("--leave-at", type=int, default=-1,
                   help="round after which the last site leaves gracefully (default: half way; 0 = never)")
    p.add_argument("--workdir", type=Path, default=Path("runs") / "demo", help="where sites keep their state")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up after this many seconds")
    p.set_defaults(func=run)


def _status(address: str, creds: Credentials) -> dict[str, Any] | None:
    try:
        with open_blocking_channel(address, creds) as channel:
            return status_document(admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=5))
    except grpc.RpcError:
        return None


def _run_certificates(certs: Path, sites: list[str]) -> Credentials:
    """The demo's own run CA, a certificate per site and one for the demo as operator: the sites
    talk mutual TLS as a real run does (README, Security)."""
    make_run("demo", certs, sites, operators=("operator",))
    return Credentials.from_dir(certs, "operator")


def _start(workdir: Path, site: str, join: str | None, args: argparse.Namespace, total_steps: int) -> tuple[
        subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "peer.cli", "serve", "--site", site, "--listen", "127.0.0.1:0",
           "--data-dir", str(workdir / site), "--preset", "lan", "--train", args.model,
           "--max-documents", str(args.max_documents), "--inner-steps", str(args.inner_steps),
           "--batch-size", str(args.batch_size), "--total-steps", str(total_steps), "--round-deadline", "600",
           "--checkpoint-every", "1", "--certs", str(workdir / "certs")]
    if join:
        cmd += ["--join", join]
    log = open(workdir / f"{site}.log", "a")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise SystemExit(f"ops demo: {site} did not start; see {workdir / f'{site}.log'}")
    return proc, line.strip().rsplit(" ", 1)[-1]


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.sites <= len(SITE_NAMES):
        print(f"ops demo: --sites must be 1..{len(SITE_NAMES)}", file=sys.stderr)
        return 2
    workdir = args.workdir / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    sites = list(SITE_NAMES[:args.sites])
    args.creds = _run_certificates(workdir / "certs", sites)
    print(f"sitemesh demo: {args.sites} sites ({', '.join(sites)}), model {args.model}, H={args.inner_steps}; "
          f"state and logs in {workdir}")
    # SIGTERM must unwind through `finally` below, or the site processes outlive the demo.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    procs: dict[str, subprocess.Popen[str]] = {}
    addresses: dict[str, str] = {}
    # A rough schedule length: the whole epoch split over the sites (refined by the LR floor anyway).
    total_steps = max(100, args.max_documents)
    try:
        for site in sites:
            procs[site], addresses[site] = _start(workdir, site, addresses.get(sites[0]), args, total_steps)
            print(f"  {site} listening on {addresses[site]}")
        return _watch(args, workdir, sites, procs, addresses)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _watch(args: argparse.Namespace, workdir: Path, sites: list[str], procs: dict[str, subprocess.Popen[str]],
           addresses: dict[str, str]) -> int:
    start = time.monotonic()
    last_round, leave_at, left = 0, args.leave_at, False
    live = list(sites)
    ok = True
    while time.monotonic() - start < args.timeout:
        time.sleep(1.0)
        docs = {s: d for s in live if (d := _status(addresses[s], args.creds)) is not None}
        if not docs or any(d["training"] is None for d in docs.values()):
            continue
        rounds = {d["training"]["applied_round"] for d in docs.values()}
        applied = min(rounds)
        # Hashes are comparable only between peers that applied the same round: wait for that.
        if len(rounds) == 1 and applied > last_round:
            last_round = applied
            any_doc = next(iter(docs.values()))
            t = any_doc["training"]
            same = len({d["training"]["weights_hash"] for d in docs.values()}) == 1
            ok &= same
            losses = [d["training"]["last_loss"] for d in docs.values() if d["training"]["last_loss"] is not None]
            print(f"round {applied:3d}  leader {any_doc['leader']}  voters {','.join(any_doc['voters'])}  "
                  f"samples {t['samples_committed']}/{t['samples_total']}  "
                  f"loss {sum(losses) / max(len(losses), 1):.3f}  θ {t['weights_hash'][:12]} "
                  f"{'same on all live peers' if same else 'DIFFERS between peers (I7 violated)'}", flush=True)
            if leave_at < 0 and t["samples_total"]:
                per_round = max(1, args.inner_steps * args.batch_size * len(sites))
                leave_at = max(1, t["samples_total"] // per_round // 2) if len(sites) > 1 else 0
            if leave_at and applied >= leave_at and not left and len(live) > 1:
                gone = live.pop()
                with open_blocking_channel(addresses[gone], args.creds) as channel:
                    admin_pb2_grpc.AdminStub(channel).Leave(admin_pb2.LeaveRequest(), timeout=10)
                procs[gone].wait(timeout=120)
                left = True
                print(f"  {gone} left gracefully (exit {procs[gone].returncode}); the run goes on with "
                      f"{', '.join(live)}", flush=True)
            if t["epoch_complete"] or (args.rounds and applied >= args.rounds):
                break
    else:
        print(f"ops demo: timed out after {args.timeout:.0f}s at round {last_round}", file=sys.stderr)
        return 1
    return 0 if _audit(workdir, sites) and _evaluate(workdir / live[0], args) and ok else 1


def _audit(workdir: Path, sites: list[str]) -> bool:
    """`ops audit` over every site's lease ledger: each sample committed once, none lost (I4, I5)."""
    cmd = [sys.executable, "-m", "ops.cli", "audit", *(a for s in sites for a in ("--data-dir", str(workdir / s)))]
    print("$ ops audit " + " ".join(f"--data-dir {workdir / s}" for s in sites), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    print(result.stdout + result.stderr, end="", flush=True)
    return result.returncode == 0


def _evaluate(site_dir: Path, args: argparse.Namespace) -> bool:
    """Loads the final checkpoint the way a user would and compares it with the untrained model."""
    import torch
    from transformers import AutoModelForCausalLM

    from peer.trainer.blocks import BlockIndex
    from peer.trainer.config import MODEL_PRESETS, DataConfig
    from peer.trainer.evaluate import perplexity
    from peer.trainer.model import build_model

    ckpt = (site_dir / "checkpoints" / "latest").resolve()
    meta = json.loads((ckpt / "meta.json").read_text()) if (ckpt / "meta.json").exists() else {}
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    heldout = BlockIndex(DataConfig.shipped(max_documents=args.max_documents)).corpus.heldout(64)
    cpu = torch.device("cpu")
    final = perplexity(model, heldout, cpu, bf16=False)
    initial = perplexity(build_model(MODEL_PRESETS[args.model], cpu, seed=0), heldout, cpu, bf16=False)
    print(f"final checkpoint {ckpt} (round {meta.get('round', '?')}) loads with AutoModelForCausalLM.from_pretrained")
    print(f"held-out perplexity: untrained {initial:.1f} -> trained {final:.1f}")
    return final < initial
