"""`ops status`, `ops leave`, `ops join`: talk to one running peer.

    ops status --peer 127.0.0.1:7001 [--json]
    ops leave --peer 127.0.0.1:7002
    ops join --peer 127.0.0.1:7004 --seed 127.0.0.1:7001

`ops status --json` prints a stable document (documented in docs/ops.md):
    {"self": SITE, "uptime_s": float, "version": str,
     "members": [{"site", "address", "state", "incarnation", "last_heard_s", "meta"}, ...],
     "leader": SITE or null, "epoch": int, "committed_round": int, "voters": [SITE, ...],
     "consensus": {"role", "lease_remaining_s", "commit_index", "applied_index"},
     "training": null or {"applied_round", "weights_hash", "samples_committed", "samples_total",
                          "last_loss", "epoch_complete", "diverged", "data_epoch", "leases_held"}}
with state one of alive, suspect, dead, left and meta
    {"role", "accelerator", "tokens_per_s", "labels": {...}}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import grpc

from ops.certs import CertError, add_client_flags, client_credentials
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc, membership_pb2
from peer.transport.channels import open_blocking_channel

EXIT_UNREACHABLE = 3


def register(sub: argparse._SubParsersAction) -> None:
    status = sub.add_parser("status", help="one peer's view of the mesh")
    status.add_argument("--peer", required=True, metavar="HOST:PORT", help="address of any running peer")
    status.add_argument("--json", action="store_true", help="machine-readable output (stable keys)")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the peer")
    add_client_flags(status)
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
        },
        "consensus": {
            "role": reply.consensus.role,
            "lease_remaining_s": round(reply.consensus.lease_remaining_s, 3),
            "commit_index": reply.consensus.commit_index,
            "applied_index": reply.consensus.applied_index,
        },
    }


def _table(doc: dict[str, Any]) -> str:
    rows = [("SITE", "ADDRESS", "STATE", "INC", "HEARD", "ROLE", "ACCELERATOR", "TOK/S")]
    for mem in doc["members"]:
        me = mem["site"] == doc["self"]
        rows.append((
            mem["site"] + (" *" if me else ""),
            mem["address"],
            mem["state"],
            str(mem["incarnation"]),
            "-" if me else f"{mem['last_heard_s']:.1f}s",
            mem["meta"]["role"],
            mem["meta"]["accelerator"] or "-",
            f"{mem['meta']['tokens_per_s']:.0f}",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
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
                 + (f"  DIVERGED: {t['diverged']}" if t["diverged"] else ""))
    return head + "\n" + "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    try:
        reply = _call(args, "Status", admin_pb2.StatusRequest())
    except grpc.RpcError as err:
        return _fail(args.peer, err)
    doc = status_document(reply)
    print(json.dumps(doc, indent=2, sort_keys=True) if args.json else _table(doc))
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
