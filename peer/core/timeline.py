"""Where a site's round time went: one record per outer round, kept in `<data-dir>/timeline.jsonl`.

Every site appends one JSON line per round it took part in (peer/timeline_file.py; the site half of
the round, measured on the site's own clock). Operations read the same records: `ops status` shows the last one,
metrics export its phases, `ops report` draws them. In serial rounds the phases partition the
round's wall time; with overlap (RoundsConfig.overlap) compute runs beside publish, exchange,
commit_wait and outer, so they may sum to more than the wall time, which the record keeps as
measured (`elapsed_s`):

    gather       waiting for leased samples to train
    compute      inner steps in the trainer (the only useful work), booked by when they ran: the
                 seconds the trainer computed within this record's wall time, whichever round
                 they served (with overlap, part of them train the next round ahead)
    publish      encoding and hashing Δ, putting it in the exchange store, collecting the owners'
                 vouchers for the trained samples (the report waits for them)
    exchange     pulling the contributors' Δ for the committed round
    commit_wait  waiting for the leader's commit after publishing
    outer        the outer step (token-weighted mean, Nesterov)
    persist      waiting for the previous round's θ and momentum writes (they run in the background)
    idle         everything else (waiting for the next round to open)

overhead_share = 1 - compute / wall: the share of wall time the accelerators did not train.

A record also says how many tokens the log had committed through its round (the x-axis against a
centralised run) and, on the site that evaluated θ_round (peer/heldout.py), its held-out perplexity.
Records written before these fields existed read back with them unset.

Try it:
    .venv/bin/python -c "from peer.core.timeline import *; print(RoundTimeline(1, 'a', compute_s=3, idle_s=1).overhead_share)"
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["PHASES", "RoundClock", "RoundTimeline"]

PHASES = ("gather", "compute", "publish", "exchange", "commit_wait", "outer", "persist", "idle")
"""The phases of a round at a site, in the order they happen."""


@dataclass(frozen=True)
class RoundTimeline:
    """Seconds one site spent in each phase of one outer round."""

    round: int
    """The outer round these seconds belong to."""
    site: str
    """The site that measured them (its own clock)."""
    gather_s: float = 0.0
    compute_s: float = 0.0
    publish_s: float = 0.0
    exchange_s: float = 0.0
    commit_wait_s: float = 0.0
    outer_s: float = 0.0
    persist_s: float = 0.0
    idle_s: float = 0.0
    tokens: int = 0
    """Tokens this site trained in the round (0 when it only applied the round)."""
    inner_steps: int = 0
    """Inner optimizer steps this site ran in the round."""
    loss: float = math.nan
    """Mean inner loss of this site's steps in the round (NaN when it trained none)."""
    elapsed_s: float | None = None
    """The record's wall time on the site's clock (since the previous record). None: the sum of
    the phases, as in serial rounds (and in records written before overlap existed)."""
    committed_tokens: int | None = None
    """Tokens the run had committed, mesh-wide, when θ_round was applied here (every site's ledger;
    counted from θ_0). None in records written before it was kept."""
    heldout_perplexity: float | None = None
    """Held-out perplexity of θ_round, on the site that evaluated it (peer/heldout.py); None elsewhere."""
    heldout_samples: int | None = None
    """Held-out samples that perplexity is over (the same fixed set every time in a run)."""
    heldout_s: float | None = None
    """The trainer's seconds for that evaluation. Not a phase: it delays this site's next round's
    training by as much, which that round's record shows as overhead."""

    def __post_init__(self) -> None:
        for name in PHASES:
            if getattr(self, f"{name}_s") < 0:
                raise ValueError(f"timeline of round {self.round}: {name}_s is negative")

    @property
    def wall_s(self) -> float:
        """The round's wall time at this site: as measured, else the sum of its phases."""
        if self.elapsed_s is not None:
            return self.elapsed_s
        return sum(getattr(self, f"{name}_s") for name in PHASES)

    @property
    def overhead_share(self) -> float:
        """1 - compute / wall; 0 for a round that took no time."""
        wall = self.wall_s
        return 0.0 if wall <= 0 else 1.0 - self.compute_s / wall

    @property
    def tokens_per_s(self) -> float:
        """Tokens trained per second of wall time in this round."""
        wall = self.wall_s
        return 0.0 if wall <= 0 else self.tokens / wall

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["wall_s"] = self.wall_s
        out["overhead_share"] = self.overhead_share
        return out

    @classmethod
    def from_json(cls, obj: dict[str, object]) -> RoundTimeline:
        known = {f.name for f in fields(cls)}
        obj = {"elapsed_s": obj.get("wall_s"), **obj}  # written by to_json, which names it wall_s too
        return cls(**{k: v for k, v in obj.items() if k in known})  # type: ignore[arg-type]


