"""`peer`: the per-site daemon.

    peer serve --site a --listen 127.0.0.1:7001 --certs certs/
    peer serve --site b --listen 127.0.0.1:7002 --join 127.0.0.1:7001 --certs certs/
    peer serve --site c --listen 127.0.0.1:7003 --insecure      # plaintext, explicitly
    peer serve --config examples/run.toml --site lumi

SIGTERM (Slurm's end-of-job signal) and SIGINT mean a graceful leave; so does the job's end drawing
near (`--leave-before`). Errors a user can fix
(bad flags or config, port in use, unreachable seeds) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from peer import config as cfg
from peer.core.site_names import is_job_member, job_member
from peer.dirlock import lock_dir
from peer.head_start import head_start
from peer import job_record, logformat, relay, slurm_env
from peer.core.election import ElectionConfig
from peer.core.lease_config import LeaseConfig
from peer.logstore import CorruptStore
from peer.core.membership import MembershipConfig
from peer.heldout import default_eval_every
from peer.join_errors import JoinFailed
from peer.reach import NotReachable
from peer.core.rounds import RoundsConfig
from peer.trainer.config import MODEL_PRESETS, WIRE_FORMATS, DataConfig, InnerConfig, RanksConfig, TrainerConfig
from peer.trainer.process import TrainerError
from peer.outer_config import LONG_RUN_LR, LONG_RUN_ROUNDS, SHORT_RUN_ROUNDS, SPARSE_OUTER, OuterConfig, lr_for

if TYPE_CHECKING:
    from peer.node import Node

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="peer", description="The sitemesh per-site daemon.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run this site's peer until it leaves")
    serve.add_argument("--site", required=True, help="this site's name (unique in the run, stable across restarts)")
    serve.add_argument("--listen", help="host:port to bind (port 0 picks a free one); default 127.0.0.1:0")
    serve.add_argument("--advertise", help="host:port other sites dial, if not the listen address")
    serve.add_argument("--join", action="append", metavar="HOST:PORT", help="seed member to join through (repeatable)")
    serve.add_argument("--data-dir", type=Path, help="directory for this site's durable state")
    serve.add_argument("--config", type=Path, help="run file (TOML) with a [sites.SITE] section")
    serve.add_argument(
        "--preset", choices=cfg.PRESETS,
        help="membership, election and data-lease timings (overrides [membership] preset)"
    )
    serve.add_argument("--round-interval", type=float,
                       help="leader commits an empty round this often, in seconds (no trainer; 0 = off)")
    serve.add_argument("--join-timeout", type=float, help="seconds to retry unreachable seeds before giving up")
    serve.add_argument("--certs", type=Path, metavar="DIR",
                       help="ca.crt, SITE.crt, SITE.key from `ops certs`: serve and dial with mutual TLS")
    serve.add_argument("--insecure", action="store_true", default=None,
                       help="plaintext gRPC, no identities: anyone who reaches the port is a member")
    serve.add_argument("--job", type=int, metavar="N",
                       help="this peer is the site's job number N (ops autopilot): it joins as member SITE.jN with "
                            "the data dir's jN/ beside its predecessor, which leaves at its wall time")
    serve.add_argument("--leave-before", type=float, metavar="SECONDS",
                       help="under Slurm, leave gracefully this long before the job's end (SLURM_JOB_END_TIME) "
                            "whether or not a signal came (ops submit and autopilot pass the run file's "
                            "leave_seconds)")
    serve.add_argument("--role", choices=("site", "relay"), default="site",
                       help="site (default): a member of the run; relay: only forward connections to outbound "
                            "sites, on --listen, with a relay certificate (ops certs issue --relay NAME)")
    serve.add_argument("--reach", choices=cfg.REACH,
                       help="direct (default): other sites dial --advertise; outbound: this node accepts no "
                            "inbound connection and is reached through --relay, which it dials out to")
    serve.add_argument("--relay", action="append", metavar="HOST:PORT",
                       help="a relay an outbound site holds a tunnel to (repeatable; two or more: no single "
                            "point of failure)")
    serve.add_argument("--proxy", metavar="URL",
                       help="HTTP CONNECT proxy for every connection this peer opens, http://HOST:PORT "
                            "(default: $https_proxy; $no_proxy honoured)")
    serve.add_argument("--relay-listen", metavar="HOST:PORT",
                       help="also relay for outbound sites on this address (this site must be dialable there)")
    serve.add_argument("--metrics-listen", metavar="HOST:PORT",
                       help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks one; default off)")
    train = serve.add_argument_group("training (this site trains when --train is given)")
    train.add_argument("--train", metavar="MODEL", choices=sorted(MODEL_PRESETS),
                       help=f"train a Qwen3 preset from random init: {', '.join(sorted(MODEL_PRESETS))}")
    train.add_argument("--data", metavar="FILE", action="append",
                       help="data shard (jsonl/parquet/txt, repeatable); default: the shipped corpus")
    train.add_argument("--max-documents", type=int, help="read only the first N documents of each shard")
    train.add_argument("--inner-steps", type=int, default=20, help="H, inner AdamW steps per round (default 20)")
    train.add_argument("--batch-size", type=int, default=8, help="samples per inner step at this site (default 8)")
    train.add_argument("--micro-batch-size", type=int,
                       help="samples per forward pass on one rank (default: batch size / ranks per node)")
    train.add_argument("--seq-len", type=int, help="tokens per sample (default 128)")
    train.add_argument("--nproc-per-node", type=int, default=1,
                       help="trainer ranks on this node, or per node of the Slurm job (default 1)")
    train.add_argument("--launcher", choices=("local", "srun"), default="local",
                       help="start the ranks here (torch.distributed.elastic) or with srun over the job")
    train.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp",
                       help="DDP replicas, or FSDP2 shards for models that do not fit one device")
    train.add_argument("--collective-timeout", type=float, default=600.0,
                       help="seconds before a hung collective fails, naming the rank (default 600)")
    train.add_argument("--compile", action="store_true", help="torch.compile the model (accelerators)")
    train.add_argument("--inner-lr", type=float, default=InnerConfig.lr,
                       help=f"peak AdamW learning rate of the inner steps (default {InnerConfig.lr})")
    train.add_argument("--total-steps", type=int, default=1000,
                       help="inner steps of the LR schedule over the whole run (default 1000)")
    train.add_argument("--data-epochs", type=int, default=1,
                       help="passes over the data; no round opens once the log completed them (default 1)")
    train.add_argument("--round-deadline", type=float, default=300.0,
                       help="seconds the leader waits for a round's contributions (default 300)")
    train.add_argument("--round-deadline-k", type=float, default=0.0, metavar="K",
                       help="adapt the round deadline to the sites' pace: median + K x MAD of recent report "
                            "delays (+2 s), never above --round-deadline (default 0: the fixed deadline)")
    train.add_argument("--start-sites", type=int, default=1, metavar="N",
                       help="the first round opens only once N sites are live (default 1)")
    train.add_argument("--round-budget", type=float, default=0.0, metavar="SECONDS",
                       help="time-boxed rounds: each site trains as many of the H inner steps as fit in this "
                            "many seconds (at least one); the token-weighted mean absorbs the unequal work "
                            "(default 0: every site runs all H)")
    train.add_argument("--outer-lr", type=float,
                       help="outer Nesterov learning rate; the same on every site (default: 1 for a run of up to "
                            f"{SHORT_RUN_ROUNDS} rounds (--total-steps / --inner-steps), {LONG_RUN_LR} from "
                            f"{LONG_RUN_ROUNDS} on, docs/decisions/outer-defaults.md; {SPARSE_OUTER.lr} with --wire sparse)")
    train.add_argument("--outer-momentum", type=float, default=OuterConfig.momentum,
                       help=f"outer momentum (default {OuterConfig.momentum}: DiLoCo's 0.9 overshot from 12 to 98 "
                            "rounds; keep 0 with --wire sparse, whose decayed error feedback stands in for it)")
    train.add_argument("--checkpoint-every", type=int, default=0,
                       help="write a Hugging Face checkpoint every N rounds (default 0: never)")
    train.add_argument("--eval-every", type=int, metavar="N",
                       help="the leader evaluates θ on the held-out set every N committed rounds and the last, "
                            "into timeline.jsonl, metrics and TensorBoard (0: never; default: the smallest N whose "
                            "evaluations cost under 2%% of the rounds' compute, --eval-samples / (0.04 x H x batch))")
    train.add_argument("--eval-samples", type=int, default=256,
                       help="held-out samples per evaluation (default 256, or all a smaller held-out split has)")
    train.add_argument("--wire", default="bf16", choices=WIRE_FORMATS,
                       help="wire format of pseudo-gradients and mean shards; the same on every site (default bf16; "
                            "sparse: the --wire-density largest of every 4096 entries, all-gathered)")
    train.add_argument("--wire-density", type=float, default=1 / 64,
                       help="sparse wire: share of every 4096 pseudo-gradient entries sent; the same on every site "
                            "(default 1/64 = 64 of 4096, 0.227 bits per parameter)")
    train.add_argument("--feedback-decay", type=float, default=None,
                       help="error-feedback decay of int8/int4/sparse (default: 0.95 for sparse, 1 otherwise)")
    serve.add_argument("--exchange-plane", choices=("bulk", "grpc"),
                       help="where pseudo-gradient chunks travel: bulk (a TCP data plane negotiated over gRPC, "
                            "the default) or grpc (FetchChunks only)")
    train.add_argument("--trainer-threads", type=int, metavar="N",
                       help="torch threads of the trainer worker (default: one per core); several sites on one "
                            "machine should split its cores")
    train.add_argument("--overlap", choices=("on", "off"),
                       help="on (the default): train round r+1 while round r is exchanged and committed, folding "
                            "θ_r in when it is applied; off: strictly serial rounds (run file: overlap = false)")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    serve.add_argument("--log-format", choices=logformat.FORMATS, default="human",
                       help="human lines (default) or json: one object per line with site, round, epoch")
    serve.set_defaults(func=_serve)

    repair = sub.add_parser("repair", help="set a damaged data dir aside so the site rebuilds from the run")
    repair.add_argument("--data-dir", type=Path, required=True, help="the site's data dir (no peer may run on it)")
    repair.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    repair.set_defaults(func=_repair)
    return parser


def _repair(args: argparse.Namespace) -> int:
    """Moves the contents of a damaged data dir to `<dir>.damaged-<time>`; the next `peer serve --join`
    starts empty and receives the log and θ from the leader, as a joining site does."""
    data_dir: Path = args.data_dir
    if not data_dir.is_dir():
        print(f"peer: error: {data_dir} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    try:
        lock = lock_dir(data_dir)  # refuses while a peer runs on it
    except OSError as err:
        print(f"peer: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    with lock:
        entries = sorted(p for p in data_dir.iterdir() if p.name != "LOCK")
        if not entries:
            print(f"{data_dir} is empty: nothing to repair; start the peer with --join MEMBER")
            return 0
        aside = data_dir.with_name(f"{data_dir.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        print(f"will move {', '.join(p.name for p in entries)} from {data_dir} to {aside}")
        if not args.yes and input("proceed? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return 1
        aside.mkdir()
        for path in entries:
            path.rename(aside / path.name)
        print(f"done: now start this site with `peer serve ... --data-dir {data_dir} --join MEMBER`; it receives "
              f"the log and θ from the run's leader. The old state stays in {aside}.")
    return 0


def _training_from(args: argparse.Namespace) -> dict[str, object]:
    if args.train is None:
        return {}
    seq = {"seq_len": args.seq_len} if args.seq_len else {}
    data = DataConfig(shards=tuple(args.data), max_documents=args.max_documents, **seq) if args.data else \
        DataConfig.shipped(max_documents=args.max_documents, **seq)
    micro = args.micro_batch_size or max(1, args.batch_size // args.nproc_per_node)
    inner = InnerConfig(lr=args.inner_lr, batch_size=args.batch_size, micro_batch_size=micro, total_steps=args.total_steps,
                        warmup_steps=min(50, args.total_steps // 10), compile=args.compile)
    ranks = RanksConfig(nproc_per_node=args.nproc_per_node, launcher=args.launcher, parallel=args.parallel,
                        collective_timeout_s=args.collective_timeout)
    return {
        "trainer": TrainerConfig(model=MODEL_PRESETS[args.train], data=data, inner=inner, ranks=ranks,
                                 wire=args.wire, wire_density=args.wire_density, feedback_decay=args.feedback_decay,
                                 eval_samples=args.eval_samples),
        "rounds": RoundsConfig(inner_steps=args.inner_steps, samples_per_step=args.batch_size,
                               deadline_s=args.round_deadline, data_epochs=args.data_epochs,
                               deadline_k=args.round_deadline_k, budget_s=args.round_budget,
                               start_sites=args.start_sites),
        "outer": OuterConfig(lr=args.outer_lr if args.outer_lr is not None else
                             SPARSE_OUTER.lr if args.wire == "sparse" else
                             lr_for(-(-args.total_steps // args.inner_steps)),
                             momentum=args.outer_momentum,
                             checkpoint_every=args.checkpoint_every,
                             eval_every=default_eval_every(args.eval_samples, args.inner_steps, args.batch_size)
                             if args.eval_every is None else args.eval_every),
    }


def _config_from(args: argparse.Namespace) -> cfg.PeerConfig:
    try:
        training = _training_from(args)
    except ValueError as err:
        raise cfg.ConfigError(f"bad training flags: {err}") from err
    overrides = {
        **training,
        "listen": args.listen,
        "advertise": args.advertise,
        "join": args.join,
        "data_dir": args.data_dir,
        "join_timeout_s": args.join_timeout,
        "membership": getattr(MembershipConfig, args.preset)() if args.preset else None,
        "election": getattr(ElectionConfig, args.preset)() if args.preset else None,
        "leases": getattr(LeaseConfig, args.preset)() if args.preset else None,
        "round_interval_s": args.round_interval,
        "certs": args.certs,
        "insecure": args.insecure,
        "metrics_listen": args.metrics_listen,
        "exchange_plane": args.exchange_plane,
        "overlap": None if args.overlap is None else args.overlap == "on",
        "reach": args.reach,
        "relays": args.relay,
        "proxy": args.proxy,
        "relay_listen": args.relay_listen,
        "trainer_threads": args.trainer_threads,
    }
    if is_job_member(args.site):
        raise cfg.ConfigError(f"site name {args.site!r} reads as a job's member: name the site and give --job N")
    if args.config is not None:
        config = cfg.load(args.config, args.site, overrides)
    else:
        config = cfg.from_values({"site": args.site, **{k: v for k, v in overrides.items() if v is not None}})
    if args.job is None:
        return config
    try:
        member = job_member(config.site, args.job)
    except ValueError as err:
        raise cfg.ConfigError(f"--job: {err}") from None
    data_dir = config.data_dir / f"j{args.job}" if config.data_dir is not None else None
    return dataclasses.replace(config, site=member, data_dir=data_dir)


def _leave_before_end(node: Node, site: str, leave_before: float) -> asyncio.TimerHandle | None:
    """Under Slurm, a graceful leave `leave_before` seconds before the job's end (at once if that has
    passed), so the peer is gone before the wall time even when Slurm's --signal comes late or not
    at all: slurmctld sends it at its first 30-second check inside the window, and a template or a
    launcher may not pass it on. A signal that comes first starts the same leave (Node.leave)."""
    end = job_record.job_end()
    if end is None:
        return None
    at = end - leave_before
    clock = time.strftime("%H:%M:%S", time.gmtime(at))
    print(f"peer {site} leaves at {clock} UTC, {leave_before:g} s before its job's end", flush=True)

    def leave() -> None:
        print(f"peer {site}: its job ends in {end - time.time():.0f} s, leaving", flush=True)
        asyncio.ensure_future(node.leave())

    return asyncio.get_running_loop().call_later(max(0.0, at - time.time()), leave)


async def _run(config: cfg.PeerConfig, log_format: str = "human", log_level: str = "INFO",
               leave_before: float | None = None) -> int:
    try:  # the lock, and the trainer loading while this process imports what follows
        head = await head_start(config)
    except OSError as err:  # another peer holds the data dir; the worker could not be spawned
        print(f"peer: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    from peer.node import Node  # torch and numba (~370 MiB): a relay (--role relay) never needs them

    try:
        node = Node(config, head=head)
    except OSError as err:  # certificates missing or not this site's
        if head is not None:
            await head.close()
        print(f"peer: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    logformat.configure(log_level, log_format, config.site, lambda: {
        "round": node.applied_round, "epoch": node.consensus.hard.epoch if node.consensus else None})
    try:
        address = await node.start()
    except (OSError, CorruptStore) as err:
        print(f"peer: error: {err}", file=sys.stderr)
        node.stop()  # its trainer has been loading since the head start
        await node.wait_stopped()
        return EXIT_USAGE
    except TrainerError as err:
        print(f"peer: error: this site's trainer did not start: {err}", file=sys.stderr)
        node.stop()
        await node.wait_stopped()
        return EXIT_USAGE
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(node.leave()))
    # Tests and scripts read this line to learn the bound port.
    print(f"peer {config.site} listening on {address}", flush=True)
    if node.metrics_port is not None:
        host = config.metrics_listen.rsplit(":", 1)[0]
        print(f"peer {config.site} metrics on http://{host}:{node.metrics_port}/metrics", flush=True)
    timer = None if leave_before is None else _leave_before_end(node, config.site, leave_before)
    try:
        if config.join:
            await node.reach.check_reachable(address, config.join)
            members = await node.join(config.join)
            print(f"peer {config.site} joined: {members} members", flush=True)
    except (JoinFailed, NotReachable) as err:
        print(f"peer: error: {err}", file=sys.stderr)
        node.stop()
        await node.wait_stopped()
        return EXIT_USAGE
    await node.wait_stopped()
    if timer is not None:
        timer.cancel()
    print(f"peer {config.site} stopped", flush=True)
    return 1 if node.failed else 0


def _serve(args: argparse.Namespace) -> int:
    logformat.configure(args.log_level, args.log_format, args.site, dict)
    if args.role == "relay":
        return asyncio.run(relay.serve(args.site, args.listen or "0.0.0.0:7100", args.certs))
    try:
        config = _config_from(args)
    except cfg.ConfigError as err:
        print(f"peer: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.leave_before is not None and args.leave_before < 0:
        print(f"peer: error: --leave-before {args.leave_before:g}: give 0 or more seconds", file=sys.stderr)
        return EXIT_USAGE
    missing = slurm_env.complete(os.environ)  # Slurm before 23.02: the job's times from squeue
    if missing:
        logging.getLogger("sitemesh.peer").warning(missing)
    return asyncio.run(_run(config, args.log_format, args.log_level, args.leave_before))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
