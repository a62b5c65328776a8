"""`ops`: operator commands against running peers, Slurm and the simulators.

    ops status --peer 127.0.0.1:7001
    ops --help

Each command group lives in its own module exposing `register(subparsers)`; this file only
assembles them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that contribute subcommands (each defines `register(subparsers) -> None`; the parser it
# adds sets `func(args) -> int`).
COMMAND_MODULES: tuple[str, ...] = (
    "ops.mesh",
    "ops.certs",
    "ops.demo",
    "ops.audit",
    "ops.report",
    "ops.placement.commands",
    "ops.autopilot.loop",
    "ops.simulate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ops", description="Operate a sitemesh run.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
