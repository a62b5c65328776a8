"""The round cores (peer/core/) driven alone, with the real lease cores of one site and no I/O.

    .venv/bin/python -m pytest -q tests/unit/test_site_round.py
"""

from __future__ import annotations

import dataclasses

import pytest

from peer.core.audit import EpochLedger
from peer.core.commitlog import Contributor, Round, RoundCommit
from peer.core.exclusion import Exclusion, ExclusionKind
from peer.core import events as ev
from peer.core.round_core import RoundCore
from peer.core.site_round import BASE_WAIT_S, SiteRound
from peer.core.election import Epoch, Header, SiteId
from peer.core.lease_client import LeaseClient
from peer.core.lease_types import Send, Trained, to_ranges
from peer.core.lease_config import LeaseConfig
from peer.core.leases import LeaseOwner
from peer.core.ring import RingView
from peer.core.rounds import Contribution, Decide, RoundOpen, RoundsConfig
from peer.core.samples import SampleRange
from peer.core.timeline import RoundClock

CONFIG = RoundsConfig(inner_steps=2, samples_per_step=8, deadline_s=10.0, gather_s=2.0)
THETA0 = b"theta0"


class OneSite:
    """Site "a" owning every block: its lease owner and client answer each other at once."""

    def __init__(self, blocks: int = 3, size: int = 32, config: RoundsConfig = CONFIG) -> None:
        cfg = LeaseConfig.local_test()
        self.ledger = EpochLedger({1000 + i: size for i in range(blocks)})
        self.owner = LeaseOwner(SiteId("a"), self.ledger, cfg, amnesiac=False, boot=0)
        self.client = LeaseClient(SiteId("a"), self.ledger, cfg)
        self.core = RoundCore(SiteRound("a", "addr-a", config, cfg.ttl, self.client, RoundClock("a", 0.0), 0, THETA0))
        self.sent: list[Send] = []
        view = RingView.of(1, ["a"])
        self.pump(self.owner.set_view(view, 1, 0.0) + self.client.set_view(view, 1, 0.0), 0.0)

    def pump(self, effects: list, now: float) -> list:
        """Delivers lease sends between the site's own cores; returns every other effect."""
        out, queue = [], list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, Send):
                self.sent.append(e)
                queue += self.owner.receive(e.msg, now) + self.client.receive(e.msg, now)
                queue += self.core.handle(ev.LeasesChanged(), now)
            else:
                out.append(e)
        return out

    def lease_ticks(self, until: float, start: float = 0.0) -> None:
        t = start
        while t <= until:
            self.pump(self.owner.tick(t) + self.client.tick(t), t)
            t += 0.1

    def handle(self, event: ev.Event, now: float) -> list:
        return self.pump(self.core.handle(event, now), now)


def _open(rnd: int = 1, base: bytes = THETA0) -> ev.Opened:
    return ev.Opened(RoundOpen(Header(SiteId("lead"), "addr-lead", Epoch(1), rnd - 1), rnd, 2, 10.0, base))


def _reports(effects: list) -> list[Contribution]:
    return [e.contribution for e in effects if isinstance(e, ev.Report)]


def _trains(effects: list) -> list[ev.Train]:
    return [e for e in effects if isinstance(e, ev.Train)]


def test_a_round_trains_a_full_quota_of_leased_samples_and_reports_them_vouched() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    assert sum(r.num_samples for r in train.ranges) == CONFIG.samples_per_round
    out = s.handle(ev.TrainDone(1, train.ranges, 160, b"root", 0.5, 2, 3.0), 2.0)
    assert any(isinstance(e.msg, Trained) for e in s.sent), "the samples are claimed from their owner"
    (report,) = _reports(out)
    assert (report.round, report.ranges, report.tokens, report.pseudo_gradient_root) == (1, train.ranges, 160, b"root")
    assert sum(v.spans[0].end - v.spans[0].start for v in report.vouchers) == CONFIG.samples_per_round
    assert s.core.site.busy is None and s.core.site.sent == report


def test_a_reopened_round_is_answered_with_the_same_report_without_training_again() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    (first,) = _reports(s.handle(ev.TrainDone(1, train.ranges, 160, b"root"), 2.0))
    again = s.handle(_open(), 3.0)  # a new leader reopens round 1
    assert _reports(again) == [first] and not _trains(again)
    assert "reopened" in s.core.last_reason


