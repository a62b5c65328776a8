"""Transmit-limited rumour queue: invalidation, least-sent first, retirement after the limit."""

from __future__ import annotations

from peer.core.broadcast import BroadcastQueue


def test_newer_rumour_about_the_same_member_replaces_the_old_one() -> None:
    q: BroadcastQueue[str] = BroadcastQueue()
    q.push("b", "b suspect@1")
    q.push("c", "c alive@0")
    q.push("b", "b alive@2")
    assert len(q) == 2
    assert sorted(q.take(10, 5)) == ["b alive@2", "c alive@0"]


def test_least_transmitted_then_newest_go_first() -> None:
    q: BroadcastQueue[str] = BroadcastQueue()
    for key in "abc":
        q.push(key, key)
    assert q.take(1, 5) == ["c"]  # all unsent: newest first
    assert q.take(2, 5) == ["b", "a"]  # still unsent before the one sent once
    q.push("d", "d")
    assert q.take(1, 5) == ["d"]
    assert q.pending() == ["d", "c", "b", "a"]  # all sent once now: newest first


def test_rumour_retires_after_the_transmit_limit() -> None:
    q: BroadcastQueue[str] = BroadcastQueue()
    q.push("a", "a")
    sent = [q.take(8, 3) for _ in range(5)]
    assert sent == [["a"], ["a"], ["a"], [], []]
    assert len(q) == 0


def test_take_respects_the_per_message_cap() -> None:
    q: BroadcastQueue[int] = BroadcastQueue()
    for i in range(20):
        q.push(str(i), i)
    assert len(q.take(8, 4)) == 8
    assert q.take(0, 4) == []
    assert len(q) == 20
