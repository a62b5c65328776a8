"""The log's own rules: log-matching append, conflict hints, commit quorum, voter sets, snapshots,
encoding."""

from __future__ import annotations

import pytest

from peer.core.commitlog import (
    Contributor,
    Entry,
    EpochStart,
    Log,
    LogIndex,
    Round,
    RoundCommit,
    SampleRange,
    Snapshot,
    VoterChange,
    bootstrap_entries,
    decode_entry,
    decode_snapshot,
    encode_entry,
    encode_snapshot,
    quorum_index,
)
from peer.core.election import Epoch, SiteId


def _e(index: int, epoch: int, rnd: int | None = None) -> Entry:
    body = RoundCommit(Round(rnd), (), b"w") if rnd else EpochStart(SiteId("a"))
    return Entry(LogIndex(index), Epoch(epoch), body)


def _log(*epochs: int) -> Log:
    return Log(entries=[_e(i, ep) for i, ep in enumerate(epochs, start=1)])


# (log epochs, prev index, prev epoch, new entries' epochs, commit index, ok, match, resulting epochs)
APPEND_CASES = [
    ((1, 1), 2, 1, (2,), 0, True, 3, (1, 1, 2)),
    ((1, 1), 0, 0, (1, 1), 0, True, 2, (1, 1)),  # duplicate: nothing changes
    ((1, 1, 2), 1, 1, (1,), 0, True, 2, (1, 1, 2)),  # stale shorter append never truncates
    ((1, 1, 2, 2), 2, 1, (3,), 2, True, 3, (1, 1, 3)),  # conflict: suffix replaced
    ((1, 1), 4, 1, (1,), 0, False, 3, (1, 1)),  # gap: retry from our end
    ((1, 2, 2, 2), 4, 3, (3,), 1, False, 2, (1, 2, 2, 2)),  # mismatch: hint skips epoch 2
]


@pytest.mark.parametrize("have,prev,prev_epoch,new,commit,ok,match,after", APPEND_CASES)
def test_append_from_leader(have: tuple[int, ...], prev: int, prev_epoch: int, new: tuple[int, ...],
                            commit: int, ok: bool, match: int, after: tuple[int, ...]) -> None:
    log = _log(*have)
    entries = [_e(prev + k, ep) for k, ep in enumerate(new, start=1)]
    res = log.append_from_leader(prev, prev_epoch, entries, commit)
    assert (res.ok, res.match_index) == (ok, match), res.reason
    assert tuple(e.epoch for e in log.entries) == after


def test_entries_that_contradict_a_committed_one_are_refused_whole() -> None:
    """No honest leader sends them (I3); a hostile or buggy site's message must change nothing
    (it used to raise, which is an unhandled exception on remote input)."""
    log = _log(1, 1, 2)
    res = log.append_from_leader(1, 1, [_e(2, 3), _e(3, 3)], commit_index=2)
    assert not res.ok and res.overwrites_committed and res.first_changed is None
    assert res.reason == "entry 2 of epoch 3 contradicts the committed one of epoch 1"
    assert tuple(e.epoch for e in log.entries) == (1, 1, 2)


@pytest.mark.parametrize("match,voters,expected", [
    ({"a": 5, "b": 3, "c": 1}, "abc", 3),
    ({"a": 5, "b": 3}, "abcd", 0),  # 4 voters need 3 holders; c and d hold nothing
    ({"a": 5, "b": 5, "x": 9, "y": 9}, "abc", 5),  # non-voters never count
    ({"a": 7}, "a", 7),
])
def test_quorum_index(match: dict[str, int], voters: str, expected: int) -> None:
    assert quorum_index({SiteId(k): v for k, v in match.items()}, [SiteId(v) for v in voters]) == expected


def test_voter_set_follows_the_latest_change_even_uncommitted() -> None:
    log = Log(entries=bootstrap_entries({SiteId("a"): "a:1", SiteId("b"): "b:1"}))
    log.append_local(Epoch(1), VoterChange(SiteId("c"), "c:1", True, "join"))
    log.append_local(Epoch(1), VoterChange(SiteId("a"), "a:1", False, "graceful leave"))
    assert [s for s, _ in log.voters()] == ["b", "c"]
    assert [s for s, _ in log.voters_at(3)] == ["a", "b", "c"]
    assert log.last_config_index() == 4


def test_install_snapshot_keeps_a_matching_suffix_and_drops_a_conflicting_log() -> None:
    snap = Snapshot(LogIndex(2), Epoch(1), Round(1), b"w1", ((SiteId("a"), "a:1"),))
    log = _log(1, 1, 2)
    assert log.install(snap) is True
    assert [e.index for e in log.entries] == [3] and log.last_index == 3
    other = _log(1, 3, 3)
    assert other.install(snap) is False
    assert other.entries == [] and other.last_index == 2 and other.epoch_at(2) == 1


def test_last_round_entry_reads_through_to_the_snapshot() -> None:
    snap = Snapshot(LogIndex(4), Epoch(2), Round(3), b"w3", ())
    log = Log(snap, [_e(5, 2), _e(6, 2, rnd=4)])
    assert log.last_round_entry() == (4, 6, b"w")
    assert log.last_round_entry(upto=5) == (3, 4, b"w3")


def test_round_commit_rejects_unsorted_contributors() -> None:
    c = [Contributor(SiteId(s), 1, (SampleRange(1, 0, 2),), b"r") for s in "ba"]
    with pytest.raises(ValueError):
        RoundCommit(Round(1), tuple(c), b"w")
    with pytest.raises(ValueError):
        SampleRange(1, 5, 5)


def test_encoding_round_trips() -> None:
    c = Contributor(SiteId("a"), 123, (SampleRange(7, 0, 64), SampleRange(8, 3, 9)), b"\x01\x02")
    for entry in [Entry(LogIndex(9), Epoch(4), RoundCommit(Round(3), (c,), b"\xff" * 32)),
                  Entry(LogIndex(1), Epoch(0), VoterChange(SiteId("b"), "h:1", True, "bootstrap")),
                  Entry(LogIndex(3), Epoch(5), VoterChange(SiteId("w"), "h:2", True, "join", trainerless=True)),
                  Entry(LogIndex(2), Epoch(5), EpochStart(SiteId("b")))]:
        assert decode_entry(encode_entry(entry)) == entry
    snap = Snapshot(LogIndex(9), Epoch(4), Round(3), b"\x00\x01", ((SiteId("a"), "a:1"),), b"ledger")
    assert decode_snapshot(encode_snapshot(snap)) == snap
