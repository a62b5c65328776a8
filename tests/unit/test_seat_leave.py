"""The voter seat's half of a graceful leave (peer/core/seat_leave.py): when to say LEFT, when to stop.

    .venv/bin/python -m pytest -q tests/unit/test_seat_leave.py
"""

from __future__ import annotations

from peer.core.seat_leave import SayLeft, SeatLeave, Stop


def _seat(accepted: bool = True, voter: bool = True, leader: bool = False) -> SeatLeave:
    return SeatLeave(accepted, voter, leader, 10.0, leader_wait_s=4.0, follower_wait_s=8.0)


def test_a_leader_says_left_only_once_its_own_removal_committed() -> None:
    seat = _seat(leader=True)
    assert seat.update(10.0, removed=False) == [] and seat.next_deadline(removed=False) == 14.0
    assert seat.update(11.0, removed=True) == [SayLeft(), Stop("its removal from the voters committed")]
    assert seat.update(12.0, removed=True) == [] and seat.next_deadline(removed=True) == float("inf")


def test_a_follower_says_left_at_once_and_stays_until_the_leader_removed_it() -> None:
    """Stopping before the removal commits strands a voter set of two (no majority ever again)."""
    seat = _seat()
    assert seat.update(10.0, removed=False) == [SayLeft()]
    assert seat.update(15.0, removed=False) == [] and seat.next_deadline(removed=False) == 18.0
    assert seat.update(16.0, removed=True) == [Stop("its removal from the voters committed")]


def test_a_removal_that_committed_makes_the_seat_due_at_once() -> None:
    """A removal may commit by a message that no timer follows: the seat is then due now, not at the
    end of its wait (a leaver stopped up to follower_wait_s late in the simulator)."""
    seat = _seat()
    assert seat.update(10.0, removed=False) == [SayLeft()]
    assert seat.next_deadline(removed=True) == float("-inf")
    assert seat.update(11.0, removed=True) == [Stop("its removal from the voters committed")]
    assert seat.next_deadline(removed=True) == float("inf")


def test_each_wait_is_bounded() -> None:
    leader, follower = _seat(leader=True), _seat()
    assert leader.update(14.0, removed=False) == [SayLeft()]
    assert leader.update(22.0, removed=False) == [Stop("its removal did not commit in time; stopping anyway")]
    follower.update(10.0, removed=False)
    assert follower.update(18.0, removed=False) == [Stop("its removal did not commit in time; stopping anyway")]


def test_a_leader_whose_removal_is_late_says_left_and_waits_on_as_a_follower() -> None:
    """Stopping at the leader's deadline would strand the last voter of two whenever the removal had
    not reached it: saying LEFT lets a successor remove this site, and the seat stays until then."""
    seat = _seat(leader=True)
    assert seat.update(14.0, removed=False) == [SayLeft()]
    assert seat.next_deadline(removed=False) == 22.0
    assert seat.update(20.0, removed=False) == []
    assert seat.update(21.0, removed=True) == [Stop("its removal from the voters committed")]
    assert seat.update(30.0, removed=True) == [] and seat.next_deadline(removed=True) == float("inf")


def test_a_site_without_a_seat_or_whose_leave_was_refused_says_left_and_stops() -> None:
    for seat in (_seat(voter=False), _seat(accepted=False, leader=True)):
        assert seat.update(10.0, removed=False) == [SayLeft(), Stop(
            "no removal to wait for (no voter seat, or consensus refused the leave)")]
