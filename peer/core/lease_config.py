"""Timers of the data-lease protocol (DARL), with the presets a run picks from.

The owner (peer/core/leases.py) and the holder (peer/core/lease_client.py) read the same config:
`ttl` on the owner's clock, `renew_every` and `retry_after` on the holder's (docs/leases.md, "Expiry").

    .venv/bin/python -m pytest tests/unit/test_leases.py -q
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseConfig:
    """Timers of the lease protocol."""

    ttl: float = 30.0
    """How long a lease lives without a renewal, on the owner's clock. Long enough to ride out a few
    lost heartbeats and a GC pause; short enough that a dead site's prefetched blocks come back well
    within one round."""
    renew_every: float = 5.0
    """Holder's heartbeat period per owner; ttl / renew_every = 6 heartbeats may be lost in a row."""
    retry_after: float = 2.0
    """Resend an unanswered replication, sync or request after this long (messages may be lost)."""
    max_grant: int = 4
    """Most leases one owner hands to one holder in one reply (the prefetch depth)."""
    max_round_lag: int = 3
    """An owner refuses grants, starts and renewals to a holder whose applied round is more than this
    behind its own: a site cut off from the log (not replicated to) would otherwise keep renewing
    leases it can never contribute, and the epoch would never end. A few rounds: log replication
    lags far less."""
    give_back_faster: float = 1.5
    """At the data epoch's tail an idle site has a holder give a started block's rest back only if
    its pace is above this multiple of the holder's: the hand-over costs the block about a round
    with nobody training it (the holder's claim, then the new grant and start), which only a
    clearly faster site wins back (docs/decisions/leases-give-back-at-the-tail.md). inf: never."""

    def __post_init__(self) -> None:
        if (not 0 < self.renew_every < self.ttl or self.retry_after <= 0 or self.max_grant < 1
                or self.max_round_lag < 1 or not self.give_back_faster >= 1):
            raise ValueError(f"bad lease config {self}")

    @classmethod
    def local_test(cls) -> LeaseConfig:
        """Loopback and the simulator: seconds-scale so that expiry happens within a test."""
        return cls(ttl=6.0, renew_every=1.0, retry_after=0.5, max_grant=3)

    @classmethod
    def lan(cls) -> LeaseConfig:
        """One data centre (and loopback tests of real processes): a dead holder's blocks come back
        in 10 s."""
        return cls(ttl=10.0, renew_every=2.0, retry_after=1.0)

    @classmethod
    def wan(cls) -> LeaseConfig:
        """Sites across the Internet: the defaults."""
        return cls()
