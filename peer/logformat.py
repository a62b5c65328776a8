"""Log lines of a peer: human lines (default) or one JSON object per line for log shippers.

    peer serve --site a --log-format json 2>&1 | jq -c 'select(.level == "WARNING")'

A JSON line has ts (ISO 8601, UTC), level, logger, msg, site and, once the node knows them, round
(the last round applied here) and epoch (the leader epoch); exc holds a traceback when there is one.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable

FORMATS = ("human", "json")
HUMAN = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; `context()` adds what the node knows now (round, epoch)."""

    def __init__(self, site: str, context: Callable[[], dict[str, object]]) -> None:
        super().__init__()
        self._site = site
        self._context = context

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "site": self._site,
        }
        try:
            doc.update({k: v for k, v in self._context().items() if v is not None})
        except Exception:  # noqa: BLE001, S110 - a log line must never fail because the node is half-built
            pass
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure(level: str, fmt: str, site: str, context: Callable[[], dict[str, object]]) -> None:
    """Sends the process's logs to stderr in `fmt` (human or json)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} unknown; use one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(site, context) if fmt == "json" else logging.Formatter(HUMAN))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
