"""The whole round protocol of one peer (peer/core/peer_rounds.py) driven alone: routing and the leave.

Site "a" leads a mesh of a, b and c and owns every block (its lease sends are delivered to itself
at once); b and c are only the round messages the test hands it.

    .venv/bin/python -m pytest -q tests/unit/test_peer_rounds.py
"""

from __future__ import annotations

import dataclasses

from peer.core import events as ev
from peer.core import rounds as r
from peer.core.commitlog import Entry, RoundCommit, VoterChange
from peer.core.election import Epoch, Header, SiteId
from peer.core.lease_log import LeaseLog
from peer.core.lease_types import Send
from peer.core.lease_config import LeaseConfig
from peer.core.peer_rounds import Effect, PeerRounds, Seen
from peer.core.timeline import RoundClock

CONFIG = r.RoundsConfig(inner_steps=2, samples_per_step=8, deadline_s=10.0, gather_s=2.0)
THETA0 = b"theta0"
LIVE = frozenset({"a", "b", "c"})


def _seen(leading: bool = True, epoch: int = 1, leader: str | None = "a") -> Seen:
    return Seen(leading, epoch, 0, 0, THETA0, LIVE, leader=leader)


class Peer:
    def __init__(self) -> None:
        cfg = LeaseConfig.local_test()
        self.rounds = PeerRounds("a", "addr-a", CONFIG, LeaseLog(SiteId("a"), {1000: 64}, cfg, boot=0),
                                 cfg.ttl, RoundClock("a", 0.0), 0, THETA0)
        self.pump(self.rounds.replay([Entry(1, Epoch(0), VoterChange(SiteId("a"), "addr-a", True, "test"))], 0.0), 0.0)

    def pump(self, effects: list[Effect], now: float, seen: Seen | None = None) -> list[Effect]:
        """Delivers the lease sends to this peer's own cores; returns every other effect."""
        out, queue = [], list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, Send):
                queue += self.rounds.lease_message(e.msg, now, seen or _seen())
            else:
                out.append(e)
        return out

    def open_round(self) -> r.RoundOpen:
        t = 0.0
        while t < 0.5:  # the leases start
            self.pump(self.rounds.tick(t, _seen(leading=False)), t)
            t += 0.1
        (broadcast,) = [e for e in self.pump(self.rounds.tick(1.0, _seen()), 1.0) if isinstance(e, r.Broadcast)]
        return broadcast.msg

    def train_and_report(self, msg: r.RoundOpen) -> r.Contribution:
        (train,) = [e for e in self.pump(self.rounds.round_message(msg, 1.0, _seen()), 1.0) if isinstance(e, ev.Train)]
        out = self.pump(self.rounds.handle(ev.TrainDone(1, train.ranges, 160, b"root-a"), 2.0, _seen()), 2.0)
        (send,) = [e for e in out if isinstance(e, ev.SendReport)]
        assert send.leader == "a" and send.contribution.header.epoch == 1, "addressed to the leader, its epoch"
        return send.contribution


def _idle(site: str) -> r.Contribution:
    """`site` trained nothing in round 1 (its samples would need vouchers of a's owner core)."""
    header = Header(SiteId(site), f"addr-{site}", Epoch(1), 0)
    return r.Contribution(header, 1, site, f"addr-{site}", 0, (), b"")


def test_the_leaders_decide_becomes_a_fetch_of_the_admitted_reports_of_live_sites() -> None:
    p = Peer()
    mine = p.train_and_report(p.open_round())
    p.pump(p.rounds.round_message(mine, 2.1, _seen()), 2.1)
    p.pump(p.rounds.round_message(_idle("b"), 2.2, _seen()), 2.2)
    out = p.pump(p.rounds.member_down("c", 2.3, _seen()), 2.3)  # the last one waited for: decide now
    (fetch,) = [e for e in out if isinstance(e, ev.Fetch)]
    assert [c.site for c in fetch.admitted] == ["a"]
    assert [(e.site, e.reason) for e in out if isinstance(e, ev.Excluded)] == [
        ("c", "excluded: c did not report (membership declared it dead or left)")]


def test_a_round_message_of_a_stale_epoch_is_refused_and_says_why() -> None:
    p = Peer()
    out = p.rounds.round_message(_idle("b"), 1.0, _seen(epoch=3))
    assert out == [ev.Note("refused Contribution of round 1 from b: stale epoch 1 < 3")]


