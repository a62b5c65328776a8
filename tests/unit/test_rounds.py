"""The leader's round core: opening rounds, collecting reports, admission by vouchers (I6), idling."""

from __future__ import annotations

import dataclasses

import pytest

from peer.core.audit import EpochLedger
from peer.core.commitlog import SampleRange
from peer.core.election import Epoch, Header, SiteId
from peer.core.exclusion import Exclusion, ExclusionKind
from peer.core.lease_types import Gen, Voucher, of_range
from peer.core import rounds
from peer.core.rounds import (Broadcast, Contribution, Decide, EpochComplete, RoundOpen, RoundsConfig, Reported, RunComplete,
                              SendOpen)

UNIVERSE = {10: 8, 11: 8, 12: 4}  # 20 samples
CFG = RoundsConfig(inner_steps=2, samples_per_step=2, deadline_s=5.0, idle_wait_s=1.0)
H = Header(SiteId("a"), "h:1", Epoch(3), 0)



class RoundLeader(rounds.RoundLeader):
    """The leader with the `Reported` of each report set aside: the tests below are about what it
    decides (test_each_report_in_the_open_round_is_passed_on_to_have_its_manifest_asked checks them)."""

    def receive(self, msg: Contribution, now: float) -> list[rounds.Effect]:
        return [e for e in super().receive(msg, now) if not isinstance(e, Reported)]


def reasons(decide: Decide) -> dict[str, str]:
    return {e.site: e.reason for e in decide.excluded}


def kinds(decide: Decide) -> dict[str, ExclusionKind]:
    return {e.site: e.kind for e in decide.excluded}

def _leader() -> RoundLeader:
    return RoundLeader(CFG, EpochLedger(UNIVERSE))


def _open(leader: RoundLeader, sites: list[str], now: float = 0.0, committed: int = 0) -> RoundOpen:
    effects = leader.tick(now, H, committed, sites, b"base")
    assert len(effects) == 1 and isinstance(effects[0], Broadcast), effects
    return effects[0].msg


def _report(site: str, rnd: int, *ranges: SampleRange, vouched: bool = True, tokens: int = 64) -> Contribution:
    vouchers = tuple(Voucher(r.block_id, Gen(7), of_range(r)) for r in ranges) if vouched else ()
    return Contribution(H, rnd, site, f"{site}:1", tokens, tuple(ranges), b"\x01" * 32, vouchers)


def test_opens_the_round_after_the_committed_one_for_the_live_sites() -> None:
    msg = _open(_leader(), ["c", "a", "b"], committed=4)
    assert (msg.round, msg.inner_steps, msg.deadline_s, msg.base_weights_hash) == (5, 2, 5.0, b"base")
    assert CFG.samples_per_round == 4


def test_each_report_in_the_open_round_is_passed_on_to_have_its_manifest_asked() -> None:
    """A report that trained something is passed on (`Reported`) as it comes, before the decision,
    so that its site is asked for its manifest while the round still waits; an idle report, a
    duplicate and a report of another round are not."""
    leader = rounds.RoundLeader(CFG, EpochLedger(UNIVERSE))
    _open(leader, ["a", "b", "c"])
    first = _report("a", 1, SampleRange(10, 0, 4))
    assert leader.receive(first, 1.0) == [Reported(first)]
    assert leader.receive(first, 1.1) == [], "a duplicate delivery"
    assert leader.receive(_report("c", 2, SampleRange(11, 0, 4)), 1.2) == [], "another round's"
    assert leader.receive(_report("c", 1), 1.3) == [], "c trained nothing"
    last = _report("b", 1, SampleRange(11, 0, 4))
    asked, decide = leader.receive(last, 1.4)
    assert asked == Reported(last) and isinstance(decide, Decide), "passed on before the decision"


def test_no_round_without_live_sites() -> None:
    assert _leader().tick(0.0, H, 0, [], b"") == []


def test_every_report_in_decides_at_once_and_the_commit_opens_the_next() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    assert leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 1.0) == []
    (decide,) = leader.receive(_report("b", 1, SampleRange(11, 0, 4)), 1.0)
    assert isinstance(decide, Decide) and decide.round == 1
    assert [c.site for c in decide.admitted] == ["a", "b"] and decide.excluded == ()
    assert leader.tick(2.0, H, 0, ["a", "b"], b"") == [], "no new round before the decision commits"
    leader.on_commit(1)
    assert _open(leader, ["a", "b"], now=2.0, committed=1).round == 2


