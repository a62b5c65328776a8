"""`ops.round_log` and the demo's round lines: every committed round's leader, voters, samples and θ
come from the commit log, also for a round that is not the newest (issue 37, item 3)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ops import round_log
from ops.demo import round_line, schedule_steps
from peer.core.commitlog import Body, Contributor, Entry, EpochStart, RoundCommit, VoterChange
from peer.core.election import HardState
from peer.core.ids import Epoch, LogIndex, Round, SiteId
from peer.core.samples import SampleRange
from peer.core.timeline import RoundTimeline
from peer.logstore import FileStore


def _commit(rnd: int, block: int, *sites: str) -> RoundCommit:
    """Round `rnd`: each site trained 10 samples of `block`."""
    return RoundCommit(Round(rnd), tuple(
        Contributor(SiteId(s), 1280, (SampleRange(block, 10 * i, 10 * i + 10),), b"\x01")
        for i, s in enumerate(sorted(sites))), bytes([rnd]) * 32)


def _run_log(data_dir: Path) -> None:
    """A run as a peer's store holds it: a founds it and leads epoch 1, b and c join, a commits
    rounds 1-2; b leads epoch 2 and commits round 3; c leaves gracefully; b commits round 4; round
    5 is proposed but not committed."""
    bodies: list[tuple[int, Body]] = [
        (0, VoterChange(SiteId("a"), "a:1", True, "bootstrap")),
        (1, EpochStart(SiteId("a"))),
        (1, VoterChange(SiteId("b"), "b:1", True, "join")),
        (1, VoterChange(SiteId("c"), "c:1", True, "join")),
        (1, _commit(1, 1, "a", "b", "c")),
        (1, _commit(2, 2, "a", "b", "c")),
        (2, EpochStart(SiteId("b"))),
        (2, _commit(3, 3, "a", "b")),  # c's report came too late: only a and b
        (2, VoterChange(SiteId("c"), "c:1", False, "graceful leave")),
        (2, _commit(4, 4, "a", "b")),
        (2, _commit(5, 5, "a", "b")),
    ]
    store = FileStore(data_dir / "consensus")
    store.save_hard_state(HardState(Epoch(2), SiteId("b")))
    store.write_log(1, tuple(Entry(LogIndex(i), Epoch(e), b) for i, (e, b) in enumerate(bodies, start=1)))
    store.save_commit_index(len(bodies) - 1)


def test_every_committed_round_has_its_leader_voters_samples_and_theta(tmp_path: Path) -> None:
    _run_log(tmp_path)
    rounds = round_log.read(tmp_path)
    assert sorted(rounds) == [1, 2, 3, 4], "round 5 is not committed"
    assert [(c.leader, c.voters, c.samples_committed) for c in rounds.values()] == [
        ("a", ("a", "b", "c"), 30),
        ("a", ("a", "b", "c"), 60),
        ("b", ("a", "b", "c"), 80),  # the leader of its epoch; c still a voter, but not a contributor
        ("b", ("a", "b"), 100),
    ]
    assert rounds[3].weights_hash == "03" * 32


def test_a_round_line_that_is_not_the_newest_is_complete(tmp_path: Path) -> None:
    """Round 3 committed between two looks (the demo sees round 4 applied): its line still has
    the leader that committed it, the voters then, the samples through it and its θ."""
    _run_log(tmp_path)
    rounds = round_log.read(tmp_path)
    records = [RoundTimeline(3, "a", compute_s=2.0, idle_s=0.5, tokens=1280, loss=5.5),
               RoundTimeline(3, "b", compute_s=1.5, idle_s=1.5, tokens=1280, loss=5.7)]
    line = round_line(3, records, rounds[3], 400, same=True)
    assert re.fullmatch(r"round +3 +3\.0s +853 tok/s +overhead +35% +loss 5\.600 +leader b +voters a,b,c +"
                        r"samples 80/400 +θ 030303030303 same on all live peers", line), line


def test_reading_a_running_peers_log_leaves_it_untouched(tmp_path: Path) -> None:
    """A record being appended looks like a torn tail; loading the store in place would cut it
    under the running peer. The reader loads a copy."""
    _run_log(tmp_path)
    log = tmp_path / "consensus" / "log"
    with open(log, "ab") as f:
        f.write(b"SMLR\x00\x00\x01\x00half a record")
    before = log.read_bytes()
    assert sorted(round_log.read(tmp_path)) == [1, 2, 3, 4]
    assert log.read_bytes() == before


def test_no_log_is_an_error_that_names_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no commit log here"):
        round_log.read(tmp_path)


def test_the_demo_schedule_ends_where_a_site_that_stays_ends() -> None:
    """The sites' LR schedule spans the inner steps a site that stays trains, as the baseline's
    spans its run: 2866 samples, 3 sites of batch 8, H=10, the last leaving after round 5 → 50 steps
    together, then 1666 samples at 16 a step (105 more)."""
    assert schedule_steps(2866, 3, 8, 10, 5) == 50 + 105
    assert schedule_steps(2866, 3, 8, 10, 0) == 120  # nobody leaves: ceil(2866 / 24)
    assert schedule_steps(100, 1, 8, 10, 3) == 13  # alone: no leave
