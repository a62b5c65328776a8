"""`ops simulate`: run a protocol core in the deterministic simulator over many seeds.

Each seed is one reproducible run (fake clock, fake network, seeded fault schedule) with the
protocol's invariants checked after every event. A failing seed prints its first violation and the
command that replays it with a full event trace. The last line is always the summary
`seeds=N events=N violations=N`, after a `counters:` line where the protocol totals some of its
scenarios (peer: round opens lost to a restarting site, and re-sent); the exit status is 1 when any
invariant was violated.

    ops simulate --members 20 --seeds 0:500 --faults all --jobs 2
    ops simulate --members 20 --seed 137 --faults all --trace
    ops simulate --faults network,pause --preset wan --seeds 0:50 --json

    ops simulate --protocol peer --members 5 --seeds 0:100     # whole peers: rounds, leases, consensus
    ops simulate --protocol peer --members 5 --seeds 0:100 --faults all,faulty   # and a site that lies

New protocols (consensus, leases, peer) register a `SimProtocol` in `PROTOCOLS`: a function running one
seed from the parsed arguments and the flags that reproduce it.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.certs import make_run
from peer.core.vouchers import VoucherKeys

from peer.sim.faults import parse_faults
from peer.sim.membership_sim import PRESETS, MembershipScenario
from peer.sim.membership_sim import run_seed as run_membership_seed
from peer.sim import consensus_sim, leases_sim, peer_config, peer_sim
from peer.sim.runner import RunResult
from peer.transport.channels import Credentials
from peer.vouching import keys_of


@dataclass(frozen=True)
class SimProtocol:
    """How `ops simulate --protocol NAME` runs one seed and rebuilds its command line."""

    run_seed: Callable[[argparse.Namespace, int, Callable[[str], None] | None], RunResult]
    replay_flags: Callable[[argparse.Namespace], list[str]]
    counters: tuple[str, ...] = ()
    """`RunResult.stats` keys totalled over the seeds and printed before the summary: how often a
    sweep drove the scenario a fix is for (a sweep that never did proves nothing about it)."""


def _membership_scenario(args: argparse.Namespace) -> MembershipScenario:
    return MembershipScenario(members=args.members, preset=args.preset,
                              faults=parse_faults(args.faults), fault_periods=args.fault_periods)


def _membership_run(args: argparse.Namespace, seed: int,
                    trace: Callable[[str], None] | None) -> RunResult:
    return run_membership_seed(seed, _membership_scenario(args), trace)


def _membership_flags(args: argparse.Namespace) -> list[str]:
    return ["--members", str(args.members), "--preset", args.preset, "--faults", args.faults,
            "--fault-periods", f"{args.fault_periods:g}"]


@functools.cache
def sim_keys(members: int) -> dict[str, VoucherKeys]:
    """Voucher keys of a simulated run's sites (`peer_sim.site_names`) from a fresh run CA, made
    once per process (the certificates are read and their directory removed; the keys differ from
    process to process, and nothing a seed decides depends on them)."""
    names = peer_sim.site_names(members)
    with tempfile.TemporaryDirectory(prefix="sim-certs-") as tmp:
        make_run("sim", Path(tmp), names)
        keys = {n: keys_of(Credentials.from_dir(Path(tmp), n)) for n in names}
    return {n: k for n, k in keys.items() if k is not None}


def _peer_run(args: argparse.Namespace, seed: int, trace: Callable[[str], None] | None) -> RunResult:
    """A whole-peer seed; with `faulty`, under the run's keys (its forged vouchers are checked)."""
    keys = sim_keys(args.members) if "faulty" in peer_sim.parse_kinds(args.faults) else None
    return peer_sim.run_seed(args, seed, trace, keys)


PROTOCOLS: dict[str, SimProtocol] = {
    "membership": SimProtocol(_membership_run, _membership_flags),
    "consensus": SimProtocol(consensus_sim.ops_run_seed, consensus_sim.ops_replay_flags),
    "leases": SimProtocol(leases_sim.run_seed, leases_sim.replay_flags),
    "peer": SimProtocol(_peer_run, peer_sim.replay_flags, peer_sim.COUNTERS),
}