def test_unvouched_samples_exclude_the_whole_contribution() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    leader.receive(_report("a", 1, SampleRange(10, 0, 4), vouched=False), 1.0)
    (decide,) = leader.receive(_report("b", 1, SampleRange(11, 0, 4)), 1.0)
    assert [c.site for c in decide.admitted] == ["b"]
    (reason,) = [e.reason for e in decide.excluded if e.site == "a"]
    assert "samples 0..4 were not leased to a for round 1" in reason


def test_samples_committed_earlier_in_the_epoch_are_excluded() -> None:
    ledger = EpochLedger(UNIVERSE)
    ledger.apply(1, [(SiteId("b"), (SampleRange(10, 2, 6),))])
    leader = RoundLeader(CFG, ledger)
    leader.on_commit(1)
    _open(leader, ["a"], committed=1)
    (decide,) = leader.receive(_report("a", 2, SampleRange(10, 0, 4)), 1.0)
    assert decide.admitted == ()
    assert "already committed in data epoch 0" in reasons(decide)["a"]
    assert kinds(decide) == {"a": ExclusionKind.ALREADY_COMMITTED}


def test_two_sites_naming_the_same_samples_admit_only_the_first_in_site_order() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    leader.receive(_report("b", 1, SampleRange(10, 0, 4)), 1.0)
    (decide,) = leader.receive(_report("a", 1, SampleRange(10, 2, 3)), 1.0)
    assert [c.site for c in decide.admitted] == ["a"]
    assert "already included in round 1 from another site" in reasons(decide)["b"]
    assert kinds(decide)["b"] is ExclusionKind.DUPLICATE


def test_a_report_without_pseudo_gradient_is_excluded_so_its_claims_settle() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    leader.receive(_report("a", 1, SampleRange(10, 0, 4), tokens=0), 1.0)
    (decide,) = leader.receive(_report("b", 1), 1.0)  # b trained nothing
    assert isinstance(decide, Decide), "a's claimed samples need this round's commit to be freed"
    assert decide.admitted == () and "training failed" in reasons(decide)["a"]
    assert kinds(decide) == {"a": ExclusionKind.TRAINING_FAILED}


def test_deadline_decides_without_the_silent_site() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 1.0)
    assert leader.tick(CFG.deadline_s - 0.1, H, 0, ["a", "b"], b"") == []
    (decide,) = leader.tick(CFG.deadline_s, H, 0, ["a", "b"], b"")
    assert [c.site for c in decide.admitted] == ["a"]
    assert "did not report" in reasons(decide)["b"]


def test_a_silent_site_that_left_the_mesh_is_not_waited_for() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 1.0)
    (decide,) = leader.tick(1.5, H, 0, ["a"], b"")
    assert isinstance(decide, Decide) and [c.site for c in decide.admitted] == ["a"]


def test_a_round_nobody_trained_in_is_not_committed_but_reopened_later() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    assert leader.receive(_report("a", 1), 1.0) == []
    assert leader.receive(_report("b", 1), 1.0) == [], "nothing to decide: no commit"
    assert leader.tick(1.5, H, 0, ["a", "b"], b"") == [], "waits idle_wait_s before asking again"
    assert _open(leader, ["a", "b"], now=2.0).round == 1, "the same round, reopened"


def test_a_round_nobody_trained_in_twice_in_a_row_is_committed_empty_so_pending_claims_settle() -> None:
    """A site that claimed samples for round 1 and left before its report reached this leader: the
    owners keep the claim pending until round 1 commits, so nobody can train those samples; were
    idle rounds never committed, the run would wait for ever (peer sim seed 348 did)."""
    leader = _leader()
    _open(leader, ["a"])
    assert leader.receive(_report("a", 1), 1.0) == [], "the first idle opening is only reopened"
    assert _open(leader, ["a"], now=2.0).round == 1
    (decide,) = leader.receive(_report("a", 1), 2.5)
    assert isinstance(decide, Decide) and (decide.round, decide.admitted, decide.excluded) == (1, (), ())
    assert "2 openings in a row" in decide.why and "pending" in decide.why
    assert leader.tick(3.0, H, 0, ["a"], b"") == [], "decided: it waits for the commit"
    leader.on_commit(1)
    assert leader.tick(3.0, H, 1, ["a"], b"") == [], "committed empty: the next round waits idle_wait_s"
    _open(leader, ["a"], now=2.5 + CFG.idle_wait_s, committed=1)
    assert leader.receive(_report("a", 2), 4.0) == [], "the count starts again for the next round"


