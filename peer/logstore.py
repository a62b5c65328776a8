"""Durable consensus state: the epoch/vote, the snapshot and the log, with torn-write recovery.

Format (docs/decisions/consensus-storage.md), in one directory per peer:

* `hardstate`, `snapshot`: whole-file records written atomically (write temp, fsync, rename, fsync dir).
* `commit`: the highest log index this peer knows committed, a whole-file record written the same
  way whenever it advances. A lower bound of the cluster's commit index (a follower learns it one
  message later): `ops audit` counts only entries up to it, never an uncommitted suffix on disk.
* `log`: append-only records `MAGIC | u32 length | u32 crc32(length, payload) | payload`, one per entry
  (canonical JSON from `peer/core/commitlog.py`). A batch is appended and fsynced once; a truncation
  (a leader overwrote an uncommitted suffix) cuts the file at the record's offset and fsyncs.

At start-up a bad record that reaches the end of the file is a torn write of an append that was never
acknowledged (acks follow the fsync), so it is cut off; a bad record followed by more data is
corruption of acknowledged data and raises `CorruptStore` instead of silently losing entries. So do
a log that ends before an index the caller knows was applied (`keep_through`: a cut there would
drop committed entries), a log missing beside a hardstate that has voted, and a hardstate missing
beside a log (the peer would forget its epoch and lead an old one again). Every `CorruptStore`
names the file and the repair (REPAIR).

`MemoryStore` has the same semantics in memory; the simulator uses it as the "disk" that survives a
crash. Both execute the Persist* effects of `peer/core/consensus.py` via `persist(effect)`.

    .venv/bin/python -m pytest tests/unit/test_logstore.py -q
"""

from __future__ import annotations

import copy
import json
import os
import struct
import zlib
from pathlib import Path

from peer.core.commitlog import (
    EMPTY_SNAPSHOT,
    DurableState,
    Entry,
    Log,
    LogIndex,
    PersistHardState,
    PersistLog,
    PersistSnapshot,
    Round,
    Snapshot,
    decode_entry,
    decode_snapshot,
    encode_entry,
    encode_snapshot,
)
from peer.durable import fsync_dir, write_atomic
from peer.core.election import Epoch, HardState, SiteId

MAGIC = b"SMLR"
_HEADER = struct.Struct(">4sII")  # magic, payload length, crc32 of (length, payload)


class CorruptStore(RuntimeError):
    """Acknowledged data is damaged (not a torn tail): refuse to start rather than lose entries."""


REPAIR = ("repair: `peer repair --data-dir DIR` sets the damaged state aside, then `peer serve ... --join "
          "MEMBER` rebuilds it from the run's leader (log and θ by state transfer)")


class Store:
    """In-memory semantics shared by both stores; subclasses add durability."""

    def __init__(self) -> None:
        self.hard = HardState(Epoch(0), None)
        self.log = Log()
        self.commit_index = 0
        """Highest index known committed (persisted by `save_commit_index`; never decreases)."""

    def load(self) -> DurableState:
        return DurableState(self.hard, self.log.snapshot, list(self.log.entries))

    def persist(self, effect: object) -> bool:
        """Make a Persist* effect durable; returns False for effects that are not about storage."""
        if isinstance(effect, PersistHardState):
            self.save_hard_state(effect.state)
        elif isinstance(effect, PersistLog):
            self.write_log(effect.first_index, effect.entries)
        elif isinstance(effect, PersistSnapshot):
            self.save_snapshot(effect.snapshot)
        else:
            return False
        return True

    def save_hard_state(self, hard: HardState) -> None:
        self.hard = hard

    def write_log(self, first_index: int, entries: tuple[Entry, ...]) -> None:
        if first_index > self.log.last_index + 1:
            raise ValueError(f"log gap: writing at {first_index} after {self.log.last_index}")
        keep = max(0, first_index - self.log.snapshot.last_index - 1)
        self.log.entries = self.log.entries[:keep] + [e for e in entries if e.index > self.log.snapshot.last_index]

    def save_snapshot(self, snap: Snapshot) -> None:
        self.log.install(snap)

    def save_commit_index(self, index: int) -> None:
        """Record that entries up to `index` are committed (a smaller value is ignored)."""
        self.commit_index = max(self.commit_index, index)


