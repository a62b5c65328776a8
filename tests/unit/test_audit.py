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


# ----- every committed sample against its owner's word (docs/decisions/security-work-credit.md) -----
import pytest  # noqa: E402

from peer.core.audit import VouchEvidence  # noqa: E402
from peer.core.commitlog import Body, Contributor, Round, RoundCommit, VoterChange  # noqa: E402
from peer.core.ring import RingView  # noqa: E402

# Voters a, b, c join at log indexes 1-3 (ring views 1, 2, 3); round 1 commits at index 4. In view 3
# block 1's primary is c and block 2's is a; in view 2 ({a, b}) block 1's is b.
VOTERS: list[tuple[int, Body]] = [(i, VoterChange(SiteId(s), f"{s}:1", True, "join")) for i, s in enumerate("abc", 1)]


def vouch(block: int, s: int, e: int, holder: str, owner: str, rnd: int = 1, view: int = 3) -> LeaseEvent:
    return LeaseEvent(EventKind.VOUCH, DataEpoch(0), BlockId(block), Gen(7), SiteId(holder), 2.0, rnd,
                      spans((s, e)), view, SiteId(owner))


def judged(contribs: list[tuple[str, list[tuple[int, int, int]]]], events: list[LeaseEvent],
           given: str = "abc", voters: list[tuple[int, Body]] = VOTERS) -> tuple[int, int, bool]:
    body = RoundCommit(Round(1), tuple(Contributor(SiteId(s), 0, tuple(SampleRange(*r) for r in rs), b"")
                                       for s, rs in sorted(contribs)), b"")
    entries = [*voters, (len(voters) + 1, body)]
    evidence = VouchEvidence.from_log(entries, events, [SiteId(s) for s in given])
    (row,) = audit(UNIVERSE, [entry(1, *contribs)], events, vouches=evidence)
    return row.unvouched, row.unchecked, row.ok


HONEST_EVENTS = [vouch(1, 0, 4, "b", "c"), vouch(2, 0, 3, "a", "a")]
VOUCH_CASES = [
    ("every sample vouched by its block's primary", [("b", [(1, 0, 4)]), ("a", [(2, 0, 3)])], HONEST_EVENTS,
     "abc", (0, 0, True)),
    ("vouched under the view before", [("b", [(1, 0, 4)])], [vouch(1, 0, 4, "b", "b", view=2)], "abc", (0, 0, True)),
    ("a block the contributor never leased beside one it did", [("a", [(2, 0, 3), (1, 0, 4)])],
     [vouch(2, 0, 3, "a", "a")], "abc", (4, 0, False)),
    ("vouched by the contributor itself, not the owner", [("b", [(1, 0, 4)])], [vouch(1, 0, 4, "b", "b")], "abc",
     (4, 0, False)),
    ("vouched to another holder", [("b", [(1, 0, 4)])], [vouch(1, 0, 4, "a", "c")], "abc", (4, 0, False)),
    ("vouched for another round", [("b", [(1, 0, 4)])], [vouch(1, 0, 4, "b", "c", rnd=2)], "abc", (4, 0, False)),
    ("fewer samples vouched than committed", [("b", [(1, 0, 4)])], [vouch(1, 0, 2, "b", "c")], "abc", (2, 0, False)),
    ("the owner's ledger not given: unchecked", [("b", [(1, 0, 4)])], [], "ab", (0, 4, True)),
    ("a log without voter changes: unchecked", [("b", [(1, 0, 4)])], [], "abc", (0, 4, True)),
]


@pytest.mark.parametrize("name,contribs,events,given,want", VOUCH_CASES, ids=[c[0] for c in VOUCH_CASES])
def test_every_committed_sample_is_checked_against_its_owners_vouch(name, contribs, events, given, want) -> None:  # type: ignore[no-untyped-def]
    voters = [] if "without voter" in name else VOTERS
    assert judged(contribs, events, given, voters) == want


def test_vouch_events_round_trip_through_the_ledger() -> None:
    e = vouch(812, 3, 9, "b", "c", rnd=12, view=(5 << 32))
    assert event_from_json(event_to_json(e)) == e


