"""Every committed round as a peer's commit log records it: leader, voters, samples, θ's hash.

The log (peer/core/commitlog.py, on disk in `<data-dir>/consensus/`, peer/logstore.py) is the
run's record of each round, so a round that committed between two looks at a peer's status still
has all its facts here: the leader that committed it (the leader of the entry's epoch, from that
epoch's `EpochStart`), the voter set in force at it, the samples committed through it (every
earlier commit's contributors' ranges) and the hash of θ after it. `ops demo` prints them per round.

    .venv/bin/python -c "from pathlib import Path; from ops.round_log import read; print(read(Path('runs/demo/X/snellius')))"
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from peer.core.commitlog import EpochStart, RoundCommit
from peer.core.ids import SiteId
from peer.logstore import FileStore

STORE_DIR = "consensus"
STORE_FILES = ("commit", "hardstate", "snapshot", "log")
"""The store's files, in the order they are copied: the commit index before the log, which only
grows past it (a cut removes an uncommitted suffix only), so the copied log reaches the index."""


@dataclass(frozen=True)
class CommittedRound:
    round: int
    leader: SiteId
    """The leader that committed the round (one per epoch, I1)."""
    voters: tuple[SiteId, ...]
    """The voter set in force when the round was committed, sorted."""
    samples_committed: int
    """Samples committed by this round and every earlier one (all data epochs so far)."""
    weights_hash: str
    """Hex hash of θ after the round, as the log commits it (every peer checks its θ against it, I7)."""


def read(data_dir: Path) -> dict[int, CommittedRound]:
    """round -> what the log of the peer at `data_dir` says about it, for every round committed there.

    The peer may be running: its store is read from a copy, since loading a store repairs it in
    place (a torn tail is cut) and a tail being appended looks torn. Raises ValueError for a log
    compacted into a snapshot (its earlier rounds' samples are gone; the node never compacts) and
    CorruptStore when the copy caught files from two different moments (the caller looks again)."""
    source = data_dir / STORE_DIR
    if not source.is_dir():
        raise ValueError(f"{source}: no commit log here")
    with tempfile.TemporaryDirectory(prefix="sitemesh-log-") as tmp:
        copy = Path(tmp) / STORE_DIR
        copy.mkdir()
        for name in STORE_FILES:
            if (source / name).exists():
                shutil.copyfile(source / name, copy / name)
        store = FileStore(copy)
        state = store.reload()
    if state.snapshot.last_round > 0:
        raise ValueError(f"{source}: the log is compacted through round {state.snapshot.last_round}")
    leaders: dict[int, SiteId] = {}
    out: dict[int, CommittedRound] = {}
    samples = 0
    for entry in state.entries:
        if entry.index > store.commit_index:  # an uncommitted suffix may still be replaced
            break
        body = entry.body
        if isinstance(body, EpochStart):
            leaders[entry.epoch] = body.leader
        elif isinstance(body, RoundCommit):
            samples += sum(r.num_samples for c in body.contributors for r in c.ranges)
            voters = tuple(sorted(site for site, _ in store.log.voters_at(entry.index)))
            out[body.round] = CommittedRound(body.round, leaders[entry.epoch], voters, samples,
                                             body.weights_hash.hex())
    return out