def test_a_round_reopened_while_it_trains_is_reported_once_done_not_dropped() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    # An open of the same round from another θ is another round's work: the busy site sits it out.
    (empty,) = _reports(s.handle(_open(1, b"other"), 1.2))
    assert empty.tokens == 0 and "still busy with round 1" in s.core.last_reason
    again = s.handle(_open(), 1.5)  # a new leader reopens round 1 while the trainer runs it
    assert _reports(again) == [] and not _trains(again), "no empty report, no second training"
    assert "reopened while this site works on it" in s.core.last_reason
    (report,) = _reports(s.handle(ev.TrainDone(1, train.ranges, 160, b"root"), 2.0))
    assert (report.round, report.ranges, report.tokens) == (1, train.ranges, 160)


def test_an_open_while_busy_is_answered_with_nothing_and_why() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    assert _trains(s.handle(_open(), 1.0))
    (empty,) = _reports(s.handle(_open(2), 1.5))
    assert (empty.round, empty.ranges, empty.tokens) == (2, (), 0)
    assert "still busy with round 1" in s.core.last_reason


def test_an_open_waits_for_the_base_round_to_be_applied_then_sits_out_if_it_never_is() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    s.handle(ev.Committed(5, RoundCommit(Round(1), (), b"theta1")), 0.5)
    assert s.handle(_open(2, b"theta1"), 1.0) == []  # θ_1 committed but not applied yet: wait
    assert s.core.next_deadline() == 1.0 + BASE_WAIT_S
    out = s.handle(ev.Persisted(5, 1, b"theta1"), 1.2)
    assert _trains(out), "applied: the round trains at once"

    s = OneSite()
    s.lease_ticks(0.3)
    assert s.handle(_open(2, b"theta1"), 1.0) == []
    out = s.handle(ev.Tick(), 1.0 + BASE_WAIT_S)
    assert [c.tokens for c in _reports(out)] == [0] and "not at θ_1 (have round 0)" in s.core.last_reason


def test_an_open_waits_longer_while_its_base_round_is_committed_and_being_applied_here() -> None:
    """Applying θ_1 means fetching round 1's mean, which over a WAN link can take longer than
    BASE_WAIT_S: while θ_1 is committed (this peer applies it) the open waits up to half the round's
    deadline. A fixed 5 s made a site that missed one round sit out every later one (it was always
    still applying the round before when the next opened: 5.6 s each in bench_overhead's WAN arm)."""
    s = OneSite()
    s.lease_ticks(0.3)
    opened = ev.Opened(dataclasses.replace(_open(2, b"theta1").msg, deadline_s=60.0))
    s.handle(ev.Committed(5, RoundCommit(Round(1), (), b"theta1")), 0.5)
    assert s.handle(opened, 1.0) == []
    assert s.core.next_deadline() == 1.0 + 30.0, "half the deadline"
    assert _reports(s.handle(ev.Tick(), 1.0 + BASE_WAIT_S + 1)) == [], "still applying θ_1: no empty report"
    s.lease_ticks(8.9, start=7.1)  # the site's leases are renewed meanwhile
    assert _trains(s.handle(ev.Persisted(5, 1, b"theta1"), 1.0 + 8.0)), "applied after 8 s: it trains round 2"

    s = OneSite()
    s.lease_ticks(0.3)
    s.handle(ev.Committed(5, RoundCommit(Round(1), (), b"theta1")), 0.5)
    assert s.handle(opened, 1.0) == []
    out = s.handle(ev.Tick(), 1.0 + 30.0)
    assert [c.tokens for c in _reports(out)] == [0], "never applied: it sits out at half the deadline"


def test_gathering_stops_when_no_sample_came_for_gather_s() -> None:
    s = OneSite(blocks=0)  # nothing to lease at all (the end of a data epoch)
    assert s.handle(_open(), 1.0) == []
    assert s.core.next_deadline() == 1.0 + CONFIG.gather_s
    (empty,) = _reports(s.handle(ev.Tick(), 1.0 + CONFIG.gather_s))
    assert empty.ranges == () and "no leased sample came within 2 s" in s.core.last_reason