def _seed_range(text: str) -> range:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected FIRST:END (end exclusive), got {text!r}") from e
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"empty or negative seed range {text!r}")
    return range(lo, hi)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate", help="run protocol cores in the deterministic simulator",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", choices=sorted(PROTOCOLS), default="membership",
                   help="which protocol scenario to simulate (default: membership)")
    p.add_argument("--members", type=int, default=20, help="simulated members (default: 20)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=_seed_range, default=range(0, 100),
                       help="seed range FIRST:END, end exclusive (default: 0:100)")
    which.add_argument("--seed", type=int, help="run this one seed (use with --trace to replay)")
    p.add_argument("--faults", default="all",
                   help="fault kinds or sets, comma-separated: all, none, benign, network, "
                        "partitions, process, clock, or single kinds such as drop,pause; peer also "
                        "leave, restart (in all) and faulty (only by name) (default: all)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="lan",
                   help="membership timing preset (default: lan)")
    p.add_argument("--fault-periods", type=float, default=60.0,
                   help="length of the fault window in probe periods (default: 60)")
    p.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (default: 1)")
    p.add_argument("--trace", action="store_true",
                   help="print every event (use with --seed)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (per-seed violations and totals) instead of text; "
                        "the summary line then goes to stderr")
    p.set_defaults(func=run)


def _one(job: tuple[str, argparse.Namespace, int]) -> RunResult:
    name, args, seed = job
    return PROTOCOLS[name].run_seed(args, seed, None)


def replay_command(args: argparse.Namespace, seed: int) -> str:
    flags = ["--protocol", args.protocol, *PROTOCOLS[args.protocol].replay_flags(args),
             "--seed", str(seed), "--trace"]
    return "ops simulate " + " ".join(shlex.quote(f) for f in flags)


def run(args: argparse.Namespace) -> int:
    try:
        if args.protocol == "peer":
            peer_sim.parse_kinds(args.faults)
        else:
            parse_faults(args.faults)
        if args.protocol == "membership":
            _membership_scenario(args)  # validates --members, --preset
        elif args.protocol == "peer":
            peer_config.PeerSimConfig(sites=args.members)  # validates --members
    except ValueError as e:
        print(f"ops simulate: {e}", file=sys.stderr)
        return 2
    seeds = [args.seed] if args.seed is not None else list(args.seeds)
    trace = print if args.trace else None
    if trace is not None or args.jobs <= 1 or len(seeds) == 1:
        results = (PROTOCOLS[args.protocol].run_seed(args, s, trace) for s in seeds)
        return _report(args, seeds, results)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        jobs = [(args.protocol, args, s) for s in seeds]
        return _report(args, seeds, pool.map(_one, jobs, chunksize=4))


def _report(args: argparse.Namespace, seeds: list[int], results: Any) -> int:
    events = violations = 0
    failing: list[dict[str, Any]] = []
    counters = dict.fromkeys(PROTOCOLS[args.protocol].counters, 0)
    for r in results:
        events += r.events
        violations += len(r.violations)
        for name in counters:
            counters[name] += r.stats.get(name, 0)
        if r.violations:
            failing.append({"seed": r.seed, "violations": r.violations, "time": r.end_time,
                            "replay": replay_command(args, r.seed)})
            if not args.json:
                print(f"seed={r.seed} violation: {r.violations[0]}")
                print(f"  replay: {replay_command(args, r.seed)}", flush=True)
    summary = f"seeds={len(seeds)} events={events} violations={violations}"
    if args.json:
        print(json.dumps({"protocol": args.protocol, "seeds": len(seeds), "events": events,
                          "violations": violations, "counters": counters, "failing": failing}, indent=2))
        print(summary, file=sys.stderr)
    else:
        if counters:
            print("counters: " + " ".join(f"{k}={v}" for k, v in counters.items()))
        print(summary)
    return 1 if violations else 0
