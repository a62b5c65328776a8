"""The exchange's data planes by name, for the run file and the command line without torch or grpc."""

PLANES = ("bulk", "grpc")
DEFAULT_PLANE = "bulk"
"""Chunks move over the bulk data plane where the peer offers one (docs/decisions/exchange-bulk-plane.md)."""
