"""Committed rounds applied in log order, sans I/O: retries, and state transfer when θ is wrong.

Every peer makes each committed round its state, strictly in log order, one at a time: `Apply(index,
commit)` ends in `Persisted` or `ApplyFailed`. On failure:

- "diverged": this peer's θ disagrees with the log (I7: a bug, or a memory or disk error here).
  Retrying the same round cannot help: at once a `CatchUp` (state transfer of the newest committed
  round from a peer whose θ hashes as the log says), the reason kept in `diverged`;
- "unavailable": a pseudo-gradient nobody serves any more (this peer fell behind): `CatchUp` too;
- "error": retried after min(0.5 s x attempt, 5 s).

A contributor of the round being applied that membership suspects or declares gone (stopped, cut
off, killed after the commit) would hold the apply's fetch of its pseudo-gradient until the fetch
gives up: `CancelApply` and a `CatchUp` at once (the leader, at least, applied the round already).

A `CatchUp` that fails is retried with the same back-off. Rounds a state transfer covered are
skipped. `RoundApplied` says a round is done (the executor closes its timeline record).

    .venv/bin/python -m pytest -q tests/unit/test_site_round.py -k apply
"""

from __future__ import annotations

from collections import deque

from peer.core.commitlog import RoundCommit
from peer.core import events as ev

RETRY_STEP_S = 0.5
RETRY_MAX_S = 5.0


class ApplyQueue:
    def __init__(self, applied_round: int) -> None:
        self.applied_round = applied_round
        self.queue: deque[tuple[int, RoundCommit]] = deque()
        self.current: tuple[int, RoundCommit] | None = None
        self.running: ev.Apply | ev.CatchUp | None = None
        self.resync = False
        """θ disagrees with the log: a state transfer comes before anything else is applied."""
        self.diverged = ""
        """The last I7 violation found and whether its state transfer is done; empty if none."""
        self.attempt = 0
        self.retry_at: float | None = None

    @property
    def idle(self) -> bool:
        """Nothing committed waits to be applied here."""
        return self.running is None and self.current is None and not self.queue and not self.resync

    def handle(self, event: ev.Event, now: float) -> list[ev.Effect]:
        out: list[ev.Effect] = []
        if isinstance(event, ev.Committed):
            self.queue.append((event.index, event.commit))
        elif isinstance(event, ev.Diverged):
            out.append(self._diverge(event.reason))
        elif isinstance(event, ev.MemberSuspect | ev.MemberDown) and isinstance(self.running, ev.Apply) and any(
                c.site == event.site for c in self.running.commit.contributors):
            rnd = self.running.commit.round
            self.running = None
            return [ev.CancelApply(rnd),
                    ev.Note(f"round {rnd}: {event.site} (suspected or gone) holds a pseudo-gradient it needs; "
                            "catching up by state transfer"),
                    self._start(ev.CatchUp())]
        elif isinstance(event, ev.Persisted) and self.running is not None and event.transfer == isinstance(
                self.running, ev.CatchUp):
            self.running, self.current, self.attempt, self.retry_at = None, None, 0, None
            self.applied_round = max(self.applied_round, event.round)
            if event.transfer and self.resync:
                self.resync = False
                self.diverged = self.diverged.replace("re-syncing", f"re-synced to round {event.round}")
                out.append(ev.Note(f"θ re-synced: {self.diverged}", warning=True))
            out.append(ev.RoundApplied(event.round))
        elif isinstance(event, ev.ApplyFailed) and isinstance(self.running, ev.Apply):
            self.running = None
            if event.kind == "diverged":
                out.append(self._diverge(event.reason))
            elif event.kind == "unavailable":
                out += [ev.Note(f"{event.reason}; catching up by state transfer"), self._start(ev.CatchUp())]
                return out
            else:
                out.append(self._backoff(now, f"apply attempt {self.attempt} (round {event.round}) failed: "
                                              f"{event.reason}"))
        elif isinstance(event, ev.CatchUpFailed) and isinstance(self.running, ev.CatchUp):
            self.running = None
            out.append(self._backoff(now, f"state transfer attempt {self.attempt} failed: {event.reason}"))
        return out + self._next(now)

    def next_deadline(self) -> float:
        return self.retry_at if self.retry_at is not None else float("inf")

    def _next(self, now: float) -> list[ev.Effect]:
        if self.running is not None or (self.retry_at is not None and now < self.retry_at):
            return []
        self.retry_at = None
        if self.resync:
            return [self._start(ev.CatchUp())]
        while self.current is None and self.queue:
            index, commit = self.queue.popleft()
            if commit.round > self.applied_round:  # else covered by a state transfer
                self.current = (index, commit)
        if self.current is None:
            return []
        return [self._start(ev.Apply(*self.current))]

    def _start(self, effect: ev.Apply | ev.CatchUp) -> ev.Apply | ev.CatchUp:
        self.attempt += 1
        self.running = effect
        return effect

    def _backoff(self, now: float, why: str) -> ev.Note:
        self.retry_at = now + min(RETRY_STEP_S * self.attempt, RETRY_MAX_S)
        return ev.Note(f"{why}; retrying in {self.retry_at - now:.1f} s", warning=True)

    def _diverge(self, why: str) -> ev.Note:
        self.diverged = f"{why}; re-syncing by state transfer"
        self.resync = True
        return ev.Note(f"θ diverged from the log: {self.diverged}", warning=True)