def test_a_silent_idle_round_counts_towards_its_empty_commit_like_a_reported_one() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    assert leader.tick(CFG.deadline_s, H, 0, ["a", "b"], b"") == [], "deadline, no report: reopened later"
    _open(leader, ["a", "b"], now=CFG.deadline_s + CFG.idle_wait_s)
    (decide,) = leader.tick(2 * CFG.deadline_s + CFG.idle_wait_s, H, 0, ["a", "b"], b"")
    assert isinstance(decide, Decide) and decide.admitted == () and decide.why


def test_duplicate_and_stale_reports_are_ignored() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    assert leader.receive(_report("a", 0, SampleRange(10, 0, 4)), 1.0) == []
    assert leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 1.0) == []
    assert leader.receive(_report("a", 1, SampleRange(11, 0, 4)), 1.0) == [], "the first report of a site counts"
    (decide,) = leader.receive(_report("b", 1, SampleRange(12, 0, 4)), 1.0)
    assert [c.ranges for c in decide.admitted] == [(SampleRange(10, 0, 4),), (SampleRange(12, 0, 4),)]


def test_step_down_abandons_the_open_round() -> None:
    leader = _leader()
    _open(leader, ["a"])
    leader.step_down()
    assert leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 1.0) == []
    assert _open(leader, ["a"], now=1.0).round == 1


def test_data_epochs_done_reports_once_and_opens_nothing() -> None:
    ledger = EpochLedger(UNIVERSE)
    leader = RoundLeader(RoundsConfig(2, 2, 5.0, data_epochs=1), ledger)
    ledger.apply(1, [(SiteId("a"), tuple(SampleRange(b, 0, n) for b, n in UNIVERSE.items()))])
    leader.on_commit(1)
    assert leader.done
    assert leader.tick(0.0, H, 1, ["a"], b"") == [EpochComplete(20, 1, RunComplete(H, 1))]
    assert leader.tick(1.0, H, 1, ["a"], b"") == []


def test_a_site_that_reported_then_died_is_dropped_at_once_not_at_the_deadline() -> None:
    """Issue 13: kill -9 of a contributor right after its report. The clock is manual: the decision
    comes when the survivors' reports are in, long before the 5 s deadline, without the dead site."""
    leader = _leader()
    _open(leader, ["a", "b", "c"])
    assert leader.receive(_report("c", 1, SampleRange(12, 0, 4)), 0.5) == []
    assert leader.tick(1.0, H, 0, ["a", "b"], b"") == [], "c dead, but a and b are still training"
    leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 1.2)
    (decide,) = leader.receive(_report("b", 1, SampleRange(11, 0, 4)), 1.4)
    assert isinstance(decide, Decide) and [c.site for c in decide.admitted] == ["a", "b"]
    assert reasons(decide)["c"] == "excluded: c is dead (membership), its reported pseudo-gradient cannot be fetched"


# What happened to site c in round 1 before membership said it is up again -> whether the leader
# sends c the open again. c is one of a, b, c; the open was broadcast at t=0 (deadline 5 s).
MEMBER_UP = [
    ("nothing: its open went to a process that is gone", True),
    ("reported samples", False),
    ("reported it trained nothing", False),
    ("declared dead meanwhile (the round no longer waits for it)", False),
    ("the round was decided", False),
    ("the leader stepped down", False),
]


@pytest.mark.parametrize("before,resent", MEMBER_UP, ids=[b for b, _ in MEMBER_UP])
def test_a_site_back_up_that_the_open_round_waits_for_is_sent_the_open_again(before: str, resent: bool) -> None:
    """Issue 13 (test_resync): the open of round 9 reached a site that was restarting; the leader
    waited out the 120 s deadline for a report from a site that had never heard of the round."""
    leader = _leader()
    msg = _open(leader, ["a", "b", "c"])
    if before.startswith("reported samples"):
        leader.receive(_report("c", 1, SampleRange(12, 0, 4)), 0.5)
    elif before.startswith("reported it trained"):
        leader.receive(_report("c", 1), 0.5)
    elif before.startswith("declared dead"):
        leader.member_down("c", 0.5)
    elif before.startswith("the round was decided"):
        leader.tick(CFG.deadline_s, H, 0, ["a", "b", "c"], b"")
    elif before.startswith("the leader stepped"):
        leader.step_down()
    got = leader.member_up("c", 1.0)
    if not resent:
        assert got == []
        return
    (send,) = got
    assert send == SendOpen("c", msg, "round 1: c came back up and has not reported; sending it the open again "
                                      "(4.0 s to the deadline)")
    assert leader.member_up("z", 1.0) == [], "a site that joined after the open is not in the round"
    assert leader.tick(1.0, H, 0, ["a", "b", "c"], b"") == [], "a resend changes no deadline"


