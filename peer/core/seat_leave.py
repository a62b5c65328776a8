"""The voter seat's half of a graceful leave (I8), sans I/O: when to say LEFT and when to stop.

A leave runs the rounds' half first (peer/core/site_round.py: the round holding this site's
samples, every lease given back: `LeaveReady`), then hands the voter seat back through the log
(`ConsensusCore.leave`). What follows depends on what this site was:

- the leader appended its own removal: it waits for that removal to commit, then says LEFT (so the
  rest elect a successor at once) and stops;
- a follower voter cannot remove itself: it says LEFT first (the leader removes a voter when gossip
  reports it LEFT) and stays until that removal commits. A voter that stops before it is removed
  strands a voter set of two (the other can never reach a majority): the whole-peer simulator's
  `leave` fault found it when the leader had just left itself;
- a site that holds no seat, or whose leave consensus refused, says LEFT and stops.

Each wait is bounded (the leader: `leader_wait_s`, room for the commit; a follower:
`follower_wait_s`, room for an election first, since the leader may be the site that left just
before). A leader whose removal has not committed by its deadline (a follower that did not answer
in time, a lease that lapsed under load) does not stop then: stopping strands a voter set of two
whenever the removal never reached the other voter. It says LEFT and waits on as a follower does,
`follower_wait_s` more: as leader it keeps proposing and replicating its removal, and if it lost
the leadership, the successor removes it once gossip reports LEFT. `PeerCore.give_up_seat` starts it and
`PeerCore.tick` updates it; the node and the simulator execute its effects.

    .venv/bin/python -m pytest -q tests/unit/test_seat_leave.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class SayLeft:
    """Effect: tell the members this site leaves (membership gossips LEFT)."""


@dataclass(frozen=True)
class Stop:
    """Effect: the leave is done; the process stops."""

    reason: str


Effect = Union[SayLeft, Stop]


class SeatLeave:
    """One graceful leave's seat half, from `ConsensusCore.leave`'s answer to the process stopping."""

    def __init__(self, accepted: bool, voter: bool, leader: bool, now: float, leader_wait_s: float,
                 follower_wait_s: float) -> None:
        self._removal = accepted and voter
        """Whether there is a removal from the voters to wait for."""
        self._say_first = not (self._removal and leader)
        """Say LEFT at once (a follower, a site without a seat), or only once the wait is over (the leader)."""
        self._until = now + (0.0 if not self._removal else leader_wait_s if leader else follower_wait_s)
        self._follower_wait_s = follower_wait_s
        self._said = False
        self._done = False

    def next_deadline(self, removed: bool) -> float:
        """When `update` has something to do: at once once the removal committed (it may have
        committed by a message, which no timer follows), else at the end of the wait."""
        if self._done:
            return float("inf")
        return float("-inf") if removed and self._removal else self._until

    def update(self, now: float, removed: bool) -> list[Effect]:
        """Call at the start and whenever the node handled something; `removed`: this site is no
        longer a voter and the log's last entry (its removal) is committed."""
        if self._done:
            return []
        over = not self._removal or removed or now >= self._until
        out: list[Effect] = []
        if not self._said and (self._say_first or over):
            self._said = True
            out.append(SayLeft())
            if not self._say_first and not removed:  # the leader's wait ran out: on as a follower's
                self._until = now + self._follower_wait_s
                return out
        if over:
            self._done = True
            if not self._removal:
                out.append(Stop("no removal to wait for (no voter seat, or consensus refused the leave)"))
            elif removed:
                out.append(Stop("its removal from the voters committed"))
            else:
                out.append(Stop("its removal did not commit in time; stopping anyway"))
        return out
