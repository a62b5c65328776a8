"""Overlapped rounds in the site's core (RoundsConfig.overlap): a round trained ahead of its open
and of θ_{r-1}, folded, claimed, and reported only at the open's base.

    .venv/bin/python -m pytest -q tests/unit/test_site_round_overlap.py
"""

from __future__ import annotations

import dataclasses

from peer.core import events as ev
from peer.core import site_round
from peer.core.lease_types import Trained
from tests.unit.test_site_round import CONFIG, OneSite, _open, _reports, _trains

OVERLAP = dataclasses.replace(CONFIG, overlap=True)
THETA1 = b"theta1"


def _round_one(s: OneSite) -> tuple[ev.Train, list]:
    """Round 1 trained and reported the serial way; returns its Train and what came with its report."""
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    out = s.handle(ev.TrainDone(1, train.ranges, 160, b"root1", 0.5, 2), 2.0)
    assert [c.round for c in _reports(out)] == [1]
    return train, out


def _claims(s: OneSite, rnd: int) -> list[Trained]:
    return [e.msg for e in s.sent if isinstance(e.msg, Trained) and e.msg.round == rnd]


def _samples(train: ev.Train) -> set[tuple[int, int]]:
    return {(r.block_id, i) for r in train.ranges for i in range(r.start, r.end)}


def test_the_next_round_trains_ahead_at_its_report_folds_theta_and_reports_at_its_open() -> None:
    s = OneSite(config=OVERLAP)
    first, out = _round_one(s)
    (ahead,) = _trains(out)
    assert (ahead.round, ahead.ahead) == (2, True), "round 2 trains with the report of round 1, before any open"
    assert not _samples(ahead) & _samples(first), "fresh leased samples"
    assert s.handle(ev.Persisted(5, 1, THETA1), 2.5) == [ev.Fold(1)], "θ_1 goes to the round trained ahead"
    out = s.handle(ev.TrainDone(2, ahead.ranges, 160, b"root2", 0.5, 2, folded_at=1), 3.0)
    assert _claims(s, 2), "claimed once trained, as in a serial round"
    assert not _reports(out), "no report before the leader opens round 2"
    (report,) = _reports(s.handle(_open(2, THETA1), 3.5))
    assert (report.round, report.ranges, report.pseudo_gradient_root) == (2, ahead.ranges, b"root2")
    b = s.core.site.busy
    assert isinstance(b, site_round._Gathering) and isinstance(b.lead, site_round._Ahead) and b.open.round == 3, \
        "and round 3 starts ahead with that report"


def test_serial_rounds_wait_for_the_open() -> None:
    s = OneSite()
    _, out = _round_one(s)
    assert not _trains(out) and s.core.site.busy is None


def test_an_ahead_round_reports_only_once_its_base_is_here_with_the_opens_hash() -> None:
    s = OneSite(config=OVERLAP)
    _, out = _round_one(s)
    (ahead,) = _trains(out)
    s.handle(ev.TrainDone(2, ahead.ranges, 160, b"root2", 0.5, 2), 3.0)
    assert not _reports(s.handle(_open(2, THETA1), 3.2)), "θ_1 is not applied here yet"
    (report,) = _reports(s.handle(ev.Persisted(5, 1, THETA1), 3.4))
    assert report.round == 2 and report.tokens == 160


def test_an_ahead_round_at_another_theta_than_the_open_names_reports_nothing() -> None:
    s = OneSite(config=OVERLAP)
    _, out = _round_one(s)
    (ahead,) = _trains(out)
    s.handle(ev.Persisted(5, 1, b"not-theta1"), 2.5)
    s.handle(ev.TrainDone(2, ahead.ranges, 160, b"root2", 0.5, 2), 3.0)
    (report,) = _reports(s.handle(_open(2, THETA1), 3.2))
    assert report.tokens == 0 and not report.ranges, "a Δ measured elsewhere is never reported"


