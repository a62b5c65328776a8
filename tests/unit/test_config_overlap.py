"""The overlap switch: run file `[sites.X] overlap`, `peer serve --overlap on|off`, default on.

    .venv/bin/python -m pytest -q tests/unit/test_config_overlap.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from peer import config as cfg


def _run_file(tmp_path: Path, line: str) -> Path:
    run = tmp_path / "run.toml"
    run.write_text(f'[run]\ninsecure = true\n[sites.a]\nlisten = "127.0.0.1:0"\n{line}\n')
    return run


def test_overlap_is_on_unless_the_run_file_turns_it_off(tmp_path: Path) -> None:
    assert cfg.load(_run_file(tmp_path, ""), "a", {}).overlap is True
    assert cfg.load(_run_file(tmp_path, "overlap = false"), "a", {}).overlap is False


def test_the_command_line_overrides_the_run_file(tmp_path: Path) -> None:
    assert cfg.load(_run_file(tmp_path, "overlap = true"), "a", {"overlap": False}).overlap is False


def test_a_switch_that_is_not_a_boolean_is_refused_with_what_to_write(tmp_path: Path) -> None:
    with pytest.raises(cfg.ConfigError, match="overlap 'off': use true or false"):
        cfg.load(_run_file(tmp_path, 'overlap = "off"'), "a", {})