def test_only_the_leader_of_this_peers_epoch_may_say_the_run_is_complete() -> None:
    """RunComplete ends a leaving site's wait for its last round: a member that does not lead, or a
    leader this peer does not know yet, must not be able to cut that wait short."""
    p = Peer()
    seen = _seen(leading=False, leader="b")

    def said(site: str, epoch: int) -> r.RunComplete:
        return r.RunComplete(Header(SiteId(site), f"addr-{site}", Epoch(epoch), 4), 4)

    assert p.rounds.round_message(said("c", 1), 1.0, seen) == [ev.Note(
        "refused RunComplete of round 4 from c: not the leader of epoch 1 (b)", warning=True)]
    assert "not the leader of epoch 1" in p.rounds.round_message(said("b", 2), 1.0, seen)[0].text  # type: ignore[union-attr]
    assert p.rounds.core.site._run_complete == 0
    assert p.rounds.round_message(said("b", 1), 1.0, seen) == [ev.Note(
        "the run's data is complete: no round after round 4 opens, and its leader holds θ of it")]
    assert p.rounds.core.site._run_complete == 4


def test_a_leaving_leader_withdraws_its_own_report_from_the_open_round() -> None:
    """Seed 582 of the whole-peer simulator: a leaving leader committed its own pseudo-gradient and
    left; nobody else held it, so θ of that round was on no site that stayed."""
    p = Peer()
    mine = p.train_and_report(p.open_round())
    p.pump(p.rounds.round_message(mine, 2.1, _seen()), 2.1)
    out = p.pump(p.rounds.handle(ev.LeaveRequested(5.0), 2.2, _seen()), 2.2)
    assert not any(isinstance(e, ev.LeaveReady) for e in out), "it waits for the round to settle its claims"
    p.pump(p.rounds.round_message(_idle("b"), 2.3, _seen()), 2.3)
    out = p.pump(p.rounds.member_down("c", 2.4, _seen()), 2.4)
    (fetch,) = [e for e in out if isinstance(e, ev.Fetch)]
    assert fetch.admitted == (), "the round commits without it (and so settles its claims)"
    assert ("a", "excluded: a leads this round and is leaving: once it is gone nobody would hold its "
                 "pseudo-gradient") in [(e.site, e.reason) for e in out if isinstance(e, ev.Excluded)]
    assert not p.rounds.may_open(_seen()), "a leaving peer opens no round"


def test_a_leave_asked_while_the_leader_fetches_its_own_report_drops_it_and_fetches_again() -> None:
    p = Peer()
    mine = p.train_and_report(p.open_round())
    p.pump(p.rounds.round_message(mine, 2.1, _seen()), 2.1)
    p.pump(p.rounds.round_message(_idle("b"), 2.2, _seen()), 2.2)
    (fetch,) = [e for e in p.pump(p.rounds.member_down("c", 2.3, _seen()), 2.3) if isinstance(e, ev.Fetch)]
    out = p.pump(p.rounds.handle(ev.LeaveRequested(5.0), 2.4, _seen()), 2.4)
    assert ev.CancelFetch(1, fetch.attempt) in out
    assert [[c.site for c in e.admitted] for e in out if isinstance(e, ev.Fetch)] == [[]]


def test_member_up_reaches_the_leader_half_only_while_this_peer_leads() -> None:
    p = Peer()
    msg = p.open_round()
    assert not [e for e in p.pump(p.rounds.member_up("b", 1.5, _seen(leading=False)), 1.5)
                if isinstance(e, r.SendOpen)], "a follower sends no open"
    (send,) = [e for e in p.pump(p.rounds.member_up("b", 1.5, _seen()), 1.5) if isinstance(e, r.SendOpen)]
    assert (send.site, send.msg) == ("b", msg)


def test_an_open_sent_again_to_a_site_that_has_it_changes_nothing_there() -> None:
    """The leader cannot know whether the first open reached the site's new process: a spare copy
    must not start the round over (the site would train its samples twice)."""
    p = Peer()
    msg = p.open_round()
    first = p.pump(p.rounds.round_message(msg, 1.0, _seen()), 1.0)
    assert [e for e in first if isinstance(e, ev.Train)]
    again = p.pump(p.rounds.round_message(msg, 1.2, _seen()), 1.2)
    assert again == [ev.Note("round 1: reopened while this site works on it from the same θ; it reports when done")]


def _all_leaving(leading: bool = True) -> Seen:
    return dataclasses.replace(_seen(leading), leaving=frozenset({"b", "c"}))


