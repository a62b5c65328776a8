"""Rendezvous hashing: owners, replica width, minimal movement on membership changes."""

from __future__ import annotations

import pytest

from peer.core.ring import REPLICAS, RingView, moved, quorum

BLOCKS = list(range(5000, 7000))


def view(version: int, *members: str) -> RingView:
    return RingView.of(version, members)


def test_owners_are_deterministic_distinct_and_sorted_by_score() -> None:
    a, b = view(1, "a", "b", "c", "d", "e"), view(9, "e", "d", "c", "b", "a")
    for blk in BLOCKS[:200]:
        owners = a.owners(blk)
        assert owners == b.owners(blk)  # independent of version and input order
        assert len(owners) == REPLICAS == len(set(owners))
        assert a.primary(blk) == owners[0]


@pytest.mark.parametrize("members,width", [((), 0), (("a",), 1), (("a", "b"), 2), (("a", "b", "c", "d"), 3)])
def test_width_is_r_or_all_members_when_fewer(members: tuple[str, ...], width: int) -> None:
    v = view(1, *members)
    assert v.width == width
    assert all(len(v.owners(b)) == width for b in BLOCKS[:50])


def test_removing_a_member_moves_only_its_blocks_and_keeps_relative_order() -> None:
    before = view(1, "a", "b", "c", "d", "e", "f")
    after = view(2, "a", "b", "c", "d", "f")
    for blk in BLOCKS:
        ob, oa = before.owners(blk), after.owners(blk)
        if "e" not in ob:
            assert ob == oa
        else:
            # the survivors keep their order, the next-best member fills the last place
            assert oa[: len(ob) - 1] == tuple(m for m in ob if m != "e")


def test_adding_a_member_takes_only_blocks_where_it_ranks_in_the_top_r() -> None:
    before = view(1, "a", "b", "c", "d", "e")
    after = view(2, "a", "b", "c", "d", "e", "new")
    for blk in BLOCKS:
        if "new" not in after.owners(blk):
            assert before.owners(blk) == after.owners(blk)


def test_movement_is_about_r_over_n_of_the_blocks() -> None:
    members = [f"s{i}" for i in range(10)]
    before, after = RingView.of(1, members), RingView.of(2, members[:-1])
    sets, primaries = moved(before, after, BLOCKS)
    # s9 owns about R/N = 30% of the blocks (as primary about 10%); nothing else moves
    assert 0.25 * len(BLOCKS) < sets < 0.35 * len(BLOCKS)
    assert 0.07 * len(BLOCKS) < primaries < 0.13 * len(BLOCKS)
    assert sets == sum(1 for b in BLOCKS if "s9" in before.owners(b))


def test_load_is_balanced_without_virtual_nodes() -> None:
    v = RingView.of(1, [f"s{i}" for i in range(8)])
    load: dict[str, int] = {}
    for blk in BLOCKS:
        p = v.primary(blk)
        assert p is not None
        load[p] = load.get(p, 0) + 1
    mean = len(BLOCKS) / 8
    assert all(0.8 * mean < n < 1.2 * mean for n in load.values()), load


def test_quorum_is_a_strict_majority() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_members_must_be_sorted_and_unique() -> None:
    with pytest.raises(ValueError):
        RingView(1, ("b", "a"))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RingView(1, ("a", "a"))  # type: ignore[arg-type]
