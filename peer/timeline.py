"""Where a site's round time went: one record per outer round, kept in `<data-dir>/timeline.jsonl`.

Every site appends one JSON line per round it took part in (the site half of the round, measured
on the site's own clock). Operations read the same records: `ops status` shows the last one,
metrics export its phases, `ops report` draws them. The phases partition the round's wall time:

    gather       waiting for leased samples to train
    compute      inner steps in the trainer (the only useful work)
    publish      encoding and hashing Δ, putting it in the exchange store
    exchange     pulling the contributors' Δ for the committed round
    commit_wait  waiting for the leader's commit after publishing
    outer        the outer step (token-weighted mean, Nesterov)
    persist      writing θ and the outer momentum durably
    idle         everything else (waiting for the next round to open)

overhead_share = 1 - compute / wall: the share of wall time the accelerators did not train.

Try it:
    .venv/bin/python -c "from peer.timeline import *; print(RoundTimeline(1, 'a', compute_s=3, idle_s=1).overhead_share)"
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

__all__ = ["PHASES", "RoundTimeline", "TIMELINE_FILE", "append", "read"]

TIMELINE_FILE = "timeline.jsonl"

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

    def __post_init__(self) -> None:
        for name in PHASES:
            if getattr(self, f"{name}_s") < 0:
                raise ValueError(f"timeline of round {self.round}: {name}_s is negative")

    @property
    def wall_s(self) -> float:
        """The round's wall time at this site: the sum of its phases."""
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
        return cls(**{k: v for k, v in obj.items() if k in known})  # type: ignore[arg-type]


def append(data_dir: Path, record: RoundTimeline) -> None:
    """Appends one round's record. Not fsynced: the timeline is for people, losing a tail is harmless."""
    with open(data_dir / TIMELINE_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(record.to_json(), sort_keys=True) + "\n")


def read(data_dir: Path) -> list[RoundTimeline]:
    """Every record in a data dir's timeline, oldest first; a torn last line (a crash) is skipped."""
    path = data_dir / TIMELINE_FILE
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        try:
            out.append(RoundTimeline.from_json(json.loads(line)))
        except (json.JSONDecodeError, TypeError, ValueError):
            if i == len(lines) - 1:
                continue  # a torn tail from a crash mid-append
            raise ValueError(f"{path}: line {i + 1} is not a timeline record; move the file aside to reset it")
    return out
