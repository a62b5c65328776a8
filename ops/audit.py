"""`ops audit`: prove exactly-once data accounting from a peer's commit log (invariants I4, I5).

    ops audit --data-dir runs/peer-a [--data-dir runs/peer-b ...] [--run-ended] [--json]

Reads the committed entries of the commit log of the first `--data-dir` (`<dir>/consensus/`, any
peer's: they agree; entries past the peer's durable commit index are not counted), the
dataset's blocks (`<dir>/leases/universe.json`, or `--universe FILE`) and the lease-event ledgers
(`<dir>/leases/ledger.jsonl`) of every `--data-dir` given; prints one line per data epoch. Duplicated
and lost come from the log alone; grants, reclaims and steals are complete only when every peer's
ledger is given (docs/decisions/leases-audit-ledger.md). Every committed sample is also checked
against its owner's word, the VOUCH events of the owners' ledgers: `unvouched` counts samples the
block's owner (its primary in the ring view, from the log) did not vouch to their contributor for
that round although its ledger was given: credit a site took for work it was not leased, a
violation; `unchecked` those whose owner's ledger was not given (give every peer's data dir to
judge them all; docs/decisions/security-work-credit.md). Exit status: 0 clean, 1 a duplicate, a
loss, a foreign or an unvouched sample, 2 unreadable input.

`--json` prints a list of objects with keys
    epoch, samples_total, committed_once, duplicated, lost, grants, reclaimed, reclaimed_pct, stolen,
    ended, rounds, foreign, unvouched, unchecked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from peer.core.audit import EpochAudit, VouchEvidence, audit, audit_to_json, event_from_json, universe_from_json
from peer.core.commitlog import Body, RoundCommit
from peer.core.ids import SiteId
from peer.core.lease_types import LeaseEvent
from peer.logstore import CorruptStore, FileStore

EXIT_VIOLATION = 1
EXIT_INPUT = 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="exactly-once data accounting per epoch, from a commit log")
    p.add_argument("--data-dir", required=True, action="append", type=Path, metavar="DIR",
                   help="a peer's data directory; the first one's commit log is audited, every one's "
                        "lease ledger is counted (repeatable)")
    p.add_argument("--universe", type=Path, metavar="FILE",
                   help="the dataset's blocks (default: <first data dir>/leases/universe.json)")
    p.add_argument("--run-ended", action="store_true",
                   help="the run is over: samples of the last epoch not committed count as lost")
    p.add_argument("--json", action="store_true", help="machine-readable output (stable keys)")
    p.set_defaults(func=_audit)


def _audit(args: argparse.Namespace) -> int:
    first: Path = args.data_dir[0]
    try:
        universe = universe_from_json((args.universe or first / "leases" / "universe.json").read_text())
        entries = read_committed_entries(first)
        commits = [(b.round, [(c.site, c.ranges) for c in b.contributors]) for _, b in entries
                   if isinstance(b, RoundCommit)]
        events = [e for d in args.data_dir for e in read_ledger(d)]
        given = [s for d in args.data_dir for s in read_owners(d)]
    except (OSError, ValueError, KeyError, CorruptStore) as err:
        print(f"ops: error: cannot read the audit input: {err}", file=sys.stderr)
        return EXIT_INPUT
    rows = audit(universe, commits, events, run_ended=args.run_ended,
                 vouches=VouchEvidence.from_log(entries, events, given))
    print(audit_to_json(rows) if args.json else _table(rows))
    return 0 if all(r.ok for r in rows) else EXIT_VIOLATION


def read_round_commits(data_dir: Path) -> list[tuple[int, list]]:
    """(round, [(site, ranges)]) of every committed RoundCommit in the peer's log, in log order."""
    return [(b.round, [(c.site, c.ranges) for c in b.contributors]) for _, b in read_committed_entries(data_dir)
            if isinstance(b, RoundCommit)]


def read_committed_entries(data_dir: Path) -> list[tuple[int, Body]]:
    """(log index, body) of every committed entry in the peer's log, in log order.

    Entries past the peer's durable commit index are left out: an uncommitted suffix on disk (a
    leader's proposal that never reached a majority) may still be overwritten and trains nothing."""
    store_dir = data_dir / "consensus"
    if not store_dir.is_dir():
        raise ValueError(f"{store_dir}: no commit log here")
    store = FileStore(store_dir)
    state = store.reload()
    if state.snapshot.last_round > 0:
        raise ValueError(f"{store_dir}: the log is compacted through round {state.snapshot.last_round}; "
                         "the audit needs every RoundCommit")
    if state.entries and not store.has_commit_index():
        raise ValueError(f"{store_dir}: no commit index (file 'commit'), so committed entries cannot be told "
                         "from uncommitted ones; audit the data dir of a peer that ran this version")
    return [(e.index, e.body) for e in state.entries if e.index <= store.commit_index]


def read_owners(data_dir: Path) -> list[SiteId]:
    """The sites whose lease events `<dir>/leases/ledger.jsonl` holds (`<dir>/leases/owners`, one a
    line; absent in a data dir of an older version: its vouches then judge nothing)."""
    path = data_dir / "leases" / "owners"
    return [SiteId(line.strip()) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def read_ledger(data_dir: Path) -> list[LeaseEvent]:
    path = data_dir / "leases" / "ledger.jsonl"
    if not path.exists():
        return []
    # a torn last line (crash mid-append) is skipped: the ledger only feeds counters, never I4/I5
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(event_from_json(line))
        except ValueError:
            if i != len(lines) - 1:
                raise
    return out


def _table(rows: list[EpochAudit]) -> str:
    head = f"{'epoch':>5} {'samples':>9} {'once':>9} {'dup':>5} {'lost':>7} {'unvouched':>9} {'unchecked':>9} " \
           f"{'grants':>7} {'reclaimed':>14} {'stolen':>6}  status"
    lines = [head]
    for r in rows:
        status = ("ok" if r.ok else "VIOLATION") + ("" if r.ended else " (in progress)")
        if r.foreign:
            status += f", {r.foreign} foreign samples"
        if r.unvouched:
            status += f", {r.unvouched} samples credited that their owner never vouched to the contributor"
        lines.append(f"{r.epoch:>5} {r.samples_total:>9} {r.committed_once:>9} {r.duplicated:>5} {r.lost:>7} "
                     f"{r.unvouched:>9} {r.unchecked:>9} {r.grants:>7} {r.reclaimed:>6} ({r.reclaimed_pct:5.2f}%) "
                     f"{r.stolen:>6}  {status}")
    if any(r.unchecked for r in rows):
        lines.append("unchecked: committed samples whose owner's lease ledger was not given (pass every peer's "
                     "--data-dir to check them)")
    if not rows:
        lines.append("(no round has committed samples yet)")
    return "\n".join(lines)
