"""`peer serve --log-format json`: every line a real peer writes is one JSON object."""

from __future__ import annotations

import json
import signal

from tests.integration.peers import Cluster, wait_for


def test_json_logs_of_a_running_peer(cluster: Cluster) -> None:
    peer = cluster.start("j", extra=["--round-interval", "0.2", "--log-format", "json"])
    wait_for(lambda: '"round": 3' in peer.log(), 60.0, "three committed rounds in the log")
    peer.proc.send_signal(signal.SIGTERM)
    assert peer.proc.wait(timeout=30) == 0
    lines = [json.loads(line) for line in peer.log().splitlines()]  # no line is anything else
    assert all(doc["site"] == "j" and doc["level"] in ("DEBUG", "INFO", "WARNING", "ERROR") for doc in lines)
    committed = [d for d in lines if d["msg"].startswith("round 3 committed")]
    assert committed and committed[0]["epoch"] >= 1 and committed[0]["round"] in (2, 3)
    assert any("left gracefully" in d["msg"] for d in lines)
