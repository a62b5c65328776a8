"""`<data dir>/state/applied.json`: the log index and round this peer's state reflects.

Written atomically (write, fsync, rename) after what it names is durable, so a crash leaves the
old pointer or the new one, never one to a half-written state. A training peer's pointer also
names the weights file of that round (theta_store.py); a peer without a trainer keeps only the
index and round, so its log is kept through what it applied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from peer.durable import write_atomic


def state_dir(data_dir: Path) -> Path:
    """Where a peer keeps its applied state (θ, momentum, this pointer) and its trainer's files."""
    return data_dir / "state"


@dataclass(frozen=True)
class Applied:
    index: int = 0
    round: int = 0
    file: str = ""
    """The weights file of `round` beside the pointer ("" for a peer without a trainer)."""


class AppliedPointer:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "applied.json"

    def load(self) -> Applied:
        """What the pointer says; Applied() (index 0, round 0) before anything was applied."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Applied()
        return Applied(int(doc["index"]), int(doc["round"]), str(doc.get("file", "")))

    def pointer(self) -> tuple[int, int]:
        """(log index, round) of what was applied; (0, 0) before anything was."""
        applied = self.load()
        return applied.index, applied.round

    def save(self, applied: Applied) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc: dict[str, int | str] = {"index": applied.index, "round": applied.round}
        if applied.file:
            doc["file"] = applied.file
        write_atomic(self.path, json.dumps(doc))