class MemoryStore(Store):
    """The simulator's disk: survives a crash of the core that writes it."""

    def load(self) -> DurableState:
        return copy.deepcopy(super().load())


def _record(payload: bytes) -> bytes:
    length = struct.pack(">I", len(payload))
    return _HEADER.pack(MAGIC, len(payload), zlib.crc32(length + payload)) + payload


def _write_atomic(path: Path, payload: bytes) -> None:
    """A whole-file record: `payload` framed like a log record, so a torn file is detected on read."""
    write_atomic(path, _record(payload))


def _read_whole(path: Path) -> bytes | None:
    """Payload of a file written by _write_atomic; None if absent. Rename is atomic, so a bad
    record here is corruption, not a torn write."""
    if not path.exists():
        return None
    data = path.read_bytes()
    records, end = _parse(data)
    if len(records) != 1 or end != len(data):
        raise CorruptStore(f"{path}: not one valid record")
    return records[0][1]


def _parse(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """Valid records (offset, payload) from the start of `data`, and where they end."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        magic, length, crc = _HEADER.unpack_from(data, pos)
        payload = data[pos + _HEADER.size : pos + _HEADER.size + length]
        if magic != MAGIC or len(payload) != length or zlib.crc32(struct.pack(">I", length) + payload) != crc:
            break
        out.append((pos, payload))
        pos += _HEADER.size + length
    return out, pos


class FileStore(Store):
    """The on-disk store of one peer (`<state dir>/consensus/`)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._log_path = self.dir / "log"
        self._offsets: list[int] = []  # file offset of each entry in self.log.entries
        self.recovered: str = ""
        """What start-up had to repair (for the node's log), empty if nothing."""

    def exists(self) -> bool:
        return (self.dir / "hardstate").exists() or self._log_path.exists()

    def load_or_init(self, fresh: DurableState, keep_through: int = 0) -> DurableState:
        """The stored state, or `fresh` written to disk first if this directory is new.

        `keep_through`: an index known applied (fsynced elsewhere); a log that no longer reaches it
        lost committed entries and is refused, never cut."""
        if not self.exists() and keep_through == 0:
            self.save_hard_state(fresh.hard)
            if fresh.snapshot != EMPTY_SNAPSHOT:
                self.save_snapshot(fresh.snapshot)
            self.write_log(fresh.snapshot.last_index + 1, tuple(fresh.entries))
            return self.load()
        return self.reload(keep_through)

    def reload(self, keep_through: int = 0) -> DurableState:
        commit_raw = _read_whole(self.dir / "commit")
        self.commit_index = int(json.loads(commit_raw)["index"]) if commit_raw is not None else 0
        # The fsynced commit index is a floor too: a log that no longer reaches it lost committed entries.
        keep_through = max(keep_through, self.commit_index)
        hard_path = self.dir / "hardstate"
        hard_raw = _read_whole(hard_path)
        if hard_raw is not None:
            obj = json.loads(hard_raw)
            self.hard = HardState(Epoch(obj["epoch"]), SiteId(obj["voted_for"]) if obj["voted_for"] else None)
        snap_raw = _read_whole(self.dir / "snapshot")
        snap = decode_snapshot(snap_raw) if snap_raw is not None else EMPTY_SNAPSHOT
        # The hardstate is written before the log is created: a log without one lost the epoch.
        if hard_raw is None and (self._log_path.exists() or snap_raw is not None):
            raise CorruptStore(f"{hard_path} is missing beside {self._log_path}: this peer's epoch and vote are lost "
                               f"and it could lead an old epoch again; {REPAIR}")
        if not self._log_path.exists() and (self.hard.epoch > 0 or snap_raw is not None):
            raise CorruptStore(f"{self._log_path} is missing beside {hard_path} at epoch {self.hard.epoch}: "
                               f"the voters and committed rounds are lost; {REPAIR}")
        data = self._log_path.read_bytes() if self._log_path.exists() else b""
        records, end = _parse(data)
        entries = [decode_entry(p) for _, p in records]
        for a, b in zip(entries, entries[1:]):
            if b.index != a.index + 1:
                raise CorruptStore(f"{self._log_path}: index {b.index} follows {a.index}; {REPAIR}")
        last = entries[-1].index if entries else snap.last_index
        if max(last, snap.last_index) < keep_through:
            raise CorruptStore(f"{self._log_path} ends at index {max(last, snap.last_index)} but index {keep_through} "
                               f"was applied: committed entries were lost (truncated or replaced file); {REPAIR}")
        if end < len(data):
            if self._more_records_after(data, end):
                raise CorruptStore(f"{self._log_path}: bad record at byte {end} followed by valid records; {REPAIR}")
            self.recovered = f"cut torn tail of {len(data) - end} bytes at offset {end}"
            with open(self._log_path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        self.log = self._reconcile(snap, entries)
        if self.log.entries != entries:
            self._rewrite_log()
        else:
            self._offsets = [off for off, _ in records]
        return self.load()

    def _reconcile(self, snap: Snapshot, entries: list[Entry]) -> Log:
        """The log the files describe. A crash between writing a snapshot and rewriting the log leaves
        entries the snapshot covers (or contradicts): apply Log.install's rule to them."""
        if not entries or entries[0].index == snap.last_index + 1:
            return Log(snap, entries)
        if entries[0].index > snap.last_index + 1:
            raise CorruptStore(f"{self._log_path}: log starts at {entries[0].index}, snapshot ends at {snap.last_index}")
        first = entries[0].index
        log = Log(Snapshot(LogIndex(first - 1), Epoch(0), Round(0), b"", ()), entries)
        log.install(snap)
        return log

    @staticmethod
    def _more_records_after(data: bytes, bad: int) -> bool:
        # Scan for another intact record after the bad one: only a corrupted middle leaves one.
        pos = data.find(MAGIC, bad + 1)
        while pos != -1:
            if _parse(data[pos:])[0]:
                return True
            pos = data.find(MAGIC, pos + 1)
        return False

    def save_hard_state(self, hard: HardState) -> None:
        _write_atomic(self.dir / "hardstate", json.dumps({"epoch": hard.epoch, "voted_for": hard.voted_for}).encode())
        super().save_hard_state(hard)

    def write_log(self, first_index: int, entries: tuple[Entry, ...]) -> None:
        keep = min(len(self.log.entries), max(0, first_index - self.log.snapshot.last_index - 1))
        super().write_log(first_index, entries)
        cut = self._offsets[keep] if keep < len(self._offsets) else self._end()
        self._offsets = self._offsets[:keep]
        created = not self._log_path.exists()
        with open(self._log_path, "w+b" if created else "r+b") as f:
            f.truncate(cut)
            f.seek(cut)
            for e in self.log.entries[keep:]:
                self._offsets.append(f.tell())
                f.write(_record(encode_entry(e)))
            f.flush()
            os.fsync(f.fileno())
        if created:
            fsync_dir(self.dir)  # the new file's name, not only its bytes, must survive power loss

    def has_commit_index(self) -> bool:
        """False for a log written before the commit index was kept: committed is unknown there."""
        return (self.dir / "commit").exists()

    def save_commit_index(self, index: int) -> None:
        if index > self.commit_index:
            _write_atomic(self.dir / "commit", json.dumps({"index": index}).encode())
        super().save_commit_index(index)

    def save_snapshot(self, snap: Snapshot) -> None:
        _write_atomic(self.dir / "snapshot", encode_snapshot(snap))
        super().save_snapshot(snap)
        self._rewrite_log()

    def _end(self) -> int:
        return self._log_path.stat().st_size if self._log_path.exists() else 0

    def _rewrite_log(self) -> None:
        records = [_record(encode_entry(e)) for e in self.log.entries]
        offsets, pos = [], 0
        for r in records:
            offsets.append(pos)
            pos += len(r)
        write_atomic(self._log_path, b"".join(records))
        self._offsets = offsets