def test_a_failed_training_reports_its_claimed_samples_without_a_pseudo_gradient() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    (report,) = _reports(s.handle(ev.TrainFailed(1, "trainer died"), 2.0))
    assert report.ranges == train.ranges and report.tokens == 0 and report.pseudo_gradient_root == b""
    assert any(isinstance(e.msg, Trained) for e in s.sent)
    assert "training failed (trainer died)" in s.core.last_reason


def test_a_trainer_that_trained_other_samples_is_a_failed_round() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    other = SampleRange(999, 0, 3)  # no block of this site's leases
    assert other.block_id not in {r.block_id for r in train.ranges}
    (report,) = _reports(s.handle(ev.TrainDone(1, (other,), 30, b"root"), 2.0))
    assert report.tokens == 0 and "other samples than the leased ones" in s.core.last_reason


def test_a_time_boxed_round_claims_what_was_trained_and_puts_the_rest_back_on_its_lease() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    opened = _open()
    boxed = ev.Opened(dataclasses.replace(opened.msg, budget_s=4.0))
    (train,) = _trains(s.handle(boxed, 1.0))
    assert train.budget_s == 4.0
    first = train.ranges[0]
    part = (SampleRange(first.block_id, first.start, first.start + 3),)  # the box ended after 3 samples
    out = s.handle(ev.TrainDone(1, part, 3 * 32, b"root", 4.1, 1, 3.0), 2.0)
    (report,) = _reports(out)
    assert report.ranges == part and report.tokens == 3 * 32
    assert [r for v in report.vouchers for r in to_ranges(v.block_id, v.spans)] == list(part), "claimed: only those"
    assert any("not reached by the trainer go back on their leases" in why for why in s.core.reasons)
    # The rest is trained next round, from the same lease: nothing lost, nothing claimed twice.
    s.handle(ev.Committed(7, RoundCommit(Round(1), (), b"t1")), 2.5)
    s.handle(ev.Persisted(7, 1, b"t1"), 2.6)
    (again,) = _trains(s.handle(_open(2, b"t1"), 3.0))
    back = {(r.block_id, i) for r in again.ranges for i in range(r.start, r.end)}
    assert {(first.block_id, i) for i in range(first.start + 3, first.end)} <= back


def test_every_trained_round_tells_the_lease_owners_this_sites_pace() -> None:
    """The owners compare holders by it at the data epoch's tail (LeaseHeader.pace)."""
    s = OneSite()
    s.lease_ticks(0.3)
    assert s.client.header().pace == 0.0, "nothing measured yet"
    (train,) = _trains(s.handle(_open(), 1.0))
    s.handle(ev.TrainDone(1, train.ranges, 160, b"root", seconds=4.0), 5.0)
    assert s.client.header().pace == sum(r.num_samples for r in train.ranges) / 4.0


def test_a_time_boxed_round_takes_what_the_sites_last_boxed_pace_fits_in_its_budget() -> None:
    """A slow site takes no more than it can train in the budget, so the blocks it would not reach
    stay unstarted (stealable by idle sites); an unboxed round takes the full H x batch again."""
    s = OneSite(size=64)  # one started block serves every round
    s.lease_ticks(0.3)

    def boxed(rnd: int, budget: float, base: bytes) -> ev.Opened:
        return ev.Opened(dataclasses.replace(_open(rnd, base).msg, budget_s=budget))

    def finish(rnd: int, train: ev.Train, n: int, seconds: float, now: float) -> None:
        first = train.ranges[0]
        done = (SampleRange(first.block_id, first.start, first.start + n),)
        s.handle(ev.TrainDone(rnd, done, n * 32, b"root", seconds, 1, 3.0), now)
        theta = f"t{rnd}".encode()
        s.handle(ev.Committed(10 + rnd, RoundCommit(Round(rnd), (), theta)), now + 0.1)
        s.handle(ev.Persisted(10 + rnd, rnd, theta), now + 0.2)

    def taken(train: ev.Train) -> int:
        return sum(r.num_samples for r in train.ranges)

    # The trainer's seconds are its own; the clock here stays within the leases' validity.
    (probe,) = _trains(s.handle(boxed(1, 4.0, THETA0), 1.0))
    assert taken(probe) == CONFIG.samples_per_step, "no pace known yet: one step probes it"
    finish(1, probe, 8, 4.0, 1.1)  # 2 samples a second
    (first,) = _trains(s.handle(boxed(2, 8.0, b"t1"), 1.2))
    assert taken(first) == CONFIG.samples_per_round, "2/s x 8 s x 1.25 = 20: capped at H x batch"
    finish(2, first, 12, 4.0, 1.3)  # 3 samples a second
    (second,) = _trains(s.handle(boxed(3, 2.0, b"t2"), 1.5))
    assert taken(second) == 8, "3/s x 2 s x 1.25 = 7.5 -> 8 (one step's worth at least)"
    finish(3, second, 1, 2.0, 1.6)  # 0.5 a second: the floor of one step
    (third,) = _trains(s.handle(boxed(4, 2.0, b"t3"), 2.0))
    assert taken(third) == CONFIG.samples_per_step
    finish(4, third, 8, 0.5, 2.1)
    (fourth,) = _trains(s.handle(_open(5, b"t4"), 2.5))
    assert taken(fourth) == CONFIG.samples_per_round, "not time-boxed: H x batch"


