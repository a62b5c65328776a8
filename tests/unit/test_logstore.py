"""The on-disk consensus store: round trips, a torn write at every byte, corruption, snapshot crash
windows, and a hypothesis state machine of writes, torn writes and restarts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from peer.core.commitlog import Entry, EpochStart, LogIndex, Round, RoundCommit, Snapshot, VoterChange, bootstrap_entries
from peer.core.consensus import DurableState, PersistHardState, PersistLog
from peer.core.election import Epoch, HardState, SiteId
from peer.logstore import CorruptStore, FileStore, MemoryStore

FOUNDERS = {SiteId("a"): "a:1", SiteId("b"): "b:1"}


def _entry(index: int, epoch: int) -> Entry:
    body = RoundCommit(Round(index), (), f"w{index}".encode()) if index % 3 else EpochStart(SiteId("a"))
    return Entry(LogIndex(index), Epoch(epoch), body)


def _open(path: Path) -> tuple[FileStore, DurableState]:
    store = FileStore(path)
    return store, store.load_or_init(DurableState.fresh(FOUNDERS))


def test_fresh_store_writes_the_bootstrap_state_and_reads_it_back(tmp_path: Path) -> None:
    _, state = _open(tmp_path)
    assert state.entries == bootstrap_entries(FOUNDERS)
    store, again = _open(tmp_path)
    assert again == state and store.recovered == ""


def test_persist_effects_round_trip(tmp_path: Path) -> None:
    store, _ = _open(tmp_path)
    assert store.persist(PersistHardState(HardState(Epoch(4), SiteId("b"))))
    assert store.persist(PersistLog(LogIndex(3), tuple(_entry(i, 1) for i in range(3, 8))))
    assert store.persist(PersistLog(LogIndex(6), (_entry(6, 2),)))  # overwrite an uncommitted suffix
    _, state = _open(tmp_path)
    assert state.hard == HardState(Epoch(4), SiteId("b"))
    assert [(e.index, e.epoch) for e in state.entries] == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 1), (6, 2)]


def test_torn_append_at_every_byte_keeps_every_acknowledged_entry(tmp_path: Path) -> None:
    base = tmp_path / "base"
    store, _ = _open(base)
    store.write_log(3, tuple(_entry(i, 1) for i in range(3, 6)))
    acked = (base / "log").stat().st_size
    store.write_log(6, tuple(_entry(i, 1) for i in range(6, 9)))
    full = (base / "log").read_bytes()
    boundaries = set(store._offsets) | {len(full)}
    for cut in range(acked, len(full)):
        for garbage in (False, True):
            d = tmp_path / f"cut{cut}{garbage}"
            shutil.copytree(base, d)
            torn = full[:cut] + (b"\x00" * 7 if garbage else b"")
            (d / "log").write_bytes(torn)
            store2, state = _open(d)
            indices = [e.index for e in state.entries]
            assert indices[:5] == [1, 2, 3, 4, 5], f"lost an acknowledged entry at cut {cut}"
            assert indices == list(range(1, len(indices) + 1)) and len(indices) <= 8
            assert (store2.recovered == "") == (not garbage and cut in boundaries)
            # Recovery is durable: a second start finds a clean file and appends after it.
            store2.write_log(len(indices) + 1, (_entry(len(indices) + 1, 2),))
            assert _open(d)[1].entries[-1].epoch == 2


def test_corruption_before_the_tail_refuses_to_start(tmp_path: Path) -> None:
    store, _ = _open(tmp_path)
    store.write_log(3, tuple(_entry(i, 1) for i in range(3, 9)))
    data = bytearray((tmp_path / "log").read_bytes())
    data[40] ^= 0xFF  # inside the first record: acknowledged data, not a torn write
    (tmp_path / "log").write_bytes(bytes(data))
    with pytest.raises(CorruptStore):
        _open(tmp_path)


def test_crash_between_snapshot_and_log_rewrite_is_reconciled(tmp_path: Path) -> None:
    store, _ = _open(tmp_path)
    store.write_log(3, tuple(_entry(i, 1) for i in range(3, 9)))
    old_log = (tmp_path / "log").read_bytes()
    snap = Snapshot(LogIndex(5), Epoch(1), Round(5), b"w5", tuple(sorted(FOUNDERS.items())), b"ledger")
    store.save_snapshot(snap)
    (tmp_path / "log").write_bytes(old_log)  # as if the crash hit before the log was rewritten
    _, state = _open(tmp_path)
    assert state.snapshot == snap and [e.index for e in state.entries] == [6, 7, 8]
    # A snapshot that contradicts the stored suffix (a leader's, after a conflict) drops it.
    other = Snapshot(LogIndex(7), Epoch(3), Round(7), b"x", (), b"")
    store2, _ = _open(tmp_path)
    store2.save_snapshot(other)
    _, state = _open(tmp_path)
    assert state.snapshot == other and state.entries == []


def test_stray_temp_file_from_a_torn_atomic_write_is_ignored(tmp_path: Path) -> None:
    store, _ = _open(tmp_path)
    store.save_hard_state(HardState(Epoch(2), SiteId("a")))
    (tmp_path / "hardstate.tmp").write_bytes(b"SMLR\x00\x00")  # crash mid-way through the next write
    assert _open(tmp_path)[1].hard == HardState(Epoch(2), SiteId("a"))


class StoreMachine(RuleBasedStateMachine):
    """Random writes, torn writes and restarts against a MemoryStore model of what was acknowledged."""

    @initialize()
    def setup(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="logstore-"))
        self.store, _ = _open(self.dir)
        self.model = MemoryStore()
        self.model.save_hard_state(HardState(Epoch(0), None))
        self.model.write_log(1, tuple(bootstrap_entries(FOUNDERS)))
        self.epoch = 1

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def _both(self, op: str, *args: object) -> None:
        getattr(self.store, op)(*args)
        getattr(self.model, op)(*args)

    @rule(n=st.integers(1, 5))
    def append(self, n: int) -> None:
        first = self.model.log.last_index + 1
        self._both("write_log", first, tuple(_entry(first + k, self.epoch) for k in range(n)))

    @precondition(lambda self: len(self.model.log.entries) > 0)
    @rule(back=st.integers(0, 6), n=st.integers(0, 3))
    def overwrite_suffix(self, back: int, n: int) -> None:
        self.epoch += 1
        first = max(self.model.log.snapshot.last_index + 1, self.model.log.last_index - back)
        self._both("write_log", first, tuple(_entry(first + k, self.epoch) for k in range(n)))

    @rule(voted=st.sampled_from([None, "a", "b"]))
    def vote(self, voted: str | None) -> None:
        self.epoch += 1
        self._both("save_hard_state", HardState(Epoch(self.epoch), SiteId(voted) if voted else None))

    @precondition(lambda self: len(self.model.log.entries) > 1)
    @rule(k=st.integers(0, 100))
    def snapshot(self, k: int) -> None:
        log = self.model.log
        upto = log.snapshot.last_index + 1 + k % len(log.entries)
        epoch = log.epoch_at(upto)
        assert epoch is not None
        self._both("save_snapshot", Snapshot(LogIndex(upto), epoch, Round(upto), b"w", log.voters_at(upto), b"s"))

    @rule(n=st.integers(1, 4), frac=st.floats(0, 1, exclude_max=True), garbage=st.booleans())
    def torn_append_then_restart(self, n: int, frac: float, garbage: bool) -> None:
        path = self.dir / "log"
        before = path.stat().st_size
        first = self.model.log.last_index + 1
        batch = tuple(_entry(first + k, self.epoch) for k in range(n))
        self.store.write_log(first, batch)
        after = path.stat().st_size
        data = path.read_bytes()
        cut = before + int((after - before) * frac)
        path.write_bytes(data[:cut] + (b"\xab" * 5 if garbage else b""))
        self.store, state = _open(self.dir)
        kept = state.entries[len(self.model.log.entries):]
        assert state.entries[: len(self.model.log.entries)] == self.model.log.entries, "acknowledged entry lost"
        assert kept == list(batch[: len(kept)]) and len(kept) < n
        self.model.write_log(first, tuple(kept))

    @rule()
    def restart(self) -> None:
        self.store, _ = _open(self.dir)

    @invariant()
    def disk_matches_acknowledged_state(self) -> None:
        if not hasattr(self, "store"):
            return
        assert FileStore(self.dir).reload() == self.model.load()


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)


def test_voter_change_entries_survive_the_store(tmp_path: Path) -> None:
    store, _ = _open(tmp_path)
    change = Entry(LogIndex(3), Epoch(1), VoterChange(SiteId("c"), "c:1", True, "join"))
    store.write_log(3, (change,))
    assert _open(tmp_path)[1].entries[-1] == change
