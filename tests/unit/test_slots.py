"""The connection slot table (peer/transport/slots.py), with a manual clock.

    .venv/bin/python -m pytest tests/unit/test_slots.py -q
"""

from __future__ import annotations

import math

import pytest

from peer.transport.slots import Close, Kind, SlotLimits, Slots, address_key

SMALL = SlotLimits(total=10, pending_total=4, pending_per_address=2, identify_s=5.0, per_site=3, others_total=3,
                   per_other=2)


def test_pending_connections_give_way_oldest_first_per_address_then_in_total() -> None:
    slots = Slots(SMALL)
    assert slots.admit(0, "1.1.1.1", 0.0).closes == ()
    assert slots.admit(1, "1.1.1.1", 1.0).closes == ()
    third = slots.admit(2, "1.1.1.1", 2.0)
    assert third.admitted and [(c.conn, c.cause, c.who) for c in third.closes] == [(0, "pending per address", "1.1.1.1")]
    assert "1.1.1.1 has 2 connections that made no call yet" in third.closes[0].reason
    slots.admit(3, "2.2.2.2", 3.0)
    slots.admit(4, "3.3.3.3", 3.0)
    fifth = slots.admit(5, "4.4.4.4", 4.0)  # 4 pending of all addresses: the oldest (1) goes
    assert [(c.conn, c.cause, c.who) for c in fifth.closes] == [(1, "pending", "1.1.1.1")]
    assert slots.holding() == {"pending": 4, "site": 0, "other": 0}


def test_a_connection_with_no_call_within_identify_s_expires() -> None:
    slots = Slots(SMALL)
    slots.admit(0, "1.1.1.1", 0.0)
    slots.admit(1, "2.2.2.2", 2.0)
    assert slots.next_deadline() == 5.0
    assert slots.expire(4.9) == []
    assert [c.conn for c in slots.expire(5.0)] == [0]
    assert slots.next_deadline() == 7.0
    assert slots.identify(1, Kind.SITE, "b") is None
    assert slots.next_deadline() == math.inf and slots.expire(100.0) == []


@pytest.mark.parametrize(("kind", "names", "refused"), [
    # A site: per_site (3) of one name; the others are unbounded but by the total.
    (Kind.SITE, ["b", "b", "b", "b", "c"], [3]),
    # Plaintext callers (no name): no bound per site.
    (Kind.SITE, ["", "", "", "", ""], []),
    # A reader: per_other (2) of one identity; then others_total (3) of all together.
    (Kind.OTHER, ["reader bob", "reader bob", "reader bob", "operator olga", "operator oscar"], [2, 4]),
])
def test_identified_connections_are_bounded_by_identity(kind: Kind, names: list[str], refused: list[int]) -> None:
    slots = Slots(SlotLimits(total=20, pending_total=8, pending_per_address=8, per_site=3, others_total=3,
                             per_other=2))
    out: list[Close | None] = []
    for conn, name in enumerate(names):
        slots.admit(conn, "1.1.1.1", 0.0)
        out.append(slots.identify(conn, kind, name))
    assert [i for i, close in enumerate(out) if close is not None] == refused
    assert len(slots) == len(names) - len(refused)  # refused ones are no longer counted


def test_the_reasons_name_the_bound() -> None:
    slots = Slots(SlotLimits(total=20, pending_total=8, pending_per_address=8, per_site=1, others_total=2,
                             per_other=1))
    for conn in range(5):
        slots.admit(conn, "1.1.1.1", 0.0)
    assert slots.identify(0, Kind.SITE, "b") is None
    assert slots.identify(1, Kind.SITE, "b") == Close(1, "per site", "b", "site b holds 1 connections here, the most "
                                                                         "one site may")
    assert slots.identify(2, Kind.OTHER, "reader bob") is None
    assert slots.identify(3, Kind.OTHER, "reader bob") == Close(
        3, "per identity", "reader bob", "reader bob holds 1 connections here, the most one operator or reader may")
    assert slots.identify(4, Kind.OTHER, "operator olga") is None
    slots.admit(5, "1.1.1.1", 0.0)
    assert slots.identify(5, Kind.OTHER, "reader eve") == Close(
        5, "others", "reader eve", "operators and readers hold 2 connections here, the most they may together "
                                   "(the rest is the sites')")


def test_sites_keep_their_share_when_everyone_else_holds_all_they_may() -> None:
    """Others and pending connections at their bounds leave site_share for sites; past the total a
    new connection pushes out a pending one, and only when every one has called is it refused."""
    limits = SlotLimits(total=10, pending_total=4, pending_per_address=4, others_total=3, per_other=3)
    slots = Slots(limits)
    conn = 0
    for _ in range(3):
        slots.admit(conn, "6.6.6.6", 0.0)
        assert slots.identify(conn, Kind.OTHER, "reader bob") is None
        conn += 1
    for _ in range(10):  # a flood of connections that never call: at most 4 stay
        slots.admit(conn, "6.6.6.6", 0.0)
        conn += 1
    assert slots.holding() == {"pending": 4, "site": 0, "other": 3}
    assert limits.site_share == 3
    while len(slots) < limits.total:  # sites come: the first pushes out a pending one (pending_total)
        assert slots.admit(conn, "7.7.7.7", 1.0).admitted
        assert slots.identify(conn, Kind.SITE, f"s{conn}") is None
        conn += 1
    assert slots.holding() == {"pending": 3, "site": 4, "other": 3}
    full = slots.admit(conn, "7.7.7.7", 1.0)  # at the total a pending one gives way
    assert full.admitted and full.closes[0].cause == "total" and full.closes[0].who == "6.6.6.6"
    assert slots.identify(conn, Kind.SITE, f"s{conn}") is None
    conn += 1
    while slots.holding()["pending"]:
        slots.admit(conn, "7.7.7.7", 1.0)
        slots.identify(conn, Kind.SITE, f"s{conn}")
        conn += 1
    assert slots.holding() == {"pending": 0, "site": 7, "other": 3}
    refused = slots.admit(conn, "7.7.7.7", 1.0)  # every one has called: the new one is refused
    assert not refused.admitted and refused.closes[0].conn == conn and refused.closes[0].cause == "total"


def test_release_gives_the_slot_back_once() -> None:
    slots = Slots(SMALL)
    slots.admit(0, "1.1.1.1", 0.0)
    slots.identify(0, Kind.OTHER, "reader bob")
    slots.release(0)
    slots.release(0)
    assert len(slots) == 0 and slots.held_by(Kind.OTHER, "reader bob") == 0
    slots.admit(1, "1.1.1.1", 0.0)
    slots.release(1)
    assert slots.next_deadline() == math.inf


@pytest.mark.parametrize(("host", "key"), [
    ("203.0.113.5", "203.0.113.5"),
    ("::ffff:203.0.113.5", "203.0.113.5"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_addresses_are_counted_by_host_and_ipv6_by_64(host: str, key: str) -> None:
    assert address_key(host) == key


@pytest.mark.parametrize("kwargs", [
    {"total": 0}, {"per_other": 9, "others_total": 8}, {"pending_per_address": 200},
    {"pending_total": 400, "others_total": 112}, {"identify_s": 0.0}, {"idle_s": math.inf},
])
def test_limits_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SlotLimits(**kwargs)  # type: ignore[arg-type]