def test_a_round_committed_while_this_site_trained_it_does_not_wait_for_vouchers() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    s.handle(ev.Committed(7, RoundCommit(Round(1), (), b"t1")), 1.5)  # decided without this site
    out = s.handle(ev.TrainDone(1, train.ranges, 160, b"root"), 2.0)
    assert _reports(out) == [] and s.core.site.busy is None
    assert "committed while this site trained it" in s.core.last_reason
    assert s.core.site.sent is None, "nothing to answer a reopen with: the round is decided"


def test_a_leave_waits_for_the_commit_of_the_reported_round_then_gives_every_lease_back() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    s.handle(ev.TrainDone(1, train.ranges, 160, b"root"), 2.0)
    out = s.handle(ev.LeaveRequested(5.0), 3.0)
    assert not any(isinstance(e, ev.LeaveReady) for e in out) and s.core.next_deadline() == 8.0
    assert [c.tokens for c in _reports(s.handle(_open(2), 3.5))] == [0]  # leaving: trains no more
    mine = Contributor(SiteId("a"), 160, train.ranges, b"root")
    out = s.handle(ev.Committed(7, RoundCommit(Round(1), (mine,), b"t1")), 4.0)
    assert not any(isinstance(e, ev.LeaveReady) for e in out) and s.client.held == {}
    # It stays, serving round 1's pseudo-gradient, until round 2 commits: the leader applied round 1.
    out = s.handle(ev.Committed(8, RoundCommit(Round(2), (), b"t2")), 4.5)
    assert any(isinstance(e, ev.LeaveReady) for e in out)


def test_a_leave_ends_at_the_commit_of_its_round_when_that_went_without_this_sites_report() -> None:
    """Nobody will fetch a pseudo-gradient the commit does not name (the leader excluded it, or this
    site led the round and withdrew it): waiting for the round after would only delay the leave."""
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    s.handle(ev.TrainDone(1, train.ranges, 160, b"root"), 2.0)
    s.handle(ev.LeaveRequested(5.0), 3.0)
    out = s.handle(ev.Committed(7, RoundCommit(Round(1), (), b"t1")), 4.0)
    assert any(isinstance(e, ev.LeaveReady) for e in out) and s.client.held == {}


# Every site leaves at once (ops/local_mesh.py stop): what this leaving site knows, in order, after
# reporting round 1 -> whether its leave ends (LeaveReady) before its 50 s wait runs out. "lead" led
# round 1; `NobodyStays` says every other live member leaves too and no round this peer leads is open.
ALL_LEAVE = [
    ("committed, applied, nobody stays", ["commit", "persist", "nobody"], True),
    ("nobody stays, then committed and applied", ["nobody", "commit", "persist"], True),
    ("committed, nobody stays, not applied here yet", ["commit", "nobody"], False),
    ("committed and applied, but some member stays", ["commit", "persist"], False),
    ("nobody stays, then one comes back, then applied", ["commit", "nobody", "somebody", "persist"], False),
    ("not committed, nobody stays, its leader still up", ["nobody"], False),
    ("not committed, nobody stays, its leader left", ["nobody", "lead down"], True),
    ("not committed, its leader down and up again, nobody stays", ["lead down", "lead up", "nobody"], False),
    ("not committed, this site opened it and holds it no more", ["self led", "nobody"], True),
    ("not committed, this site opened it, some member stays", ["self led"], False),
]


