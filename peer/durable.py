"""Crash-safe file replacement: a reader, or a restart after power loss, sees the old file or the
whole new one, never a half-written file.

The recipe, in one place so every caller gets all of it:
  1. write the new content to a temporary sibling (same directory, so the rename cannot cross
     filesystems) and fsync it, so its bytes are on disk before its name is;
  2. `os.replace` it over the destination (atomic on POSIX);
  3. fsync the directory, because the rename is a change to the directory: without this a power
     loss can bring back the old name (or no name) even though the file's data was synced.

Use `write_atomic` for bytes you have in hand (a JSON pointer, a record); `replace_atomic` when
something else writes the temporary path (safetensors `save_file`, a symlink, a directory
tree after `fsync_tree`).

Try it:
    .venv/bin/python -m pytest -q tests/unit/test_durable.py
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["fsync_dir", "fsync_file", "fsync_tree", "replace_atomic", "temp_sibling", "write_atomic"]


def fsync_file(path: Path) -> None:
    """Flush a regular file's data and metadata to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (creations, renames, removals in it) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every regular file and directory under `root`, deepest first, `root` last.

    Symlinks are not followed: their own entry is covered by the fsync of the directory holding them.
    """
    dirs: list[Path] = []
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            continue
        if p.is_dir():
            dirs.append(p)
        elif p.is_file():
            fsync_file(p)
    for d in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        fsync_dir(d)
    fsync_dir(root)


def temp_sibling(path: Path) -> Path:
    """A fresh hidden name next to `path` for `replace_atomic` (same directory, hence same filesystem).

    Random, so two writers never share a temporary file; a crash may leave one behind, which no reader
    looks at.
    """
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def replace_atomic(tmp: Path, dest: Path) -> None:
    """Make `tmp` durable, rename it over `dest`, and fsync the directory so the rename survives.

    `tmp` may be a regular file (fsynced here), a symlink (not opened: its target may not exist or
    may be elsewhere; the directory fsync covers it), or a directory whose contents the caller has
    already made durable with `fsync_tree` (only the directory itself is fsynced here).
    If this raises, `tmp` is still the caller's to remove (or reuse).
    """
    if tmp.is_symlink():
        pass
    elif tmp.is_dir():
        fsync_dir(tmp)
    else:
        fsync_file(tmp)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
    if os.path.realpath(tmp.parent) != os.path.realpath(dest.parent):
        fsync_dir(tmp.parent)  # the name also left tmp's directory


def write_atomic(path: Path, data: bytes | memoryview | str) -> None:
    """Replace `path` with `data` (str is written as UTF-8; a memoryview, e.g. of a numpy array, is
    written without a copy) so that a crash leaves old or new, whole.

    On any failure the temporary file is removed and `path` is untouched.
    """
    payload = data.encode() if isinstance(data, str) else data
    tmp = temp_sibling(path)
    # O_EXCL: never write through someone else's file; 0o666 lets the umask decide, like open().
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
