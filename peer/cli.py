"""`peer`: the per-site daemon.

    peer serve --site a --listen 127.0.0.1:7001
    peer serve --site b --listen 127.0.0.1:7002 --join 127.0.0.1:7001
    peer serve --config examples/run.toml --site lumi

SIGTERM (Slurm's end-of-job signal) and SIGINT mean a graceful leave. Errors a user can fix
(bad flags or config, port in use, unreachable seeds) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from peer import config as cfg
from peer.election import ElectionConfig
from peer.membership import MembershipConfig
from peer.node import JoinFailed, Node

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
        "--preset", choices=cfg.PRESETS, help="membership and election timings (overrides [membership] preset)"
    )
    serve.add_argument("--round-interval", type=float,
                       help="leader commits an empty round this often, in seconds (no trainer; 0 = off)")
    serve.add_argument("--join-timeout", type=float, help="seconds to retry unreachable seeds before giving up")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    serve.set_defaults(func=_serve)
    return parser


def _config_from(args: argparse.Namespace) -> cfg.PeerConfig:
    overrides = {
        "listen": args.listen,
        "advertise": args.advertise,
        "join": args.join,
        "data_dir": args.data_dir,
        "join_timeout_s": args.join_timeout,
        "membership": getattr(MembershipConfig, args.preset)() if args.preset else None,
        "election": getattr(ElectionConfig, args.preset)() if args.preset else None,
        "round_interval_s": args.round_interval,
    }
    if args.config is not None:
        return cfg.load(args.config, args.site, overrides)
    return cfg.from_values({"site": args.site, **{k: v for k, v in overrides.items() if v is not None}})


async def _run(config: cfg.PeerConfig) -> int:
    node = Node(config)
    try:
        address = await node.start()
    except OSError as err:
        print(f"peer: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(node.leave()))
    # Tests and scripts read this line to learn the bound port.
    print(f"peer {config.site} listening on {address}", flush=True)
    try:
        if config.join:
            members = await node.join(config.join)
            print(f"peer {config.site} joined: {members} members", flush=True)
    except JoinFailed as err:
        print(f"peer: error: {err}", file=sys.stderr)
        node.stop()
        await node.wait_stopped()
        return EXIT_USAGE
    await node.wait_stopped()
    print(f"peer {config.site} stopped", flush=True)
    return 0


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        config = _config_from(args)
    except cfg.ConfigError as err:
        print(f"peer: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_run(config))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