@pytest.mark.parametrize("steps,released", [(s, r) for _, s, r in ALL_LEAVE], ids=[i for i, _, _ in ALL_LEAVE])
def test_a_leave_stops_waiting_for_a_round_nobody_will_open_when_every_site_leaves(steps: list[str],
                                                                                 released: bool) -> None:
    """No leaving leader opens a round, so a leave waiting for "the round after" its own waited out
    its whole wait when every site left at once (SIGTERM to all): killed at 60 s by local_mesh."""
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    if "self led" in steps:  # this site led round 1 (a reopen by itself), then stepped down
        own = _open()
        s.handle(dataclasses.replace(own, msg=dataclasses.replace(own.msg, header=Header(SiteId("a"), "addr-a",
                                                                                          Epoch(1), 0))), 1.5)
    s.handle(ev.TrainDone(1, train.ranges, 160, b"root"), 2.0)
    out = s.handle(ev.LeaveRequested(50.0), 3.0)
    mine = Contributor(SiteId("a"), 160, train.ranges, b"root")
    events: dict[str, ev.Event] = {
        "commit": ev.Committed(7, RoundCommit(Round(1), (mine,), b"t1")), "persist": ev.Persisted(7, 1, b"t1"),
        "nobody": ev.NobodyStays(True), "somebody": ev.NobodyStays(False),
        "lead down": ev.MemberDown("lead"), "lead up": ev.MemberUp("lead")}
    for i, step in enumerate(x for x in steps if x != "self led"):
        out += s.handle(events[step], 4.0 + i)
    assert any(isinstance(e, ev.LeaveReady) for e in out) is released
    if released:
        assert any("member is leaving too" in why for why in s.core.reasons), s.core.reasons
    assert any(isinstance(e, ev.LeaveReady) for e in s.handle(ev.Tick(), 53.0)) is not released, "bounded anyway"


# A site leaves with samples in the run's last round: no round after opens, so the leader's word
# that it holds θ of that round (RunComplete, after it applied it) ends the wait, in either order
# with this site's own commit of the round; said of an earlier round, or before the commit, it does not.
RUN_COMPLETE = [
    ("committed, then the leader holds it", ["commit", "complete 1"], True),
    ("the leader holds it, then committed here", ["complete 1", "commit"], True),
    ("said before the leave", ["before", "commit"], True),
    ("said of an earlier round", ["complete 0", "commit"], False),
    ("said, not committed here", ["complete 1"], False),
]


@pytest.mark.parametrize("steps,released", [(s, r) for _, s, r in RUN_COMPLETE], ids=[i for i, _, _ in RUN_COMPLETE])
def test_a_leave_with_samples_in_the_runs_last_round_ends_when_the_leader_holds_it(steps: list[str],
                                                                                   released: bool) -> None:
    """SIGTERM to a site after the run's data was complete waited out the whole round deadline (120 s
    in test_watch_run) for a round that never opens, whenever that site had trained the last samples."""
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    s.handle(ev.TrainDone(1, train.ranges, 160, b"root"), 2.0)
    mine = Contributor(SiteId("a"), 160, train.ranges, b"root")
    events: dict[str, ev.Event] = {
        "commit": ev.Committed(7, RoundCommit(Round(1), (mine,), b"t1")), "before": ev.RunCompleted(1),
        "complete 1": ev.RunCompleted(1), "complete 0": ev.RunCompleted(0)}
    out: list[ev.Effect] = []
    if "before" in steps:
        out += s.handle(events["before"], 2.5)
    out += s.handle(ev.LeaveRequested(50.0), 3.0)
    for i, step in enumerate(x for x in steps if x != "before"):
        out += s.handle(events[step], 4.0 + i)
    assert any(isinstance(e, ev.LeaveReady) for e in out) is released
    if released:
        assert any("the run's data is complete" in why for why in s.core.reasons), s.core.reasons
        assert s.client.held == {}, "every lease given back"
    assert any(isinstance(e, ev.LeaveReady) for e in s.handle(ev.Tick(), 53.0)) is not released, "bounded anyway"


def test_a_leave_gives_up_waiting_at_its_deadline() -> None:
    s = OneSite()
    s.lease_ticks(0.3)
    (train,) = _trains(s.handle(_open(), 1.0))
    s.handle(ev.TrainDone(1, train.ranges, 160, b"root"), 2.0)
    s.handle(ev.LeaveRequested(5.0), 3.0)
    assert any(isinstance(e, ev.LeaveReady) for e in s.handle(ev.Tick(), 8.0))


