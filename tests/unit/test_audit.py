"""Exactly-once audit: epochs inferred from the log, duplicates, losses, lease-event counts."""

from __future__ import annotations

from peer.core.audit import EpochLedger, audit, event_from_json, event_to_json
from peer.core.commitlog import SampleRange
from peer.core.election import SiteId
from peer.core.lease_types import BlockId, DataEpoch, EventKind, Gen, LeaseEvent, spans

UNIVERSE = {1: 4, 2: 6}


def entry(rnd: int, *contribs: tuple[str, list[tuple[int, int, int]]]) -> tuple[int, list]:
    return rnd, [(SiteId(s), [SampleRange(b, x, y) for b, x, y in rs]) for s, rs in contribs]


def ev(kind: EventKind, epoch: int, block: int, gen: int) -> LeaseEvent:
    return LeaseEvent(kind, DataEpoch(epoch), BlockId(block), Gen(gen), SiteId("a"), 1.5)


def test_epochs_follow_the_log_and_count_each_sample_once() -> None:
    log = [entry(1, ("a", [(1, 0, 4)]), ("b", [(2, 0, 3)])), entry(2),
           entry(3, ("a", [(2, 3, 6)])),                    # epoch 0 complete
           entry(4, ("b", [(2, 0, 6), (1, 0, 2)]))]         # epoch 1 under way
    e0, e1 = audit(UNIVERSE, log)
    assert (e0.epoch, e0.ended, e0.committed_once, e0.duplicated, e0.lost, e0.rounds) == (0, True, 10, 0, 0, 2)
    assert (e1.epoch, e1.ended, e1.committed_once, e1.lost) == (1, False, 8, 0)
    assert e0.ok and e1.ok


def test_a_sample_in_two_commits_is_a_duplicate() -> None:
    log = [entry(1, ("a", [(1, 0, 3)])), entry(2, ("b", [(1, 2, 4), (2, 0, 1)])), entry(3, ("c", [(1, 2, 3)]))]
    (e0,) = audit(UNIVERSE, log)
    assert e0.duplicated == 1, "sample 2 of block 1 repeated twice still counts once"
    assert e0.committed_once == 4 + 1 - 1
    assert not e0.ok


def test_a_duplicate_inside_one_entry_is_found() -> None:
    (e0,) = audit(UNIVERSE, [entry(1, ("a", [(1, 0, 2)]), ("b", [(1, 1, 3)]))])
    assert (e0.duplicated, e0.committed_once) == (1, 2)


def test_when_the_run_ended_the_uncommitted_rest_is_lost() -> None:
    log = [entry(1, ("a", [(1, 0, 4), (2, 0, 2)]))]
    (running,) = audit(UNIVERSE, log)
    (ended,) = audit(UNIVERSE, log, run_ended=True)
    assert (running.lost, running.ok) == (0, True)
    assert (ended.lost, ended.ok) == (4, False)


def test_foreign_samples_are_a_violation() -> None:
    (e0,) = audit(UNIVERSE, [entry(1, ("a", [(77, 0, 1), (1, 0, 1)]))])
    assert e0.foreign == 1 and not e0.ok


def test_lease_events_are_counted_per_epoch_and_deduplicated() -> None:
    events = [ev(EventKind.GRANT, 0, 1, 10), ev(EventKind.GRANT, 0, 2, 10), ev(EventKind.STEAL, 0, 2, 11),
              ev(EventKind.RECLAIM, 0, 1, 11), ev(EventKind.GRANT, 0, 1, 12), ev(EventKind.RELEASE, 0, 1, 13),
              ev(EventKind.GRANT, 0, 1, 10),  # the same event from a second peer's ledger
              ev(EventKind.GRANT, 1, 1, 10)]
    log = [entry(1, ("a", [(1, 0, 4), (2, 0, 6)])), entry(2, ("a", [(1, 0, 1)]))]
    e0, e1 = audit(UNIVERSE, log, events)
    assert (e0.grants, e0.reclaimed, e0.stolen, e0.reclaimed_pct) == (4, 1, 1, 25.0)
    assert (e1.grants, e1.reclaimed, e1.reclaimed_pct) == (1, 0, 0.0)


def test_ledger_replay_is_the_rebuild_source() -> None:
    log = [entry(1, ("a", [(1, 0, 4), (2, 0, 6)])), entry(2, ("b", [(2, 1, 3)]))]
    ledger = EpochLedger.from_log(UNIVERSE, log)
    assert (ledger.data_epoch, ledger.last_round, ledger.done(BlockId(2)), ledger.done(BlockId(1))) == (1, 2, spans((1, 3)), ())


