"""`ops status`, `ops leave`, `ops join`: talk to one running peer.

    ops status --peer 127.0.0.1:7001 [--json]
    ops status --peer 127.0.0.1:7001 --watch [--interval 2]   # refreshes in place until Ctrl-C
    ops leave --peer 127.0.0.1:7002
    ops join --peer 127.0.0.1:7004 --seed 127.0.0.1:7001

`ops status --json` prints a stable document (documented in docs/ops.md):
    {"self": SITE, "uptime_s": float, "version": str,
     "members": [{"site", "address", "state", "incarnation", "last_heard_s", "rtt_ms", "path", "meta"}, ...],
     "leader": SITE or null, "epoch": int, "committed_round": int, "voters": [SITE, ...],
     "consensus": {"role", "lease_remaining_s", "commit_index", "applied_index"},
     "training": null or {"applied_round", "weights_hash", "samples_committed", "samples_total",
                          "last_loss", "epoch_complete", "diverged", "data_epoch", "leases_held",
                          "last_decision",
                          "job": null or {"job", "member", "nodes", "allocated_s", "joining_s", "training_s",
                                          "goodput", "ends_in_s" (null outside Slurm)},
                          "last_round": null or {"round", "gather_s", "compute_s", "publish_s",
                                                 "exchange_s", "commit_wait_s", "outer_s", "persist_s",
                                                 "idle_s", "wall_s", "overhead_share", "tokens",
                                                 "tokens_per_s", "inner_steps"}}}
with state one of alive, suspect, dead, left and meta
    {"role", "accelerator", "tokens_per_s", "labels": {...}}.

The table adds one line per live training site with its last round's timeline (peer/core/timeline.py),
asking each site directly: every site measures its own round on its own clock.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from ops.certs import CertError, add_client_flags, client_credentials
from ops.durations import duration
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc, membership_pb2
from peer.core.timeline import PHASES
from peer.transport.channels import open_blocking_channel

EXIT_UNREACHABLE = 3


def register(sub: argparse._SubParsersAction) -> None:
    status = sub.add_parser("status", help="one peer's view of the mesh")
    status.add_argument("--peer", required=True, metavar="HOST:PORT", help="address of any running peer")
    status.add_argument("--json", action="store_true", help="machine-readable output (stable keys)")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the peer")
    add_client_flags(status)
    status.add_argument("--watch", action="store_true", help="refresh in place until interrupted (Ctrl-C)")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes with --watch")
    status.set_defaults(func=_status)

    leave = sub.add_parser("leave", help="make a peer leave the mesh gracefully and exit")
    leave.add_argument("--peer", required=True, metavar="HOST:PORT", help="address of the peer that leaves")
    leave.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the peer")
    add_client_flags(leave)
    leave.set_defaults(func=_leave)

    join = sub.add_parser("join", help="make a lone running peer join a mesh")
    join.add_argument("--peer", required=True, metavar="HOST:PORT", help="address of the peer that joins")
    join.add_argument("--seed", required=True, action="append", metavar="HOST:PORT", help="any member (repeatable)")
    join.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the join")
    add_client_flags(join)
    join.set_defaults(func=_join)


def _call(args: argparse.Namespace, method: str, request: Any) -> Any:
    try:
        creds = client_credentials(args)
    except CertError as err:
        raise SystemExit(f"ops: error: {err}") from None
    with open_blocking_channel(args.peer, creds) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        return getattr(stub, method)(request, timeout=args.timeout)


def _fail(address: str, err: grpc.RpcError) -> int:
    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        print(f"ops: error: no peer answers at {address} ({code.name}): is it running, and is the address right?",
              file=sys.stderr)
        return EXIT_UNREACHABLE
    print(f"ops: error: {address} refused: {code.name}: {err.details()}", file=sys.stderr)
    return 1


def status_document(reply: admin_pb2.StatusReply) -> dict[str, Any]:
    """The stable JSON form of a StatusReply."""
    return {
        "self": reply.self,
        "uptime_s": round(reply.uptime_s, 3),
        "version": reply.version,
        "members": [
            {
                "site": mem.site,
                "address": mem.address,
                "state": membership_pb2.MemberState.Name(mem.state).removeprefix("MEMBER_STATE_").lower(),
                "incarnation": mem.incarnation,
                "last_heard_s": round(mem.last_heard_s, 3),
                "rtt_ms": round(1000 * mem.rtt_s, 1) if mem.HasField("rtt_s") else None,
                "path": mem.path,
                "meta": {
                    "role": mem.meta.role,
                    "accelerator": mem.meta.accelerator,
                    "tokens_per_s": mem.meta.tokens_per_s,
                    "labels": dict(sorted(mem.meta.labels.items())),
                },
            }
            for mem in reply.members
        ],
        "leader": reply.consensus.leader or None,
        "epoch": reply.consensus.epoch,
        "committed_round": reply.consensus.committed_round,
        "voters": list(reply.consensus.voters),
        "training": None if not reply.HasField("training") else {
            "applied_round": reply.training.applied_round,
            "weights_hash": reply.training.weights_hash,
            "samples_committed": reply.training.samples_committed,
            "samples_total": reply.training.samples_total,
            "last_loss": None if math.isnan(reply.training.last_loss) else round(reply.training.last_loss, 4),
            "epoch_complete": reply.training.epoch_complete,
            "diverged": reply.training.diverged or None,
            "data_epoch": reply.training.data_epoch,
            "leases_held": reply.training.leases_held,
            "last_decision": reply.training.last_decision or None,
            "job": _job_document(reply.training.job) if reply.training.HasField("job") else None,
            "last_round": _timeline_document(reply.training.last_round)
            if reply.training.HasField("last_round") else None,
        },
        "consensus": {
            "role": reply.consensus.role,
            "lease_remaining_s": round(reply.consensus.lease_remaining_s, 3),
            "commit_index": reply.consensus.commit_index,
            "applied_index": reply.consensus.applied_index,
        },
    }


def _timeline_document(t: admin_pb2.RoundTimeline) -> dict[str, Any]:
    doc: dict[str, Any] = {f"{p}_s": round(getattr(t, f"{p}_s"), 4) for p in PHASES}
    doc.update(round=t.round, wall_s=round(t.wall_s, 4), overhead_share=round(t.overhead_share, 4),
               tokens=t.tokens, tokens_per_s=round(t.tokens_per_s, 1), inner_steps=t.inner_steps)
    return doc


TIMELINE_HEAD = ("SITE", "ROUND", "WALL", "COMPUTE", "EXCHANGE", "COMMIT", "OUTER", "PERSIST", "OVERHEAD",
                 "TOK/S")


def _timeline_row(site: str, t: dict[str, Any] | None) -> tuple[str, ...]:
    """One site's last round; exchange includes publishing, commit the wait for it (status columns)."""
    if t is None:
        return (site, "-", *("-",) * (len(TIMELINE_HEAD) - 2))
    return (site, str(t["round"]), f"{t['wall_s']:.2f}s", f"{t['compute_s']:.2f}s",
            f"{t['publish_s'] + t['exchange_s']:.2f}s", f"{t['commit_wait_s']:.2f}s", f"{t['outer_s']:.2f}s",
            f"{t['persist_s']:.2f}s", f"{100 * t['overhead_share']:.0f}%", f"{t['tokens_per_s']:.0f}")


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def site_timelines(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, Any] | None | str]:
    """site -> last round's timeline of every live member, asked directly (the answering peer's own
    from `doc`): None for a site that has not finished a round or does not train, a string when it
    did not answer. Each site is asked with the caller's own credentials (`args`), within 2 s."""
    live = [m for m in doc["members"] if m["state"] in ("alive", "suspect") and m["site"] != doc["self"]]

    def ask(address: str) -> dict[str, Any] | None | str:
        try:
            there = argparse.Namespace(**{**vars(args), "peer": address, "timeout": min(args.timeout, 2.0)})
            other = status_document(_call(there, "Status", admin_pb2.StatusRequest()))
        except grpc.RpcError as err:
            return f"no answer ({err.code().name})"
        return other["training"]["last_round"] if other["training"] else None

    out: dict[str, dict[str, Any] | None | str] = {
        doc["self"]: doc["training"]["last_round"] if doc["training"] else None}
    if live:
        with ThreadPoolExecutor(min(len(live), 16)) as pool:
            for mem, answer in zip(live, pool.map(ask, [m["address"] for m in live])):
                out[mem["site"]] = answer
    return dict(sorted(out.items()))