def test_ops_audit_flags_a_forged_committed_sample(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The probe's forger, seen by the audit: c committed a block it never leased; with every ledger
    given the audit says so and exits 1; the honest run beside it stays ok."""
    import json

    from ops.cli import main
    from peer.core.audit import universe_to_json
    from peer.core.commitlog import Entry, LogIndex
    from peer.core.election import Epoch, HardState
    from peer.logstore import FileStore

    def data_dir(d, contributors, ledger: dict[str, list[LeaseEvent]]) -> list[str]:  # type: ignore[no-untyped-def]
        body = RoundCommit(Round(1), tuple(Contributor(SiteId(s), 4, tuple(SampleRange(*r) for r in rs), b"")
                                           for s, rs in contributors), b"")
        entries = tuple(Entry(LogIndex(i), Epoch(1), b) for i, b in [*VOTERS, (4, body)])
        store = FileStore(d / "consensus")
        store.save_hard_state(HardState(Epoch(1), None))
        store.write_log(1, entries)
        store.save_commit_index(len(entries))
        dirs = []
        for site, events in ledger.items():
            sd = d / site / "leases"
            sd.mkdir(parents=True)
            (sd / "ledger.jsonl").write_text("".join(event_to_json(e) + "\n" for e in events))
            (sd / "owners").write_text(site + "\n")
            dirs += ["--data-dir", str(d / site)]
        (d / "leases").mkdir()
        (d / "leases" / "universe.json").write_text(universe_to_json(UNIVERSE))
        return ["audit", "--data-dir", str(d), *dirs]

    ledgers = {"a": [vouch(2, 0, 3, "a", "a")], "b": [], "c": [vouch(1, 0, 4, "b", "c")]}
    honest = data_dir(tmp_path / "honest", [("a", [(2, 0, 3)]), ("b", [(1, 0, 4)])], ledgers)
    assert main([*honest, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["unvouched"], row["unchecked"], row["committed_once"]) == (0, 0, 7)

    forged = data_dir(tmp_path / "forged", [("a", [(2, 0, 3)]), ("b", [(1, 0, 4)]), ("c", [(2, 3, 6)])],
                      {**ledgers, "c": [*ledgers["c"], vouch(2, 3, 6, "c", "c")]})  # c vouches itself: not its block
    assert main(forged) == 1
    out = capsys.readouterr().out
    assert "VIOLATION" in out and "3 samples credited that their owner never vouched" in out and " ok" not in out


def test_a_vouch_under_an_old_ring_view_does_not_count() -> None:
    """In view 1 a was the only member, the primary of every block: a vouch a writes in its own
    ledger under it for a later round is not its word as an owner (the leader's accepted views)."""
    more: list[tuple[int, Body]] = [(4, RoundCommit(Round(1), (), b"")), (5, RoundCommit(Round(2), (), b""))]
    more += [(i, VoterChange(SiteId(s), f"{s}:1", True, "join")) for i, s in ((6, "d"), (7, "e"), (8, "f"))]
    body = RoundCommit(Round(3), (Contributor(SiteId("a"), 0, (SampleRange(1, 0, 4),), b""),), b"")
    entries = [*VOTERS, *more, (9, body)]
    for view, unvouched in ((1, 4), (2, 0)):
        owner = RingView.of(view, "ab"[:view]).primary(1)
        events = [vouch(1, 0, 4, "a", str(owner), rnd=3, view=view)]
        evidence = VouchEvidence.from_log(entries, events, [SiteId(s) for s in "abcdef"])
        (row,) = audit(UNIVERSE, [entry(1), entry(2), entry(3, ("a", [(1, 0, 4)]))], events, vouches=evidence)
        assert (row.unvouched, row.ok) == (unvouched, unvouched == 0), view


def test_the_audit_leaves_a_voter_without_a_trainer_out_of_the_ring_as_the_lease_cores_do() -> None:
    """The lease cores' ring views are of the voters that train (peer/core/lease_log.py); the
    audit's must be the same, or it would judge an honest voucher by another primary."""
    entries: list[tuple[int, Body]] = [*VOTERS, (4, VoterChange(SiteId("w"), "w:1", True, "join", trainerless=True))]
    evidence = VouchEvidence.from_log(entries, [], [SiteId(s) for s in "abc"])
    assert evidence.views[3].members == evidence.views[4].members == ("a", "b", "c")
