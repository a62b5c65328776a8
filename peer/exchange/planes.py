"""The exchange's data planes by name, and which one a fetch from a peer takes next.

Loads without torch or grpc, for the run file and the command line.
"""

from __future__ import annotations

PLANES = ("bulk", "grpc")
DEFAULT_PLANE = "bulk"
"""Chunks move over the bulk data plane where the peer offers one (docs/decisions/exchange-bulk-plane.md)."""

BULK_MISSES = 2
"""Bulk connections in a row that fail before their first frame, after which a client fetches over
FetchChunks: one can be a passing fault, two say the port cannot be reached from here (a firewall,
NAT, a listener of another address family) while gRPC, which gave the ticket, can."""


class PlaneChoice:
    """The plane the next fetch from one peer takes: "bulk" while its bulk plane can be reached,
    "grpc" (FetchChunks) from when it cannot, for good. Told what happened; does no I/O.
    ExchangeClient asks it before each attempt and tells it how each bulk connection went."""

    def __init__(self, plane: str = DEFAULT_PLANE) -> None:
        if plane not in PLANES:
            raise ValueError(f"exchange plane {plane!r}: choose one of {', '.join(PLANES)}")
        self.plane = plane
        self.misses = 0
        """Bulk connections in a row that failed before their first frame."""

    def bulk_reached(self, reached: bool) -> str | None:
        """The outcome of one bulk connection: `reached` if its first frame arrived."""
        self.misses = 0 if reached else self.misses + 1
        if self.misses >= BULK_MISSES and self.plane == "bulk":
            self.plane = "grpc"
            return f"{self.misses} connections in a row failed before their first frame"
        return None

    def no_bulk_plane(self) -> None:
        """The peer offers no bulk plane (OpenBulk refused)."""
        self.plane = "grpc"