# ----- the leader's fetch --------------------------------------------------------------------------

def _contribution(site: str, tokens: int = 10) -> Contribution:
    header = Header(SiteId(site), f"addr-{site}", Epoch(1), 0)
    return Contribution(header, 1, site, f"addr-{site}", tokens, (SampleRange(1000, 0, 1),), b"r-" + site.encode())


def _decide(*sites: str) -> ev.DecideRound:
    return ev.DecideRound(Decide(1, tuple(_contribution(s) for s in sites), (Exclusion("z", ExclusionKind.NO_REPORT, "excluded: z did not report"),)),
                          frozenset(sites))


def test_decision_drops_a_contributor_whose_delta_cannot_be_fetched_and_proposes_the_rest() -> None:
    core = OneSite().core
    out = core.handle(_decide("a", "b"), 0.0)
    assert [e.site for e in out if isinstance(e, ev.Excluded)] == ["z"]
    (fetch,) = [e for e in out if isinstance(e, ev.Fetch)]
    assert [c.site for c in fetch.admitted] == ["a", "b"] and not core.ready_to_open
    (refetch,) = [e for e in core.handle(ev.OutcomeFailed(1, fetch.attempt, "b", "b is gone"), 0.1)
                  if isinstance(e, ev.Fetch)]
    assert [c.site for c in refetch.admitted] == ["a"] and "b: excluded: b is gone" in core.last_reason
    assert core.handle(ev.OutcomeReady(1, fetch.attempt, b"stale"), 0.2) == []  # an old attempt's answer
    (propose,) = [e for e in core.handle(ev.OutcomeReady(1, refetch.attempt, b"t1"), 0.3) if isinstance(e, ev.Propose)]
    assert propose.commit == RoundCommit(Round(1), (Contributor(SiteId("a"), 10, (SampleRange(1000, 0, 1),),
                                                               b"r-a"),), b"t1")
    assert core.ready_to_open


def test_decision_cancels_a_fetch_at_once_when_a_contributor_is_declared_dead() -> None:
    core = OneSite().core
    (fetch,) = [e for e in core.handle(_decide("a", "b"), 0.0) if isinstance(e, ev.Fetch)]
    out = core.handle(ev.MemberDown("b"), 0.1)
    assert ev.CancelFetch(1, fetch.attempt) in out
    assert [[c.site for c in e.admitted] for e in out if isinstance(e, ev.Fetch)] == [["a"]]


def test_decision_drops_a_suspected_contributor_at_once_but_never_itself() -> None:
    """A contributor stopped or cut off after its manifest was read held the fetch until membership
    called it dead; a suspicion is enough. The leader's own contribution is fetched from itself."""
    core = OneSite().core
    assert core.handle(ev.MemberSuspect("b"), 0.0) == []  # nothing being fetched
    (fetch,) = [e for e in core.handle(_decide("a", "b", "c"), 0.0) if isinstance(e, ev.Fetch)]
    assert not [e for e in core.handle(ev.MemberSuspect("a"), 0.1) if isinstance(e, ev.Fetch | ev.CancelFetch)]
    assert not [e for e in core.handle(ev.MemberSuspect("z"), 0.1) if isinstance(e, ev.Fetch | ev.CancelFetch)]
    out = core.handle(ev.MemberSuspect("b"), 0.2)
    assert ev.CancelFetch(1, fetch.attempt) in out and "b is suspected" in core.last_reason
    assert [[c.site for c in e.admitted] for e in out if isinstance(e, ev.Fetch)] == [["a", "c"]]


def test_decision_commits_the_round_empty_when_no_single_site_is_to_blame() -> None:
    core = OneSite().core
    (fetch,) = [e for e in core.handle(_decide("a", "b"), 0.0) if isinstance(e, ev.Fetch)]
    (empty,) = [e for e in core.handle(ev.OutcomeFailed(1, fetch.attempt, "", "disk full"), 0.1)
                if isinstance(e, ev.Fetch)]
    assert empty.admitted == () and "committing it empty" in core.last_reason


# ----- applying the log ----------------------------------------------------------------------------

def _commit(rnd: int) -> ev.Committed:
    return ev.Committed(10 + rnd, RoundCommit(Round(rnd), (), f"t{rnd}".encode()))


