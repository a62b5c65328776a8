"""What the consensus core asks its caller to do, and what it answers: its effects and decisions.

`ConsensusCore` (peer/core/consensus.py) returns a list of effects from every input; the node runs
them in list order (a `Persist*` before any later effect: the `Send` after it may promise what it
persisted). `Answer` is the reply to a local request, `Status` is what `ops status` shows. The persist
effects are the commit log's (peer/core/commitlog.py), the messages the election's and the log's.

    .venv/bin/python -m pytest tests/unit/test_election_core.py -q
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from peer.core.commitlog import (
    Entry,
    LogIndex,
    PersistHardState,
    PersistLog,
    PersistSnapshot,
    Snapshot,
    Voters,
)
from peer.core.consensus_checks import Message, RefusalKind
from peer.core.election import Epoch, Role, SiteId


@dataclass(frozen=True)
class Send:
    to: SiteId
    address: str
    msg: Message


@dataclass(frozen=True)
class Committed:
    """Apply this entry: it is majority-replicated and durable. Emitted once per index, in order."""

    entry: Entry


@dataclass(frozen=True)
class SnapshotInstalled:
    """The log up to snapshot.last_index was replaced by the leader's snapshot: restore the
    application state from it (fetch θ by weights_hash) before applying later entries."""

    snapshot: Snapshot


@dataclass(frozen=True)
class LeaderChanged:
    leader: SiteId | None
    epoch: Epoch


TWO_LEADERS = "two leaders in epoch"
"""The start of a Rejected reason for a leader's message at the epoch this peer leads itself."""


@dataclass(frozen=True)
class Rejected:
    """A message or request this core refused; for logs and `ops status`. Changes nothing."""

    from_site: SiteId
    what: str
    reason: str
    kind: RefusalKind = RefusalKind.ROUTINE


Effect = Union[Send, PersistHardState, PersistLog, PersistSnapshot, Committed, SnapshotInstalled, LeaderChanged,
               Rejected]


@dataclass(frozen=True)
class Answer:
    """Answer to a local request (propose, leave, voter change): accepted or not, why, effects."""

    accepted: bool
    reason: str
    effects: list[Effect]
    index: LogIndex | None = None


@dataclass(frozen=True)
class Status:
    """What `ops status` shows (and the simulator compares)."""

    site: SiteId
    role: Role
    epoch: Epoch
    voted_for: SiteId | None
    leader: SiteId | None
    lease_expiry: float | None
    """Leader only: local monotonic time until which it may decide; None otherwise."""
    committed_round: int
    commit_index: LogIndex
    applied_index: LogIndex
    last_index: LogIndex
    voters: Voters
