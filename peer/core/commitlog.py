"""The replicated round-commit log: entries, the in-memory log with its snapshot, and its rules.

One entry per outer round (`RoundCommit`: contributors and the hash of the resulting weights), plus
single-server voter changes (`VoterChange`, Raft thesis section 4.1) and the no-op `EpochStart` a new
leader appends (Raft section 8). What is pure about replication lives here: the log-matching append
(Raft section 5.3), the epoch-based conflict hint, the commit rule over the configured voter set
(section 5.4.2), snapshots and compaction (section 7), and the voter set a log implies. The state
machine that sends and receives lives in `peer/core/consensus.py`.

    .venv/bin/python -m pytest tests/unit/test_commitlog.py -q
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

from peer.core.samples import SampleRange
from peer.core.election import Epoch, HardState, Header, SiteId
from peer.core.ids import LogIndex, Round  # noqa: F401 - re-exported: the id types live in peer/core/ids.py


@dataclass(frozen=True)
class Contributor:
    site: SiteId
    tokens: int
    ranges: tuple[SampleRange, ...]
    pseudo_gradient_root: bytes


@dataclass(frozen=True)
class RoundCommit:
    round: Round
    contributors: tuple[Contributor, ...]
    """Sorted by site, each site once: every peer averages them in this order."""
    weights_hash: bytes

    def __post_init__(self) -> None:
        sites = [c.site for c in self.contributors]
        if sites != sorted(set(sites)):
            raise ValueError(f"round {self.round}: contributors must be sorted and unique, got {sites}")
        if self.round < 1:
            raise ValueError("rounds start at 1")


@dataclass(frozen=True)
class VoterChange:
    site: SiteId
    address: str
    add: bool
    reason: str
    trainerless: bool = False
    """An added voter without a trainer (a long-lived coordinator): it votes but owns no lease
    shard, so the ring views the lease cores work from leave it out (`lease_owners`)."""


@dataclass(frozen=True)
class EpochStart:
    leader: SiteId


Body = Union[RoundCommit, VoterChange, EpochStart]


@dataclass(frozen=True)
class Entry:
    index: LogIndex
    epoch: Epoch
    body: Body


Voters = tuple[tuple[SiteId, str], ...]
"""A voter set: (site, address) pairs sorted by site."""


@dataclass(frozen=True)
class Snapshot:
    """The log up to `last_index` folded into a state (Raft section 7)."""

    last_index: LogIndex
    last_epoch: Epoch
    last_round: Round
    weights_hash: bytes
    voters: Voters
    app_state: bytes = b""
    """Opaque state of the rounds layer at last_index (e.g. the trained-sample ledger)."""


EMPTY_SNAPSHOT = Snapshot(LogIndex(0), Epoch(0), Round(0), b"", ())


def bootstrap_entries(voters: Mapping[SiteId, str], trainerless: frozenset[SiteId] = frozenset()) -> list[Entry]:
    """The identical first entries every founding peer writes: one VoterChange(add) per voter at epoch
    0, sorted by site. Identical on all founders, so they satisfy log matching without a leader;
    a peer that joins later receives them by replication like any other entry. `trainerless`: the
    founders without a trainer."""
    return [
        Entry(LogIndex(i), Epoch(0), VoterChange(site, voters[site], True, "bootstrap", site in trainerless))
        for i, site in enumerate(sorted(voters), start=1)
    ]


def apply_trainerless(trainerless: frozenset[SiteId], change: VoterChange) -> frozenset[SiteId]:
    """The voters without a trainer after `change` (kept beside `Voters` as the log replays)."""
    if change.add and change.trainerless:
        return trainerless | {change.site}
    return trainerless - {change.site}


def lease_owners(voters: Voters, trainerless: frozenset[SiteId]) -> list[SiteId]:
    """The sites a ring view of the data's blocks is made of: the voters that train. A voter without
    a trainer runs no lease cores, and a shard it owned would never be served."""
    return [s for s, _ in voters if s not in trainerless]


def apply_voter_change(voters: Voters, change: VoterChange) -> Voters:
    current = dict(voters)
    if change.add:
        current[change.site] = change.address
    else:
        current.pop(change.site, None)
    return tuple(sorted(current.items()))


# --- replication messages (proto AppendEntries, AppendReply, InstallSnapshot) ---


@dataclass(frozen=True)
class AppendEntries:
    header: Header
    prev_index: LogIndex
    prev_epoch: Epoch
    entries: tuple[Entry, ...]
    commit_index: LogIndex
    seq: int


@dataclass(frozen=True)
class AppendReply:
    header: Header
    success: bool
    match_index: LogIndex
    seq: int
    reason: str


@dataclass(frozen=True)
class InstallSnapshot:
    header: Header
    snapshot: Snapshot
    seq: int


@dataclass
class AppendResult:
    ok: bool
    reason: str
    match_index: LogIndex
    """On success the last index verified to match the leader; on failure where to retry."""
    first_changed: LogIndex | None = None
    """First index whose content changed (truncated or appended), for PersistLog; None = none."""
    overwrites_committed: bool = False
    """Refused because the entries contradict a committed one: no honest leader sends that (I3)."""


@dataclass
class Log:
    """A snapshot followed by consecutive entries. Mutated only by the consensus core."""

    snapshot: Snapshot = EMPTY_SNAPSHOT
    entries: list[Entry] = field(default_factory=list)
    _config_cache: tuple[object, LogIndex, Voters, frozenset[SiteId]] | None = field(default=None, repr=False,
                                                                                     compare=False)

    def __post_init__(self) -> None:
        expected = self.snapshot.last_index + 1
        for e in self.entries:
            if e.index != expected:
                raise ValueError(f"log entries not consecutive after snapshot: {e.index} != {expected}")
            expected += 1

    @property
    def last_index(self) -> LogIndex:
        return self.entries[-1].index if self.entries else self.snapshot.last_index

    @property
    def last_epoch(self) -> Epoch:
        return self.entries[-1].epoch if self.entries else self.snapshot.last_epoch

    def epoch_at(self, index: int) -> Epoch | None:
        """Epoch of the entry at index; None when compacted away or beyond the end."""
        if index == self.snapshot.last_index:
            return self.snapshot.last_epoch
        e = self.entry(index)
        return e.epoch if e else None

    def entry(self, index: int) -> Entry | None:
        pos = index - self.snapshot.last_index - 1
        return self.entries[pos] if 0 <= pos < len(self.entries) else None

    def slice(self, first: int, max_n: int) -> tuple[Entry, ...]:
        pos = max(0, first - self.snapshot.last_index - 1)
        return tuple(self.entries[pos : pos + max_n])

    def _config(self) -> tuple[LogIndex, Voters]:
        """(index, voter set) of the latest configuration, cached: every message asks for it. The
        key is sound because two logs that end at the same (index, epoch) are identical (Raft's log
        matching), so a truncated and re-appended suffix that ends the same holds the same config."""
        key = (self.snapshot.last_index, self.snapshot.voters, self.last_index, self.last_epoch)
        if self._config_cache is None or self._config_cache[0] != key:
            index, voters, trainerless = self.snapshot.last_index, self.snapshot.voters, frozenset[SiteId]()
            for e in self.entries:
                if isinstance(e.body, VoterChange):
                    index, voters = e.index, apply_voter_change(voters, e.body)
                    trainerless = apply_trainerless(trainerless, e.body)
            self._config_cache = (key, index, voters, trainerless)
        return self._config_cache[1], self._config_cache[2]

    def trainerless(self) -> frozenset[SiteId]:
        """The voters in force that have no trainer (VoterChange.trainerless; a snapshot's voters are
        taken to train)."""
        self._config()
        assert self._config_cache is not None
        return self._config_cache[3]

    def voters_at(self, index: int) -> Voters:
        """Voter set after applying the log up to `index` (snapshot voters, then VoterChanges)."""
        config_index, latest = self._config()
        if index >= config_index:
            return latest
        voters = self.snapshot.voters
        for e in self.entries:
            if e.index > index:
                break
            if isinstance(e.body, VoterChange):
                voters = apply_voter_change(voters, e.body)
        return voters

    def voters(self) -> Voters:
        """The configuration in force: the latest in the log, committed or not (thesis 4.1)."""
        return self._config()[1]

    def ever_voter(self, site: SiteId) -> bool:
        """`site` is a voter of the snapshot or of any configuration in the log after it."""
        return site in dict(self.snapshot.voters) or any(
            isinstance(e.body, VoterChange) and e.body.site == site for e in self.entries)

    def last_config_index(self) -> LogIndex:
        return self._config()[0]

    def last_round_entry(self, upto: int | None = None) -> tuple[Round, LogIndex, bytes]:
        """(round, index, weights hash) of the last RoundCommit at or below `upto`."""
        for e in reversed(self.entries):
            if upto is not None and e.index > upto:
                continue
            if isinstance(e.body, RoundCommit):
                return e.body.round, e.index, e.body.weights_hash
        return self.snapshot.last_round, self.snapshot.last_index, self.snapshot.weights_hash

    def append_local(self, epoch: Epoch, body: Body) -> Entry:
        entry = Entry(LogIndex(self.last_index + 1), epoch, body)
        self.entries.append(entry)
        return entry

    def append_from_leader(
        self, prev_index: int, prev_epoch: int, entries: Sequence[Entry], commit_index: int
    ) -> AppendResult:
        """Raft 5.3: accept `entries` if this log holds (prev_index, prev_epoch); drop a conflicting
        suffix, never at or below commit_index: entries that contradict a committed one are refused
        whole (nothing changed: the equal prefix before the first conflict is left as it was)."""
        if prev_index > self.last_index:
            return AppendResult(False, f"missing entries: prev index {prev_index} > last {self.last_index}",
                                LogIndex(self.last_index + 1))
        if prev_index < self.snapshot.last_index:
            # Compacted: those entries are committed and equal to the leader's; skip them.
            skip = self.snapshot.last_index - prev_index
            entries, prev_index, prev_epoch = entries[skip:], self.snapshot.last_index, self.snapshot.last_epoch
            if not entries:
                return AppendResult(True, "ok (already compacted)", self.snapshot.last_index)
        own = self.epoch_at(prev_index)
        if own != prev_epoch:
            # Hint: first index of our conflicting epoch, so the leader skips the whole epoch.
            hint = prev_index
            while hint - 1 > self.snapshot.last_index and self.epoch_at(hint - 1) == own:
                hint -= 1
            return AppendResult(False, f"log mismatch at {prev_index}: epoch {own} != {prev_epoch}",
                                LogIndex(max(hint, commit_index + 1)))
        first_changed: LogIndex | None = None
        for e in entries:
            mine = self.entry(e.index)
            if mine is not None and mine.epoch == e.epoch:
                continue
            if mine is not None:
                if e.index <= commit_index:
                    return AppendResult(False, f"entry {e.index} of epoch {e.epoch} contradicts the committed one "
                                        f"of epoch {mine.epoch}", LogIndex(commit_index + 1), overwrites_committed=True)
                del self.entries[e.index - self.snapshot.last_index - 1 :]
            self.entries.append(e)
            if first_changed is None:
                first_changed = e.index
        return AppendResult(True, "ok", LogIndex(prev_index + len(entries)), first_changed)

    def install(self, snap: Snapshot) -> bool:
        """Raft section 7: keep the suffix when it continues the snapshot, else drop the whole log.
        Returns True when the log after the snapshot was kept."""
        keep = self.epoch_at(snap.last_index) == snap.last_epoch and snap.last_index <= self.last_index
        if keep:
            self.entries = [e for e in self.entries if e.index > snap.last_index]
        else:
            self.entries = []
        self.snapshot = snap
        return keep

    def compact(self, upto: int, app_state: bytes) -> Snapshot | None:
        """Fold the log up to `upto` into a snapshot (installed here), or None when nothing past the
        current snapshot is there to fold."""
        epoch = self.epoch_at(upto)
        if upto <= self.snapshot.last_index or epoch is None:
            return None
        rnd, _, weights = self.last_round_entry(upto)
        snap = Snapshot(LogIndex(upto), epoch, rnd, weights, self.voters_at(upto), app_state)
        self.install(snap)
        return snap


# --- durability: what the core asks the node to fsync, and what it reads back at start ---


@dataclass(frozen=True)
class PersistHardState:
    state: HardState


@dataclass(frozen=True)
class PersistLog:
    """Drop every stored entry with index >= first_index, then append `entries`."""

    first_index: LogIndex
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class PersistSnapshot:
    """Store the snapshot; keep the stored entries after it only if the entry at its last index has
    its epoch (commitlog.Log.install's rule), else drop them all."""

    snapshot: Snapshot


@dataclass
class DurableState:
    """Everything the core reads from disk at start (logstore.Store.load returns it)."""

    hard: HardState
    snapshot: Snapshot
    entries: list[Entry]

    @classmethod
    def fresh(cls, founders: Mapping[SiteId, str] | None = None,
              trainerless: frozenset[SiteId] = frozenset()) -> DurableState:
        """A new peer. Founding peers of a run all pass the same `founders` (site -> address) and so
        write identical bootstrap entries; a peer joining later passes None and receives the log.
        `trainerless`: the founders without a trainer."""
        return cls(HardState(Epoch(0), None), EMPTY_SNAPSHOT, bootstrap_entries(founders or {}, trainerless))


def quorum_index(match: Mapping[SiteId, int], voters: Iterable[SiteId]) -> LogIndex:
    """Highest index held by a majority of `voters` (missing voters count as 0)."""
    held = sorted((match.get(v, 0) for v in set(voters)), reverse=True)
    if not held:
        return LogIndex(0)
    return LogIndex(held[len(held) // 2])


# --- canonical encoding for the on-disk store (stdlib JSON; the wire uses protobuf) ---


def _body_to_obj(body: Body) -> dict[str, object]:
    if isinstance(body, RoundCommit):
        return {
            "round": body.round,
            "weights_hash": body.weights_hash.hex(),
            "contributors": [
                {
                    "site": c.site,
                    "tokens": c.tokens,
                    "root": c.pseudo_gradient_root.hex(),
                    "ranges": [[r.block_id, r.start, r.end] for r in c.ranges],
                }
                for c in body.contributors
            ],
        }
    if isinstance(body, VoterChange):
        obj = {"voter": body.site, "address": body.address, "add": body.add, "reason": body.reason}
        return {**obj, "trainerless": True} if body.trainerless else obj  # absent in logs written before it
    return {"epoch_start": body.leader}


def _body_from_obj(obj: dict[str, object]) -> Body:
    if "round" in obj:
        contributors = tuple(
            Contributor(
                SiteId(c["site"]),
                int(c["tokens"]),
                tuple(SampleRange(*r) for r in c["ranges"]),
                bytes.fromhex(c["root"]),
            )
            for c in obj["contributors"]  # type: ignore[attr-defined]
        )
        return RoundCommit(Round(int(obj["round"])), contributors,  # type: ignore[call-overload]
                           bytes.fromhex(str(obj["weights_hash"])))
    if "voter" in obj:
        return VoterChange(SiteId(str(obj["voter"])), str(obj["address"]), bool(obj["add"]), str(obj["reason"]),
                           bool(obj.get("trainerless", False)))
    return EpochStart(SiteId(str(obj["epoch_start"])))


def encode_entry(entry: Entry) -> bytes:
    obj = {"index": entry.index, "epoch": entry.epoch, "body": _body_to_obj(entry.body)}
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def decode_entry(data: bytes) -> Entry:
    obj = json.loads(data)
    return Entry(LogIndex(int(obj["index"])), Epoch(int(obj["epoch"])), _body_from_obj(obj["body"]))


def encode_snapshot(snap: Snapshot) -> bytes:
    obj = {
        "last_index": snap.last_index,
        "last_epoch": snap.last_epoch,
        "last_round": snap.last_round,
        "weights_hash": snap.weights_hash.hex(),
        "voters": [list(v) for v in snap.voters],
        "app_state": snap.app_state.hex(),
    }
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def decode_snapshot(data: bytes) -> Snapshot:
    obj = json.loads(data)
    return Snapshot(
        LogIndex(int(obj["last_index"])),
        Epoch(int(obj["last_epoch"])),
        Round(int(obj["last_round"])),
        bytes.fromhex(obj["weights_hash"]),
        tuple((SiteId(s), str(a)) for s, a in obj["voters"]),
        bytes.fromhex(obj["app_state"]),
    )