def _timeline_table(timelines: dict[str, dict[str, Any] | None | str]) -> str:
    rows: list[tuple[str, ...]] = [TIMELINE_HEAD]
    notes = []
    for site, t in timelines.items():
        if isinstance(t, str):
            notes.append(f"{site}: {t}")
            t = None
        rows.append(_timeline_row(site, t))
    return "last round per site (exchange = publish + pull; overhead = 1 - compute/wall):\n" + \
        "\n".join(_columns(rows) + notes)


def _job_document(job: admin_pb2.JobStatus) -> dict[str, Any]:
    return {"job": job.job, "member": job.member, "nodes": job.nodes, "allocated_s": round(job.allocated_s, 1),
            "joining_s": round(job.joining_s, 1), "training_s": round(job.training_s, 1),
            "goodput": round(job.goodput, 3), "ends_in_s": round(job.ends_in_s, 1) if job.HasField("ends_in_s") else None}


def _job_line(job: dict[str, Any]) -> str:
    """`job 4711 (lumi.j3, 2 nodes): up 41m, joining 52s, training 37m (goodput 0.90), ends in 1h19m`."""
    ends = "" if job["ends_in_s"] is None else f", ends in {duration(job['ends_in_s'])}"
    return (f"job {job['job']} ({job['member']}, {job['nodes']} node{'s' if job['nodes'] != 1 else ''}): "
            f"up {duration(job['allocated_s'])}, joining {duration(job['joining_s'])}, "
            f"training {duration(job['training_s'])} (goodput {job['goodput']:.2f}){ends}")