def test_member_down_decides_when_the_dead_site_was_the_last_one_waited_for() -> None:
    leader = _leader()
    _open(leader, ["a", "b", "c"])
    leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 0.2)
    assert leader.receive(_report("b", 1, SampleRange(11, 0, 4)), 0.3) == [], "c has not reported"
    assert leader.member_down("z", 0.4) == [], "not in the round"
    (decide,) = leader.member_down("c", 0.5)  # membership event, no tick needed
    assert [c.site for c in decide.admitted] == ["a", "b"]
    assert reasons(decide)["c"] == "excluded: c did not report (membership declared it dead or left)"
    assert kinds(decide)["c"] is ExclusionKind.DEPARTED


def test_member_down_after_its_report_drops_it_when_the_others_come_in() -> None:
    leader = _leader()
    _open(leader, ["a", "c"])
    leader.receive(_report("c", 1, SampleRange(12, 0, 4)), 0.1)
    assert leader.member_down("c", 0.2) == [], "a is still training"
    (decide,) = leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 0.3)
    assert [c.site for c in decide.admitted] == ["a"] and "c is dead" in reasons(decide)["c"]


def _paced_round(leader: RoundLeader, rnd: int, opened: float, delays: dict[str, float]) -> RoundOpen:
    """Opens round `rnd` at `opened`; each site reports `delays[site]` seconds later (in that order)."""
    msg = _open(leader, sorted(delays), now=opened, committed=rnd - 1)
    for i, (site, delay) in enumerate(sorted(delays.items(), key=lambda kv: kv[1])):
        leader.receive(_report(site, rnd, SampleRange(10 + i % 2, 0, 1)), opened + delay)
    leader.on_commit(rnd)
    return msg


def test_an_adaptive_deadline_follows_the_sites_pace_and_stays_under_the_fixed_one() -> None:
    cfg = RoundsConfig(inner_steps=2, samples_per_step=2, deadline_s=300.0, deadline_k=4.0, deadline_slack_s=1.0)
    leader = RoundLeader(cfg, EpochLedger(UNIVERSE))
    first = _paced_round(leader, 1, 0.0, {"a": 10.0, "b": 12.0})
    assert first.deadline_s == 300.0, "no pace measured yet: the configured deadline"
    _paced_round(leader, 2, 100.0, {"a": 10.0, "b": 14.0})
    # delays 10, 12, 10, 14: median 11, MAD 1 -> 11 + 4 x 1 + 1 s of slack.
    assert _open(leader, ["a", "b"], now=200.0, committed=2).deadline_s == 16.0
    # A slow mesh never gets a deadline above the configured one.
    slow = RoundLeader(dataclasses.replace(cfg, deadline_s=12.0), EpochLedger(UNIVERSE))
    _paced_round(slow, 1, 0.0, {"a": 10.0, "b": 11.0})
    _paced_round(slow, 2, 100.0, {"a": 30.0, "b": 40.0})
    assert _open(slow, ["a", "b"], now=200.0, committed=2).deadline_s == 12.0


def test_a_site_that_missed_the_adaptive_deadline_is_excluded_alone_and_its_late_report_counts() -> None:
    cfg = RoundsConfig(inner_steps=2, samples_per_step=2, deadline_s=300.0, deadline_k=2.0, deadline_slack_s=0.0,
                       pace_rounds=2)
    leader = RoundLeader(cfg, EpochLedger(UNIVERSE))
    _paced_round(leader, 1, 0.0, {"a": 10.0, "b": 10.0})
    _paced_round(leader, 2, 100.0, {"a": 10.0, "b": 10.0})
    msg = _open(leader, ["a", "b"], now=200.0, committed=2)
    assert msg.deadline_s == 10.0
    leader.receive(_report("a", 3, SampleRange(10, 0, 1)), 205.0)
    (decide,) = leader.tick(210.0, H, 2, ["a", "b"], b"base")
    assert isinstance(decide, Decide) and [c.site for c in decide.admitted] == ["a"]
    assert decide.excluded == (Exclusion("b", ExclusionKind.NO_REPORT, "excluded: b did not report (deadline passed)"),)
    # b's report comes in late: its pace (40 s) still moves the next deadline up.
    assert leader.receive(_report("b", 3, SampleRange(11, 0, 1)), 240.0) == []
    leader.on_commit(3)
    # The last 2 rounds' delays: 10, 10 (round 2), 5, 40 (round 3): median 10, MAD 2.5 -> 15.
    assert _open(leader, ["a", "b"], now=300.0, committed=3).deadline_s == 15.0