def test_an_ahead_round_decided_without_this_site_gives_its_samples_back_unclaimed() -> None:
    s = OneSite(config=OVERLAP)
    _, out = _round_one(s)
    (ahead,) = _trains(out)
    held_before = {b: h.spans for b, h in s.client.held.items()}
    s.handle(_open(3, b"theta2"), 2.5)  # round 2 went on without this site
    s.handle(ev.TrainDone(2, ahead.ranges, 160, b"root2", 0.5, 2), 3.0)
    assert not _claims(s, 2), "nothing claimed for a round decided without it"
    back = {(b, i) for b, h in s.client.held.items() for sp in h.spans for i in range(sp.start, sp.end)}
    assert _samples(ahead) <= back, "every sample it took is on its lease again"
    assert held_before.keys() <= s.client.held.keys()


def test_theta_applied_while_the_ahead_round_gathers_trains_it_from_theta() -> None:
    s = OneSite(blocks=1, size=24, config=OVERLAP)  # round 1 takes 16; 8 are left, short of a quota
    _, out = _round_one(s)
    assert not _trains(out), "gathering: fewer samples than a round's quota so far"
    assert s.handle(ev.Persisted(5, 1, THETA1), 2.5) == [], "nothing trains yet, so nothing to fold"
    (train,) = _trains(s.handle(ev.Tick(), 2.0 + CONFIG.gather_s))
    assert (train.round, train.ahead) == (2, False), "θ_1 is here: the round starts from it, no fold needed"


def test_leaving_drops_the_round_trained_ahead() -> None:
    s = OneSite(config=OVERLAP)
    _, out = _round_one(s)
    (ahead,) = _trains(out)
    s.handle(ev.LeaveRequested(5.0), 2.2)
    s.handle(ev.TrainDone(2, ahead.ranges, 160, b"root2", 0.5, 2), 3.0)
    assert not _claims(s, 2), "a leaving site claims nothing more"
    assert all(not c.tokens for c in _reports(s.handle(_open(2, THETA1), 3.2))), "and reports no samples"


def test_a_failed_round_trained_ahead_gives_its_samples_back_and_reports_nothing() -> None:
    s = OneSite(config=OVERLAP)
    _, out = _round_one(s)
    (ahead,) = _trains(out)
    out = s.handle(ev.TrainFailed(2, "RuntimeError: out of memory"), 3.0)
    assert not _claims(s, 2) and not _reports(out), "nothing claimed or reported before its open"
    back = {(b, i) for b, h in s.client.held.items() for sp in h.spans for i in range(sp.start, sp.end)}
    assert _samples(ahead) <= back


def test_a_failed_round_trained_ahead_after_its_open_reports_nothing_at_once() -> None:
    """Its open came, so the leader waits for this site: without a report it waited out the round's
    deadline (120 s in test_ranks_mesh, a killed rank). Nothing was claimed: the report is empty."""
    s = OneSite(config=OVERLAP)
    _, out = _round_one(s)
    (ahead,) = _trains(out)
    s.handle(_open(2, THETA1), 2.5)
    out = s.handle(ev.TrainFailed(2, "RuntimeError: out of memory"), 3.0)
    (report,) = _reports(out)
    assert (report.round, report.ranges, report.tokens) == (2, (), 0), "an empty report at once"
    assert not _claims(s, 2)
    back = {(b, i) for b, h in s.client.held.items() for sp in h.spans for i in range(sp.start, sp.end)}
    assert _samples(ahead) <= back, "its samples go back on their leases"


def test_leaving_while_an_opened_round_trains_ahead_tells_the_leader_at_once() -> None:
    """Else the leader waits out the round's deadline for a report that never comes (and the
    leaver's wait for that round's commit with it): measured in test_darl_mesh, 60 s."""
    s = OneSite(config=OVERLAP)
    _, out = _round_one(s)
    (ahead,) = _trains(out)
    s.handle(_open(2, THETA1), 2.1)
    reports = _reports(s.handle(ev.LeaveRequested(5.0), 2.2))
    assert [(c.round, c.tokens) for c in reports] == [(2, 0)], "reported nothing for round 2, now"
    assert not _reports(s.handle(ev.TrainDone(2, ahead.ranges, 160, b"root2", 0.5, 2), 3.0)) and not _claims(s, 2)