def _table(doc: dict[str, Any]) -> str:
    rows = [("SITE", "ADDRESS", "STATE", "INC", "HEARD", "RTT", "PATH", "ROLE", "ACCELERATOR", "TOK/S")]
    for mem in doc["members"]:
        me = mem["site"] == doc["self"]
        rows.append((
            mem["site"] + (" *" if me else ""),
            mem["address"],
            mem["state"],
            str(mem["incarnation"]),
            "-" if me else f"{mem['last_heard_s']:.1f}s",
            "-" if mem["rtt_ms"] is None else f"{mem['rtt_ms']:.0f}ms",
            mem["path"] or "-",
            mem["meta"]["role"],
            mem["meta"]["accelerator"] or "-",
            f"{mem['meta']['tokens_per_s']:.0f}",
        ))
    lines = _columns(rows)
    cons = doc["consensus"]
    head = (f"view of {doc['self']} (sitemesh {doc['version']}, up {doc['uptime_s']:.0f}s)\n"
            f"epoch {doc['epoch']}  leader {doc['leader'] or '-'}  role {cons['role']}  "
            f"committed round {doc['committed_round']}  voters {','.join(doc['voters']) or '-'}")
    if doc["training"]:
        t = doc["training"]
        head += (f"\ntraining: round {t['applied_round']}  θ {t['weights_hash'][:16]}  "
                 f"samples {t['samples_committed']}/{t['samples_total']}  data epoch {t['data_epoch']}  "
                 f"leases {t['leases_held']}  loss {t['last_loss']}"
                 + ("  EPOCH COMPLETE" if t["epoch_complete"] else "")
                 + (f"  DIVERGED: {t['diverged']}" if t["diverged"] else "")
                 + (f"\nlast decision: {t['last_decision']}" if t["last_decision"] else "")
                 + (f"\n{_job_line(t['job'])}" if t["job"] else ""))
    return head + "\n" + "\n".join(lines)


def _render(args: argparse.Namespace) -> tuple[int, str]:
    """(exit status, text) of one look at the peer: its table or JSON document, or the error."""
    try:
        reply = _call(args, "Status", admin_pb2.StatusRequest())
    except grpc.RpcError as err:
        return _fail(args.peer, err), ""
    doc = status_document(reply)
    if args.json:
        return 0, json.dumps(doc, indent=2, sort_keys=True)
    text = _table(doc)
    if doc["training"] is not None:
        text += "\n" + _timeline_table(site_timelines(doc, args))
    return 0, text


def _status(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print(f"ops: error: --interval must be > 0 seconds, got {args.interval}", file=sys.stderr)
        return 2
    if not args.watch:
        code, text = _render(args)
        if text:
            print(text)
        return code
    return watch(lambda: _render(args), args.interval, sys.stdout.isatty())


def watch(look: Callable[[], tuple[int, str]], interval: float, tty: bool) -> int:
    """Shows `look()` every `interval` seconds until Ctrl-C: in place (rich Live) on a terminal,
    as repeated blocks otherwise. An unreachable peer is shown as such and asked again."""
    def text() -> str:
        code, body = look()
        stamp = time.strftime("%H:%M:%S")
        return f"{stamp}  every {interval:g}s, Ctrl-C to stop\n" + (body or f"(no answer, exit {code})")

    try:
        if tty:
            from rich.live import Live
            from rich.text import Text

            with Live(Text(text()), auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(Text(text()), refresh=True)
        while True:
            print(text() + "\n", flush=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _leave(args: argparse.Namespace) -> int:
    try:
        reply = _call(args, "Leave", admin_pb2.LeaveRequest())
    except grpc.RpcError as err:
        return _fail(args.peer, err)
    print(f"{args.peer} is leaving; {reply.notified} members to notify")
    return 0


def _join(args: argparse.Namespace) -> int:
    try:
        reply = _call(args, "Join", admin_pb2.JoinRequest(seeds=args.seed))
    except grpc.RpcError as err:
        return _fail(args.peer, err)
    print(f"{args.peer} joined; it knows {reply.members} members")
    return 0