def test_a_leaving_leader_still_closes_its_open_round_at_the_deadline() -> None:
    """SIGTERM to every site: a report to the leaving leader is lost (c's); no leader that stays
    would reopen the round, so the leaving leader must close it itself, or the sites that reported
    would wait for its commit until their leave waits ran out (seed 11 of the whole-peer simulator)."""
    p = Peer()
    mine = p.train_and_report(p.open_round())
    p.pump(p.rounds.round_message(mine, 2.1, _all_leaving()), 2.1, _all_leaving())
    out = p.pump(p.rounds.handle(ev.LeaveRequested(30.0), 2.2, _all_leaving()), 2.2, _all_leaving())
    assert not any(isinstance(e, ev.LeaveReady) for e in out), "its round holds its samples"
    p.pump(p.rounds.round_message(_idle("b"), 2.3, _all_leaving()), 2.3, _all_leaving())
    assert not p.rounds.may_open(_all_leaving()) and p.rounds.next_deadline(_all_leaving()) <= 11.0
    assert not [e for e in p.pump(p.rounds.tick(10.9, _all_leaving()), 10.9, _all_leaving()) if isinstance(e, ev.Fetch)]
    out = p.pump(p.rounds.tick(11.0, _all_leaving()), 11.0, _all_leaving())
    (fetch,) = [e for e in out if isinstance(e, ev.Fetch)]
    assert fetch.admitted == () and ("c", "excluded: c did not report (deadline passed)") in [
        (e.site, e.reason) for e in out if isinstance(e, ev.Excluded)]
    out = p.pump(p.rounds.handle(ev.OutcomeReady(1, fetch.attempt, b"t1"), 11.2, _all_leaving()), 11.2,
                 _all_leaving())
    (propose,) = [e for e in out if isinstance(e, ev.Propose)]
    out = p.pump(p.rounds.entries([Entry(2, Epoch(1), propose.commit)], 11.3, _all_leaving()), 11.3,
                 _all_leaving())
    assert any(isinstance(e, ev.LeaveReady) for e in out), "committed without its report: nothing to serve"


def test_a_leaving_peer_hears_that_nobody_stays_only_when_every_other_live_member_leaves() -> None:
    p = Peer()
    p.rounds.handle(ev.LeaveRequested(30.0), 0.5, _seen(leading=False))
    assert not p.rounds.core.site._nobody_stays, "b and c stay"
    p.rounds.handle(ev.Tick(), 0.6, _all_leaving(leading=False))
    assert p.rounds.core.site._nobody_stays
    p.rounds.handle(ev.Tick(), 0.7, dataclasses.replace(_all_leaving(leading=False), leaving=frozenset({"b"})))
    assert not p.rounds.core.site._nobody_stays, "c is staying after all"


def test_a_report_goes_to_the_leader_consensus_knows_now_under_its_epoch() -> None:
    """The leader may change while a site trains: the report is addressed when training is done,
    to the leader and epoch of that moment (a successor reopens the same round); with no leader
    known it is not sent."""
    p = Peer()
    (train,) = [e for e in p.pump(p.rounds.round_message(p.open_round(), 1.0, _seen()), 1.0)
                if isinstance(e, ev.Train)]
    done = ev.TrainDone(1, train.ranges, 160, b"root-a")
    now_seen = _seen(leading=False, epoch=3, leader="b")
    out = p.pump(p.rounds.handle(done, 2.0, now_seen), 2.0, now_seen)
    (send,) = [e for e in out if isinstance(e, ev.SendReport)]
    assert (send.leader, send.contribution.header.epoch) == ("b", 3)
    assert not [e for e in out if isinstance(e, ev.Report)], "no report leaves PeerRounds unaddressed"


def test_a_follower_notes_how_long_each_round_of_another_leader_took() -> None:
    """From the open's arrival to the commit: what this peer's first deadlines go by if it leads."""
    p = Peer()
    seen_b = _seen(leading=False, leader="b")
    noted: list[tuple[int, float]] = []
    started: list[bool] = []
    p.rounds.leader.observed = lambda rnd, seconds: noted.append((rnd, seconds))  # type: ignore[method-assign]
    p.rounds.leader.opened_elsewhere = lambda: started.append(True)  # type: ignore[method-assign]
    header = Header(SiteId("b"), "addr-b", Epoch(1), 0)
    p.pump(p.rounds.round_message(r.RoundOpen(header, 1, CONFIG.inner_steps, 10.0, THETA0, 0.0), 1.0, seen_b),
           1.0, seen_b)
    assert started == [True], "the run started: were this peer to lead, it waits for no start_sites"
    p.pump(p.rounds.entries([Entry(2, Epoch(1), RoundCommit(1, (), b"theta1"))], 4.5, seen_b), 4.5, seen_b)
    assert noted == [(1, 3.5)]
