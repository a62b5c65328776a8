"""One suspicion timer whose timeout shrinks as independent members confirm it (Lifeguard).

Lifeguard section IV-B ("local health aware suspicion"): a suspicion starts with a long timeout
`max_s`; each *independent* suspicion of the same member at the same incarnation (another member
saying SUSPECT) is a confirmation, and the timeout falls logarithmically towards `min_s`, reached
after `k` confirmations:

    timeout(c) = max(min_s, max_s - (max_s - min_s) * log(c + 1) / log(k + 1))

So a member suspected by one flaky observer gets plenty of time to refute, while a member everybody
agrees is gone is declared dead fast. Same shape as memberlist's `suspicion.go`.

    python -c "from peer.core.suspicion import Suspicion as S; s=S('b', 3, 'a', 0.0, 5, 30, 3); \
s.confirm('c'); print(s.deadline)"
"""

from __future__ import annotations

import math


class Suspicion:
    """A running suspicion of member `site` at `incarnation`, started by `first_from` at `start`."""

    def __init__(self, site: str, incarnation: int, first_from: str, start: float,
                 min_s: float, max_s: float, k: int) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError("need 0 < min_s <= max_s")
        self.site = site
        self.incarnation = incarnation
        self.start = start
        self.first_from = first_from
        self._min = min_s
        self._max = max_s
        self._k = max(0, k)
        # Sites whose suspicion we counted; the first suspecter is not a confirmation of itself.
        self._confirmed_by: set[str] = {first_from}
        self.deadline = start + self._timeout()

    @property
    def confirmations(self) -> int:
        return len(self._confirmed_by) - 1

    def _timeout(self) -> float:
        if self._k == 0:
            # Nobody could ever confirm (tiny cluster): no point waiting for confirmations.
            return self._min
        frac = math.log(self.confirmations + 1) / math.log(self._k + 1)
        return max(self._min, self._max - (self._max - self._min) * frac)

    def confirm(self, from_site: str) -> bool:
        """Count an independent suspicion from `from_site`; True if it was new (worth re-gossiping)."""
        if from_site in self._confirmed_by or self.confirmations >= self._k:
            return False
        self._confirmed_by.add(from_site)
        self.deadline = self.start + self._timeout()
        return True
