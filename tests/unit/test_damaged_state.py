"""Damaged consensus state is refused with the file and the repair named; a torn uncommitted tail
is still cut. (The log's own torn-write and corruption cases are in test_logstore.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.core.commitlog import Entry, LogIndex, Round, RoundCommit
from peer.core.consensus import DurableState, PersistHardState
from peer.core.election import Epoch, HardState, SiteId
from peer.logstore import CorruptStore, FileStore

FOUNDERS = {SiteId("a"): "a:1"}


def _store_with_rounds(path: Path, last: int) -> FileStore:
    store = FileStore(path)
    state = store.load_or_init(DurableState.fresh(FOUNDERS))
    first = len(state.entries) + 1
    store.write_log(first, tuple(Entry(LogIndex(i), Epoch(1), RoundCommit(Round(i), (), b"w")) for i in
                                 range(first, last + 1)))
    store.persist(PersistHardState(HardState(Epoch(1), SiteId("a"))))
    return store


def _cut_before_record(store: FileStore, index: int) -> None:
    """Truncate the log at the start of entry `index`: a clean record boundary, no torn bytes."""
    offset = store._offsets[index - 1 - store.log.snapshot.last_index]
    with open(store.dir / "log", "r+b") as f:
        f.truncate(offset)


def test_a_log_cut_below_the_applied_index_is_refused_not_cut(tmp_path: Path) -> None:
    store = _store_with_rounds(tmp_path, 10)
    _cut_before_record(store, 8)
    size = (tmp_path / "log").stat().st_size
    with pytest.raises(CorruptStore, match=r"log ends at index 7 but index 9 was applied.*peer repair"):
        FileStore(tmp_path).load_or_init(DurableState.fresh(FOUNDERS), keep_through=9)
    assert (tmp_path / "log").stat().st_size == size, "a refused start must change nothing"
    # Up to what was applied, the same log is fine.
    assert FileStore(tmp_path).load_or_init(DurableState.fresh(FOUNDERS), keep_through=7).entries[-1].index == 7


def test_a_torn_tail_above_the_applied_index_is_still_cut(tmp_path: Path) -> None:
    store = _store_with_rounds(tmp_path, 10)
    with open(tmp_path / "log", "ab") as f:
        f.write(b"SMLR\x00\x00\x01\x00garbage")  # a half-written append
    again = FileStore(tmp_path)
    assert again.load_or_init(DurableState.fresh(FOUNDERS), keep_through=10).entries[-1].index == 10
    assert again.recovered.startswith("cut torn tail")
    del store


def test_a_torn_tail_holding_an_applied_entry_is_refused(tmp_path: Path) -> None:
    store = _store_with_rounds(tmp_path, 10)
    data = (tmp_path / "log").read_bytes()
    (tmp_path / "log").write_bytes(data[:-3])  # entry 10's record torn, yet 10 was applied
    with pytest.raises(CorruptStore, match="index 10 was applied"):
        FileStore(tmp_path).load_or_init(DurableState.fresh(FOUNDERS), keep_through=10)
    assert (tmp_path / "log").read_bytes() == data[:-3]
    del store


def test_a_missing_log_beside_a_hardstate_is_refused(tmp_path: Path) -> None:
    _store_with_rounds(tmp_path, 5)
    (tmp_path / "log").unlink()
    with pytest.raises(CorruptStore, match=r"/log is missing beside .*/hardstate at epoch 1"):
        FileStore(tmp_path).load_or_init(DurableState.fresh(FOUNDERS))


def test_a_missing_hardstate_beside_a_log_is_refused(tmp_path: Path) -> None:
    _store_with_rounds(tmp_path, 5)
    (tmp_path / "hardstate").unlink()
    with pytest.raises(CorruptStore, match=r"/hardstate is missing beside .*/log.*lead an old epoch"):
        FileStore(tmp_path).load_or_init(DurableState.fresh(FOUNDERS))


def test_a_missing_store_beside_applied_state_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CorruptStore, match="ends at index 0 but index 4 was applied"):
        FileStore(tmp_path / "consensus").load_or_init(DurableState.fresh(FOUNDERS), keep_through=4)
