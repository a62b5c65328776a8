"""`<data dir>/timeline.jsonl`: a site's per-round records (peer/core/timeline.py), one JSON line each.

The heldout writer appends a round's record once it is final; `ops report`, `ops demo` and the
benchmarks read them back.
"""

from __future__ import annotations

import json
from pathlib import Path

from peer.core.timeline import RoundTimeline

TIMELINE_FILE = "timeline.jsonl"


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
        except (json.JSONDecodeError, TypeError, ValueError) as err:
            if i == len(lines) - 1:
                continue  # a torn tail from a crash mid-append
            raise ValueError(
                f"{path}: line {i + 1} is not a timeline record; move the file aside to reset it") from err
    return out
