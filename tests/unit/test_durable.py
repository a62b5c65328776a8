"""peer/durable.py: content and cleanup of atomic writes, the old file surviving a failed write, the
fsync order (file, rename, directory), symlinks and directories replaced without being opened."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from peer.durable import fsync_tree, replace_atomic, temp_sibling, write_atomic


Events = list[tuple[str, str]]
MP = pytest.MonkeyPatch


class Boom(Exception):
    pass


@pytest.fixture
def events(monkeypatch: MP) -> Iterator[Events]:
    """Records every os.fsync (of a file or a directory, by path) and os.replace, in order."""
    log: Events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        kind = "fsync-dir" if stat.S_ISDIR(st.st_mode) else "fsync-file"
        log.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        log.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    yield log


def _names(d: Path) -> list[str]:
    return sorted(os.listdir(d))


@pytest.mark.parametrize("data, expected", [(b"\x00b\xff", b"\x00b\xff"), ("héllo", "héllo".encode())])
def test_write_atomic_writes_the_content_and_leaves_no_temp_file(
        tmp_path: Path, data: bytes | str, expected: bytes) -> None:
    dest = tmp_path / "applied.json"
    write_atomic(dest, data)
    assert dest.read_bytes() == expected
    assert _names(tmp_path) == ["applied.json"]


def test_write_atomic_overwrites_an_existing_file(tmp_path: Path) -> None:
    dest = tmp_path / "hardstate"
    write_atomic(dest, b"old content, longer than the new one")
    write_atomic(dest, b"new")
    assert dest.read_bytes() == b"new"
    assert _names(tmp_path) == ["hardstate"]


def test_write_atomic_order_is_fsync_file_rename_fsync_dir(tmp_path: Path, events: Events) -> None:
    dest = tmp_path / "pointer"
    write_atomic(dest, b"x")
    assert [k for k, _ in events] == ["fsync-file", "replace", "fsync-dir"]
    assert events[1][1] == str(dest) and events[2][1] == str(tmp_path)
    assert Path(events[0][1]).parent == tmp_path  # the temporary file is a sibling: same filesystem


@pytest.mark.parametrize("fail", ["replace", "fsync"])
def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: MP, fail: str) -> None:
    dest = tmp_path / "snapshot"
    write_atomic(dest, b"old")

    def boom(*_: object) -> None:
        raise Boom(fail)

    monkeypatch.setattr(os, fail, boom)
    with pytest.raises(Boom):
        write_atomic(dest, b"new content that must never be seen half-written")
    monkeypatch.undo()
    assert dest.read_bytes() == b"old"
    assert _names(tmp_path) == ["snapshot"]


def test_an_interrupt_during_the_write_also_cleans_up(tmp_path: Path, monkeypatch: MP) -> None:
    dest = tmp_path / "f"
    write_atomic(dest, b"old")

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(dest, b"new")
    monkeypatch.undo()
    assert dest.read_bytes() == b"old" and _names(tmp_path) == ["f"]


def test_write_atomic_leaves_permissions_to_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644


def test_a_stray_temp_file_does_not_block_the_next_write(tmp_path: Path) -> None:
    dest = tmp_path / "hardstate"
    (tmp_path / "hardstate.tmp").write_bytes(b"torn")  # the old fixed name, left by a crash
    stray = temp_sibling(dest)
    stray.write_bytes(b"torn")
    write_atomic(dest, b"whole")
    assert dest.read_bytes() == b"whole"
    assert stray.read_bytes() == b"torn"  # someone else's temp file is never written through


def test_temp_siblings_are_hidden_distinct_and_in_the_same_directory(tmp_path: Path) -> None:
    dest = tmp_path / "weights.safetensors"
    a, b = temp_sibling(dest), temp_sibling(dest)
    assert a != b and a.parent == b.parent == tmp_path
    assert a.name.startswith(".weights.safetensors.") and a.name.endswith(".tmp")


def test_replace_atomic_moves_a_file_written_by_someone_else(tmp_path: Path, events: Events) -> None:
    dest = tmp_path / "weights-000003.safetensors"
    dest.write_bytes(b"round 2")
    tmp = temp_sibling(dest)
    tmp.write_bytes(b"round 3")  # stands in for safetensors' save_file(…, tmp)
    events.clear()
    replace_atomic(tmp, dest)
    assert dest.read_bytes() == b"round 3"
    assert _names(tmp_path) == [dest.name]
    assert events == [("fsync-file", str(tmp)), ("replace", str(dest)), ("fsync-dir", str(tmp_path))]


def test_replace_atomic_swaps_a_symlink_without_opening_it(tmp_path: Path, events: Events) -> None:
    (tmp_path / "round-000001").mkdir()
    latest = tmp_path / "latest"
    latest.symlink_to("round-000001")
    tmp = temp_sibling(latest)
    tmp.symlink_to("round-000002")  # dangling: the symlink must not be followed
    replace_atomic(tmp, latest)
    assert latest.is_symlink() and os.readlink(latest) == "round-000002"
    assert _names(tmp_path) == ["latest", "round-000001"]
    assert [k for k, _ in events] == ["replace", "fsync-dir"]


def test_replace_atomic_moves_a_directory_into_place(tmp_path: Path) -> None:
    src = tmp_path / ".ckpt.tmp"
    (src / "sub").mkdir(parents=True)
    (src / "meta.json").write_text("{}")
    (src / "sub" / "x").write_bytes(b"x")
    fsync_tree(src)
    replace_atomic(src, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "meta.json").read_text() == "{}"
    assert (tmp_path / "ckpt" / "sub" / "x").read_bytes() == b"x"
    assert _names(tmp_path) == ["ckpt"]


def test_replace_atomic_across_directories_fsyncs_both(tmp_path: Path, events: Events) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    src = tmp_path / "a" / "f"
    src.write_bytes(b"x")
    replace_atomic(src, tmp_path / "b" / "f")
    assert ("fsync-dir", str(tmp_path / "b")) in events and ("fsync-dir", str(tmp_path / "a")) in events


def test_a_failed_replace_keeps_dest_and_the_callers_temp(tmp_path: Path, monkeypatch: MP) -> None:
    dest = tmp_path / "applied.json"
    dest.write_text('{"round": 1}')
    tmp = temp_sibling(dest)
    tmp.write_text('{"round": 2}')

    def boom(*_: object) -> None:
        raise Boom("replace")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(Boom):
        replace_atomic(tmp, dest)
    assert dest.read_text() == '{"round": 1}'
    assert tmp.read_text() == '{"round": 2}'  # still the caller's to retry or remove


def test_fsync_tree_syncs_files_and_dirs_root_last_no_links(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "tree"
    (root / "d" / "e").mkdir(parents=True)
    for p in (root / "top", root / "d" / "mid", root / "d" / "e" / "deep"):
        p.write_bytes(p.name.encode())
    (root / "dangling").symlink_to("nowhere")
    (root / "outside").symlink_to(tmp_path)
    fsync_tree(root)
    files = {p for k, p in events if k == "fsync-file"}
    dirs = [p for k, p in events if k == "fsync-dir"]
    assert files == {str(root / "top"), str(root / "d" / "mid"), str(root / "d" / "e" / "deep")}
    assert dirs == [str(root / "d" / "e"), str(root / "d"), str(root)]

