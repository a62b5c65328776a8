"""The plane choice: bulk while a peer's bulk plane can be reached, gRPC FetchChunks for good after
BULK_MISSES connections in a row fail before their first frame, or when the peer offers none."""

from __future__ import annotations

import pytest

from peer.exchange.planes import BULK_MISSES, PlaneChoice


@pytest.mark.parametrize(
    ("start", "outcomes", "plane", "moved_at"),
    [
        ("bulk", [True, True, True], "bulk", None),
        ("bulk", [False, True, False, True], "bulk", None),  # misses must come in a row
        ("bulk", [False] * BULK_MISSES, "grpc", BULK_MISSES - 1),
        ("bulk", [False] * BULK_MISSES + [True], "grpc", BULK_MISSES - 1),  # for good
        ("grpc", [False] * (BULK_MISSES + 1), "grpc", None),  # already there: nothing to say
    ],
)
def test_bulk_outcomes(start: str, outcomes: list[bool], plane: str, moved_at: int | None) -> None:
    choice = PlaneChoice(start)
    reasons = [choice.bulk_reached(reached) for reached in outcomes]
    assert choice.plane == plane
    assert [i for i, r in enumerate(reasons) if r is not None] == ([] if moved_at is None else [moved_at])
    if moved_at is not None:
        assert reasons[moved_at] == f"{BULK_MISSES} connections in a row failed before their first frame"


def test_a_peer_without_a_bulk_plane_is_fetched_over_grpc() -> None:
    choice = PlaneChoice("bulk")
    choice.no_bulk_plane()
    assert choice.plane == "grpc"


def test_unknown_plane_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="choose one of bulk, grpc"):
        PlaneChoice("udp")
