"""Why a leader leaves a site out of a round: a kind to count and act on, and a reason to read.

The kind is what metrics label (`sitemesh_rounds_excluded_total{reason=...}`) and what tests and
the simulator branch on; the reason is the sentence for operators and names blocks and samples.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class ExclusionKind(enum.Enum):
    NO_REPORT = "no_report"
    """The site was expected and did not report before the round's deadline."""
    DEPARTED = "departed"
    """Membership declared the site dead or left before its pseudo-gradient could be fetched."""
    LEAVING_LEADER = "leaving_leader"
    """The leader itself is leaving: nobody would hold its pseudo-gradient once it is gone."""
    TRAINING_FAILED = "training_failed"
    """The site reported samples without a pseudo-gradient (its training failed)."""
    NOT_LEASED = "not_leased"
    """Samples it named were not leased to it for the round (no voucher covers them)."""
    ALREADY_COMMITTED = "already_committed"
    """Samples it named are committed already in this data epoch."""
    DUPLICATE = "duplicate"
    """Samples it named are included in this round from another site."""
    WRONG_ROUND = "wrong_round"
    """The contribution is for another round."""
    INVALID = "invalid"
    """Anything else no honest site sends: samples outside the data set or named twice, a voucher
    that does not check out, more tokens than its samples hold."""


class Exclusion(NamedTuple):
    site: str
    kind: ExclusionKind
    reason: str
