"""The leader's fetch of a decided round, sans I/O: pull the admitted Δ, drop who cannot serve, propose.

`RoundLeader` (peer/core/rounds.py) decides which contributions are admitted (I6). This core turns its
`Decide` into a RoundCommit: `Fetch` the admitted contributions' pseudo-gradients (the executor pulls,
verifies and averages them and applies the outer step), and on

- `OutcomeReady`: `Propose` RoundCommit(r, admitted, hash θ_r);
- `OutcomeFailed(site)`: that contributor is excluded (its Δ cannot be fetched, or does not match
  its report) and the rest are fetched again: a contributor that went away costs only its own
  samples, which the commit frees;
- `OutcomeFailed("")` (no single site to blame): the round is committed without contributors, so
  nothing is lost: its samples go back to free and are leased again;
- `MemberDown(site)` of an admitted contributor while fetching: `CancelFetch`, exclude it and fetch
  again at once instead of letting the fetch retry a dead peer up to its deadline;
- `MemberSuspect(site)` of an admitted contributor (not this leader) while fetching: the same. A
  contributor stopped or cut off after its manifest was read held the round until membership
  called it dead (a suspicion timeout later: 4 s `lan`, 15 s `wan`). A suspicion that was false
  costs that contributor this round's samples, which go back on their leases
  (docs/decisions/rounds-exclude-suspect-contributor.md);
- `LeaveRequested` while this leader's own contribution is being fetched: the same, for itself
  (once it is gone nobody else would hold its pseudo-gradient; `RoundLeader.withdraw` is the
  same rule for a round still open).

    .venv/bin/python -m pytest -q tests/unit/test_site_round.py -k decision
"""

from __future__ import annotations

from dataclasses import dataclass

from peer.core.commitlog import Contributor, RoundCommit
from peer.core import events as ev
from peer.core.ids import Round, SiteId
from peer.core.rounds import Contribution


@dataclass
class _Fetching:
    round: int
    attempt: int
    admitted: list[Contribution]


class Decision:
    """At most one decided round in flight at the leader."""

    def __init__(self, site: str) -> None:
        self.site = site
        self.fetching: _Fetching | None = None
        self._attempts = 0

    @property
    def deciding(self) -> bool:
        return self.fetching is not None

    def handle(self, event: ev.Event, now: float) -> list[ev.Effect]:
        f = self.fetching
        if isinstance(event, ev.DecideRound):
            d = event.decide
            out: list[ev.Effect] = [ev.Note(d.why)] if d.why else []
            out += [ev.Excluded(d.round, e.site, e.kind, e.reason) for e in d.excluded]
            out += [ev.Note(f"round {d.round}: {e.site}: {e.reason}") for e in d.excluded]
            admitted = list(d.admitted)
            for c in [c for c in admitted if c.site not in event.live]:
                admitted.remove(c)
                out.append(self._drop_note(d.round, c.site, f"{c.site} is dead (membership)"))
            self.fetching = _Fetching(d.round, 0, admitted)
            return out + [self._fetch()]
        if f is None:
            return []
        if isinstance(event, ev.MemberDown) and any(c.site == event.site for c in f.admitted):
            return self._refetch_without(event.site, f"{event.site} is dead (membership); deciding without it at once")
        if (isinstance(event, ev.MemberSuspect) and event.site != self.site
                and any(c.site == event.site for c in f.admitted)):
            return self._refetch_without(event.site, f"{event.site} is suspected (membership); deciding without "
                                                     "it at once")
        if isinstance(event, ev.LeaveRequested) and any(c.site == self.site for c in f.admitted):
            return self._refetch_without(self.site, f"{self.site} leads this round and is leaving: once it is "
                                                    "gone nobody would hold its pseudo-gradient")
        if isinstance(event, ev.OutcomeFailed) and (event.round, event.attempt) == (f.round, f.attempt):
            if event.site and any(c.site == event.site for c in f.admitted):
                f.admitted = [c for c in f.admitted if c.site != event.site]
                return [self._drop_note(f.round, event.site, event.reason), self._fetch()]
            f.admitted = []
            return [ev.Note(f"round {f.round}: could not pull every pseudo-gradient ({event.reason}); "
                            "committing it empty", warning=True), self._fetch()]
        if isinstance(event, ev.OutcomeReady) and (event.round, event.attempt) == (f.round, f.attempt):
            self.fetching = None
            commit = RoundCommit(Round(f.round), tuple(
                Contributor(SiteId(c.site), c.tokens, c.ranges, c.pseudo_gradient_root)
                for c in sorted(f.admitted, key=lambda c: c.site)),  # the log wants them sorted by site
                event.weights_hash)
            return [ev.Note(f"round {f.round}: proposing {len(f.admitted)} contributor(s)"), ev.Propose(commit)]
        return []

    def next_deadline(self) -> float:
        return float("inf")  # every wait ends in a completion event or a membership event

    def _refetch_without(self, site: str, why: str) -> list[ev.Effect]:
        f = self.fetching
        assert f is not None
        f.admitted = [c for c in f.admitted if c.site != site]
        return [ev.CancelFetch(f.round, f.attempt), self._drop_note(f.round, site, why), self._fetch()]

    def _fetch(self) -> ev.Fetch:
        assert self.fetching is not None
        self._attempts += 1
        self.fetching.attempt = self._attempts
        return ev.Fetch(self.fetching.round, self._attempts, tuple(self.fetching.admitted))

    @staticmethod
    def _drop_note(round_: int, site: str, why: str) -> ev.Note:
        return ev.Note(f"round {round_}: {site}: excluded: {why}", warning=True)
