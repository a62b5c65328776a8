"""One process per data directory: an exclusive `flock` on `<data dir>/LOCK`, held for the peer's life.

Two peers writing one commit log interleave records and fork the site's history; the lock makes the
second one refuse to start, naming the PID that holds it. The kernel drops the lock when the holder
exits, however it exits (kill -9 included), so a stale LOCK file never blocks a restart.

    .venv/bin/python -m pytest -q tests/unit/test_dirlock.py
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class DirLocked(OSError):
    """Another live process holds this data directory."""


def lock_dir(directory: Path) -> IO[str]:
    """Locks `directory` for this process; keep the returned file open while the directory is used."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "LOCK"
    f = open(path, "a+")  # noqa: SIM115 - held open for the life of the process: it is the lock
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise DirLocked(
            f"data directory {directory} is in use by another peer (PID {holder}, lock {path}): "
            "stop that process, or give this peer its own --data-dir"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