def test_a_time_boxed_round_carries_its_budget_to_every_site() -> None:
    cfg = dataclasses.replace(CFG, budget_s=30.0)
    assert _open(RoundLeader(cfg, EpochLedger(UNIVERSE)), ["a"]).budget_s == 30.0
    assert _open(_leader(), ["a"]).budget_s == 0.0
    with pytest.raises(ValueError, match="budget_s"):
        RoundsConfig(inner_steps=2, samples_per_step=2, deadline_s=5.0, budget_s=-1.0)


def test_the_first_round_waits_for_start_sites_and_later_rounds_do_not() -> None:
    leader = RoundLeader(dataclasses.replace(CFG, start_sites=3), EpochLedger(UNIVERSE))
    assert leader.tick(0.0, H, 0, ["a", "b"], b"base") == [], "two of the three sites the run starts with"
    assert _open(leader, ["a", "b", "c"], now=1.0).round == 1
    leader.on_commit(1)
    assert _open(leader, ["a"], now=2.0, committed=1).round == 2, "once started, any number of sites"
    successor = RoundLeader(dataclasses.replace(CFG, start_sites=3), EpochLedger(UNIVERSE))
    successor.opened_elsewhere()  # it followed the leader that opened round 1, then a site died
    assert _open(successor, ["a", "b"], now=3.0).round == 1, "a new leader reopens the run's first round"
    with pytest.raises(ValueError, match="start_sites"):
        dataclasses.replace(CFG, start_sites=0)


FAILED, UNVOUCHED, TRAINED = "every report failed", "every report unvouched", "trained"


@pytest.mark.parametrize("outcomes, waits", [
    # Issue #38: every site's training failed at once (blocks of another data config), and each
    # empty commit opened the next round at once: 976 empty rounds in 85 s. Now 1, 2, 4, 8, 8 ... s.
    ([FAILED] * 6, [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]),
    ([UNVOUCHED] * 3, [1.0, 2.0, 4.0]),
    ([FAILED, FAILED, TRAINED, FAILED], [1.0, 2.0, 0.0, 1.0]),  # a round that admits anything resets it
    ([TRAINED, TRAINED], [0.0, 0.0]),
])
def test_a_round_that_admits_nothing_opens_the_next_on_a_growing_deadline_not_at_once(
        outcomes: list[str], waits: list[float]) -> None:
    leader = _leader()
    now, committed = 0.0, 0
    for outcome, wait in zip(outcomes, waits, strict=True):
        rnd = committed + 1
        assert leader.next_deadline() <= now, f"round {rnd} is due"
        _open(leader, ["a", "b"], now=now, committed=committed)
        now += 0.05  # the reports come back at once: training failed before its first step
        reports = [_report(s, rnd, SampleRange(b, 0, 4), tokens=0 if outcome == FAILED else 64,
                           vouched=outcome != UNVOUCHED) for s, b in (("a", 10), ("b", 11))]
        (decide,) = leader.receive(reports[0], now) + leader.receive(reports[1], now)
        assert isinstance(decide, Decide) and bool(decide.admitted) == (outcome == TRAINED), outcome
        assert (f"opens in {wait:.1f} s" in decide.why) if wait else decide.why == ""
        leader.on_commit(rnd)
        committed = rnd
        if wait:
            assert leader.next_deadline() == pytest.approx(now + wait), "a deadline, not a poll"
            assert leader.tick(now + wait - 0.01, H, committed, ["a", "b"], b"") == [], "not before it"
        now += wait


