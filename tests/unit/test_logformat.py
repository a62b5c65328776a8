"""`peer serve --log-format json`: one object per line with site, round and epoch."""

from __future__ import annotations

import json
import logging

import pytest

from peer.logformat import JsonFormatter, configure


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            import sys
            exc_info = sys.exc_info()
    return logging.LogRecord("sitemesh.rounds", logging.INFO, __file__, 1, msg, args, exc_info)


def test_json_line_has_site_round_epoch() -> None:
    state = {"round": 7, "epoch": 2}
    line = JsonFormatter("lumi", lambda: dict(state)).format(_record("round %d applied", 7))
    doc = json.loads(line)
    assert "\n" not in line
    assert {k: doc[k] for k in ("level", "logger", "msg", "site", "round", "epoch")} == {
        "level": "INFO", "logger": "sitemesh.rounds", "msg": "round 7 applied", "site": "lumi", "round": 7,
        "epoch": 2}
    assert doc["ts"].endswith("Z")


def test_unknown_context_is_left_out_and_tracebacks_stay_on_one_line() -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("node not started")

    doc = json.loads(JsonFormatter("a", lambda: {"round": None, "epoch": 1}).format(_record("x")))
    assert "round" not in doc and doc["epoch"] == 1
    line = JsonFormatter("a", broken).format(_record("failed", exc=True))
    assert "RuntimeError: boom" in json.loads(line)["exc"] and "\n" not in line


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log format 'xml' unknown"):
        configure("INFO", "xml", "a", dict)