def test_an_apply_waiting_on_a_suspected_contributor_gives_way_to_a_state_transfer() -> None:
    """A follower applying round 1 fetches b's pseudo-gradient; b is stopped or cut off after the
    commit: the fetch would hang until it gives up. A suspicion of b (or b gone) cancels the apply
    and catches up by state transfer at once; the cancelled apply's late answer changes nothing,
    and a failed transfer goes back to the apply. Other members' verdicts are none of its business."""
    core = OneSite().core
    commit = RoundCommit(Round(1), (Contributor(SiteId("b"), 10, (SampleRange(1000, 0, 1),), b"r-b"),), b"t1")
    assert [e for e in core.handle(ev.Committed(11, commit), 0.0) if isinstance(e, ev.Apply)] == [ev.Apply(11, commit)]
    core.handle(_commit(2), 0.0)
    assert not [e for e in core.handle(ev.MemberSuspect("c"), 0.1) if isinstance(e, ev.CancelApply | ev.CatchUp)]
    out = core.handle(ev.MemberSuspect("b"), 0.2)
    assert ev.CancelApply(1) in out and ev.CatchUp() in out
    assert not [e for e in core.handle(ev.Persisted(11, 1, b"t1"), 0.3) if isinstance(e, ev.RoundApplied)], \
        "the cancelled apply's answer was taken for the transfer's"
    out = core.handle(ev.CatchUpFailed("nobody serves round 2 yet"), 0.4)
    retry = [e for e in core.handle(ev.Tick(), 5.0) if isinstance(e, ev.Apply)]
    assert retry == [ev.Apply(11, commit)], out
    out = core.handle(ev.MemberDown("b"), 5.1)
    assert ev.CancelApply(1) in out and ev.CatchUp() in out
    out = core.handle(ev.Persisted(12, 2, b"t2", transfer=True), 5.2)
    assert ev.RoundApplied(2) in out and not [e for e in out if isinstance(e, ev.Apply)], "round 2 was covered"
    assert core.applier.idle


def test_apply_queue_applies_in_order_one_at_a_time() -> None:
    core = OneSite().core
    (first,) = [e for e in core.handle(_commit(1), 0.0) if isinstance(e, ev.Apply)]
    assert [e for e in core.handle(_commit(2), 0.0) if isinstance(e, ev.Apply)] == []  # one at a time
    out = core.handle(ev.Persisted(11, 1, b"t1"), 0.1)
    assert ev.RoundApplied(1) in out and [e.commit.round for e in out if isinstance(e, ev.Apply)] == [2]
    assert first.commit.round == 1


def test_a_hash_mismatch_re_syncs_by_state_transfer_at_once_and_skips_what_it_covered() -> None:
    core = OneSite().core
    core.handle(_commit(1), 0.0)
    core.handle(_commit(2), 0.0)
    out = core.handle(ev.ApplyFailed(1, "diverged", "round 1: θ hash ab != committed cd (I7)"), 0.1)
    assert ev.CatchUp() in out and core.applier.diverged.endswith("re-syncing by state transfer")
    out = core.handle(ev.Persisted(12, 2, b"t2", transfer=True), 0.2)
    assert "re-synced to round 2" in core.applier.diverged
    assert not [e for e in out if isinstance(e, ev.Apply)] and core.applier.idle  # round 2 was covered


def test_an_apply_error_is_retried_with_back_off() -> None:
    core = OneSite().core
    core.handle(_commit(1), 0.0)
    assert [e for e in core.handle(ev.ApplyFailed(1, "error", "EIO"), 1.0) if isinstance(e, ev.Apply)] == []
    assert core.next_deadline() == 1.5
    assert core.handle(ev.Tick(), 1.4) == []
    assert [e.commit.round for e in core.handle(ev.Tick(), 1.5) if isinstance(e, ev.Apply)] == [1]


def test_an_unavailable_delta_is_replaced_by_a_state_transfer_and_retried_if_that_fails() -> None:
    core = OneSite().core
    core.handle(_commit(1), 0.0)
    assert ev.CatchUp() in core.handle(ev.ApplyFailed(1, "unavailable", "nobody serves b's Δ"), 1.0)
    core.handle(ev.CatchUpFailed("no peer"), 1.1)
    assert [e.commit.round for e in core.handle(ev.Tick(), 1.1 + 1.0) if isinstance(e, ev.Apply)] == [1]