def test_the_wait_after_rounds_that_admit_nothing_is_bounded_by_idle_wait_max_s() -> None:
    leader = RoundLeader(dataclasses.replace(CFG, idle_wait_s=0.5, idle_wait_max_s=3.0), EpochLedger(UNIVERSE))
    assert [leader.empty_wait_s(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert leader.empty_wait_s(10_000) == 3.0
    with pytest.raises(ValueError, match="idle_wait_max_s"):
        dataclasses.replace(CFG, idle_wait_max_s=0.5)


def test_next_deadline_names_every_moment_tick_acts_on_its_own() -> None:
    """The node ticks the leader only at next_deadline() and after events (a report, a commit, a
    membership change): every decision tick takes by the clock alone must be reported there."""
    inf = float("inf")
    leader = _leader()
    assert leader.next_deadline() == -inf, "nothing open yet: open now"
    assert leader.tick(0.0, H, 0, [], b"") == [] and leader.next_deadline() == inf, \
        "no live site: only a membership change helps"
    _open(leader, ["a", "b"], now=1.0)
    assert leader.next_deadline() == 1.0 + CFG.deadline_s, "open: its deadline"
    leader.receive(_report("a", 1), 2.0)
    leader.receive(_report("b", 1), 2.0)  # both idle: dropped, asked again after idle_wait_s
    assert leader.next_deadline() == 2.0 + CFG.idle_wait_s
    _open(leader, ["a", "b"], now=3.0)
    (decide,) = leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 4.0) + leader.receive(
        _report("b", 1, SampleRange(11, 0, 4)), 4.0)
    assert isinstance(decide, Decide) and leader.next_deadline() == inf, "decided: the commit is the event"
    leader.on_commit(1)
    assert leader.next_deadline() <= 4.0, "committed: open the next round now"


def test_empty_rounds_are_proposed_by_the_leader_alone_at_their_interval() -> None:
    """Without a trainer (`--round-interval`): a follower has no deadline at all (it used to report
    a past one and spin), the leader one round per interval on the last weights."""
    from peer.core.rounds import EmptyRounds

    empty = EmptyRounds(0.5)
    assert empty.next_deadline(leading=False) == float("inf")
    assert empty.tick(3.0, False, 4, b"w") is None
    assert empty.next_deadline(leading=True) <= 3.0
    commit = empty.tick(3.0, True, 4, b"w")
    assert commit is not None and (commit.round, commit.contributors, commit.weights_hash) == (5, (), b"w")
    assert empty.next_deadline(leading=True) == 3.5 and empty.tick(3.4, True, 5, b"w") is None
    assert EmptyRounds(0.0).next_deadline(leading=True) == float("inf")


def test_a_leaving_leaders_round_with_no_other_report_is_committed_not_dropped_as_idle() -> None:
    """Seed 101 of the whole-peer simulator: the leaving leader withdrew before its own report came,
    everyone else trained nothing, and the round was dropped as idle; the leader's claims (and its
    leave, waiting for that commit) then waited for a reopen that a leaving leader never makes."""
    leader = _leader()
    _open(leader, ["a", "b"])
    leader.receive(_report("b", 1), 0.5)
    (decide,) = leader.withdraw("a", 1.0)
    assert decide == Decide(1, (), (), "round 1: a leads it and is leaving; committing it without contributors "
                                       "so that its claims settle")


def test_a_leader_that_may_not_open_still_closes_its_open_round_at_the_deadline() -> None:
    leader = _leader()
    _open(leader, ["a", "b"])
    leader.receive(_report("a", 1, SampleRange(10, 0, 4)), 1.0)
    assert leader.tick(CFG.deadline_s - 0.1, H, 0, ["a", "b"], b"", open_new=False) == []
    (decide,) = leader.tick(CFG.deadline_s, H, 0, ["a", "b"], b"", open_new=False)
    assert isinstance(decide, Decide) and [c.site for c in decide.admitted] == ["a"]
    leader.on_commit(1)
    assert leader.tick(CFG.deadline_s + 1, H, 1, ["a", "b"], b"", open_new=False) == [], "opens nothing"


def test_a_new_leader_starts_from_the_round_lengths_it_saw_not_the_fixed_deadline() -> None:
    """A peer that comes to lead has no report delays of its own: the lengths of the rounds it saw
    as a follower (open to commit) set its first deadlines; without them it waits deadline_s."""
    cfg = RoundsConfig(inner_steps=2, samples_per_step=2, deadline_s=300.0, deadline_k=4.0, deadline_slack_s=1.0)
    leader = RoundLeader(cfg, EpochLedger(UNIVERSE))
    for rnd, seconds in ((1, 3.0), (2, 4.0), (3, 3.0), (4, 5.0)):
        leader.observed(rnd, seconds)
        leader.on_commit(rnd)
    # lengths 3, 4, 3, 5: median 3.5, MAD 0.5 -> 3.5 + 4 x 0.5 + 1 s of slack.
    assert _open(leader, ["a", "b"], now=50.0, committed=4).deadline_s == 6.5
    assert _open(RoundLeader(cfg, EpochLedger(UNIVERSE)), ["a", "b"], committed=4).deadline_s == 300.0