def test_event_json_round_trip() -> None:
    e = ev(EventKind.STEAL, 3, 812, (5 << 32) + 2)
    assert event_from_json(event_to_json(e)) == e


def test_ops_audit_reads_a_data_dir_and_fails_on_a_duplicate(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from ops.cli import main
    from peer.sim.leases_sim import write_data_dir

    clean, dup = tmp_path / "clean", tmp_path / "dup"
    log = [entry(1, ("a", [(1, 0, 4)]), ("b", [(2, 0, 6)])), entry(2, ("a", [(1, 0, 1)]))]
    write_data_dir(clean, UNIVERSE, log, [ev(EventKind.GRANT, 0, 1, 10), ev(EventKind.RECLAIM, 0, 1, 11)])
    assert main(["audit", "--data-dir", str(clean), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    keys = {"epoch", "samples_total", "committed_once", "duplicated", "lost", "grants", "reclaimed",
            "reclaimed_pct", "stolen"}
    assert keys <= set(rows[0]) and (rows[0]["committed_once"], rows[0]["reclaimed_pct"]) == (10, 100.0)
    assert rows[1]["ended"] is False and rows[1]["committed_once"] == 1
    assert main(["audit", "--data-dir", str(clean), "--run-ended"]) == 1, "epoch 1 lost 9 samples"
    assert "VIOLATION" in capsys.readouterr().out

    write_data_dir(dup, UNIVERSE, [entry(1, ("a", [(1, 0, 4)])), entry(2, ("b", [(1, 3, 4)]))], [])
    assert main(["audit", "--data-dir", str(dup)]) == 1
    assert main(["audit", "--data-dir", str(tmp_path / "nothing")]) == 2


def test_ops_audit_counts_only_committed_entries(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """An uncommitted suffix on disk (a proposal that never reached a majority) is not counted: here
    it would both add samples and duplicate one."""
    import json

    from ops.cli import main
    from peer.logstore import FileStore
    from peer.sim.leases_sim import write_data_dir

    log = [entry(1, ("a", [(1, 0, 4)])), entry(2, ("b", [(2, 0, 2)])), entry(3, ("a", [(1, 3, 4), (2, 2, 6)]))]
    write_data_dir(tmp_path, UNIVERSE, log, [])
    store = FileStore(tmp_path / "consensus")
    store.reload()
    assert store.commit_index == 3
    (tmp_path / "consensus" / "commit").unlink()
    store = FileStore(tmp_path / "consensus")
    store.reload()
    store.save_commit_index(2)  # entry 3 is on disk but not committed
    assert main(["audit", "--data-dir", str(tmp_path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["committed_once"], row["duplicated"], row["rounds"]) == (6, 0, 2)

    (tmp_path / "consensus" / "commit").unlink()
    assert main(["audit", "--data-dir", str(tmp_path)]) == 2, "no commit index: committed is unknown"
    assert "no commit index" in capsys.readouterr().err


def test_the_commit_index_is_durable_and_never_goes_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from peer.logstore import FileStore
    from peer.sim.leases_sim import write_data_dir

    store = FileStore(tmp_path / "consensus")
    store.reload()
    assert (store.commit_index, store.has_commit_index()) == (0, False)
    # A run's log of 5 committed rounds (write_data_dir fsyncs the commit index at 5).
    write_data_dir(tmp_path, UNIVERSE, [entry(i, ("a", [(1, i - 1, i)])) for i in range(1, 6)], [])
    reopened = FileStore(tmp_path / "consensus")
    reopened.reload()
    reopened.save_commit_index(3)  # a stale report (a follower told an older index) changes nothing
    again = FileStore(tmp_path / "consensus")
    again.reload()
    assert (again.commit_index, again.has_commit_index()) == (5, True)


def test_a_log_shorter_than_the_commit_index_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from peer.logstore import CorruptStore, FileStore
    from peer.sim.leases_sim import write_data_dir

    write_data_dir(tmp_path, UNIVERSE, [entry(i, ("a", [(1, i - 1, i)])) for i in range(1, 6)], [])
    log = tmp_path / "consensus" / "log"
    whole = log.read_bytes()
    log.write_bytes(whole[: len(whole) // 2])  # cut mid-log: committed rounds are gone
    with pytest.raises(CorruptStore, match="was applied: committed entries were lost"):
        FileStore(tmp_path / "consensus").reload()
