"""One peer's round logic, sans I/O: the site's half, the leader's fetch, and applying the log.

`RoundCore` hands every event to its three parts (peer/core/site_round.py, decision.py, apply.py)
and returns their effects in that order; `next_deadline()` is the earliest of theirs. An applied
round also reaches the site's half (θ_{r-1} is what the next open waits for). Every `Note` the
parts return is kept, newest last, in `reasons` (so `ops status` and tests can say why a round was
skipped or a contribution excluded).

    .venv/bin/python -m pytest -q tests/unit/test_site_round.py
"""

from __future__ import annotations

from collections import deque

from peer.core import events as ev
from peer.core.apply import ApplyQueue
from peer.core.decision import Decision
from peer.core.site_round import SiteRound

REASONS_KEPT = 64


class RoundCore:
    def __init__(self, site: SiteRound) -> None:
        self.site = site
        self.decision = Decision(site.site)
        self.applier = ApplyQueue(site.applied_round)
        self.reasons: deque[str] = deque(maxlen=REASONS_KEPT)

    @property
    def last_reason(self) -> str:
        return self.reasons[-1] if self.reasons else ""

    @property
    def ready_to_open(self) -> bool:
        """Leader: nothing of the last round is being decided or applied here."""
        return not self.decision.deciding and self.applier.idle

    def may_open(self, leading: bool, applied_round: int, committed_round: int) -> bool:
        """Whether the leader half may open round committed_round + 1 now: this peer leads, nothing
        of the last round is being decided or applied here, and θ of the last committed round is
        this peer's (θ_{r-1} must be ours before we open r)."""
        return leading and self.ready_to_open and applied_round == committed_round

    def handle(self, event: ev.Event, now: float) -> list[ev.Effect]:
        out = self.site.handle(event, now) + self.decision.handle(event, now) + self.applier.handle(event, now)
        self.reasons.extend(e.text for e in out if isinstance(e, ev.Note))
        return out

    def next_deadline(self) -> float:
        return min(self.site.next_deadline(), self.decision.next_deadline(), self.applier.next_deadline())