class RoundClock:
    """Splits a site's wall time into rounds and phases as the round code marks them (pure: the
    caller passes its clock's readings).

    A record covers the time from the previous record's end (or the clock's start) to `finish`; the
    seconds no phase claimed are idle. Phases are booked to the round they serve: a site may start
    gathering for round r+1 while it still persists θ_r, and those seconds go to r+1's record.
    Compute is the exception: it is booked to the record whose wall time it ran in, so that
    1 - compute / wall says how long the trainer stood still in that stretch of time (with overlap
    round r+1 trains during round r's record; booked to r+1 it would make r's record look idle and
    r+1's compute exceed its wall time). A run still under way when a record closes books its
    seconds so far there, measured on this clock from `computing`, and the rest when it ends.
    """

    def __init__(self, site: str, now: float) -> None:
        self.site = site
        self._since = now
        self._spent: dict[int, dict[str, float]] = {}
        self._work: dict[int, tuple[int, int, float]] = {}
        self._waiting: tuple[int, float, float] | None = None
        """(round, when the report went out, seconds booked to that round by then)."""
        self._compute = 0.0
        """Compute seconds in the open record's wall time."""
        self._computing: float | None = None
        """When the trainer's run under way began; None: no run under way."""
        self._carried = 0.0
        """Seconds of the run under way already booked to records closed meanwhile."""
        self.totals: dict[str, float] = {}
        """Seconds per phase and "tokens" over every record finished so far (metrics' counters)."""

    def add(self, round_: int, phase: str, seconds: float) -> None:
        if phase not in PHASES or phase in ("idle", "compute"):
            raise ValueError(f"unknown round phase {phase!r}; one of "
                             f"{', '.join(p for p in PHASES if p not in ('idle', 'compute'))} (compute: computed)")
        spent = self._spent.setdefault(round_, {})
        spent[phase] = spent.get(phase, 0.0) + max(seconds, 0.0)

    def computing(self, now: float) -> None:
        """The trainer starts a run (one round's inner steps)."""
        self._computing, self._carried = now, 0.0

    def computed(self, seconds: float | None) -> None:
        """The run under way ended after `seconds` of the trainer's own measured compute; None: it
        failed or was dropped, and is booked no further (what closed records already hold stays)."""
        if seconds is not None:
            self._compute += max(seconds - self._carried, 0.0)
        self._computing, self._carried = None, 0.0

    def trained(self, round_: int, tokens: int, inner_steps: int, loss: float = math.nan) -> None:
        self._work[round_] = (tokens, inner_steps, loss)

    def reported(self, round_: int, now: float) -> None:
        """The site's report for `round_` went out: what follows, until its commit, is commit_wait
        (less whatever else is booked meanwhile, e.g. a leader pulling the pseudo-gradients)."""
        self._waiting = (round_, now, self._booked(round_))

    def committed(self, round_: int, now: float) -> None:
        """The commit of `round_` arrived in this site's log."""
        if self._waiting is None or self._waiting[0] != round_:
            return
        _, since, booked = self._waiting
        self._waiting = None
        self.add(round_, "commit_wait", (now - since) - (self._booked(round_) - booked))

    def finish(self, round_: int, now: float, committed_tokens: int | None = None) -> RoundTimeline:
        """Closes `round_`'s record (θ_round is applied here); earlier rounds' leftovers fold in.
        `committed_tokens`: the run's tokens committed through `round_`, as the caller's ledger says."""
        spent: dict[str, float] = {}
        for r in [r for r in self._spent if r <= round_]:
            for phase, s in self._spent.pop(r).items():
                spent[phase] = spent.get(phase, 0.0) + s
        tokens, steps, loss = self._work.pop(round_, (0, 0, math.nan))
        for r in [r for r in self._work if r < round_]:
            del self._work[r]
        wall = max(now - self._since, 0.0)
        if self._computing is not None:  # a run under way: its seconds in this record so far
            so_far = max(now - max(self._computing, self._since), 0.0)
            self._compute += so_far
            self._carried += so_far
        self._since = now
        if self._compute > 0:
            spent["compute"] = self._compute
        self._compute = 0.0
        idle = max(wall - sum(spent.values()), 0.0)
        for name, value in (*spent.items(), ("idle", idle), ("tokens", tokens)):
            self.totals[name] = self.totals.get(name, 0.0) + value
        phases: dict[str, Any] = {f"{p}_s": s for p, s in spent.items()}  # mypy: not the int fields
        return RoundTimeline(round_, self.site, idle_s=idle, tokens=tokens, inner_steps=steps, loss=loss,
                             elapsed_s=wall, committed_tokens=committed_tokens, **phases)

    def _booked(self, round_: int) -> float:
        return sum(self._spent.get(round_, {}).values())
