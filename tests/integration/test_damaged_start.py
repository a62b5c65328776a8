"""A site whose commit log lost committed entries refuses to start, naming the file and the repair;
`peer repair` sets the damaged state aside and the site rebuilds it from the run (real processes).

    .venv/bin/python -m pytest -q tests/integration/test_damaged_start.py
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from peer.logstore import FileStore
from tests.integration.peers import REPO, Cluster, _env, status, wait_for

SETTLE_S = 60.0
ROUNDS = ["--round-interval", "0.3"]


def test_a_log_cut_below_what_was_applied_is_refused_and_repaired(cluster: Cluster) -> None:
    a = cluster.start("a", extra=ROUNDS)
    cluster.start("b", join=[a.address], extra=ROUNDS)
    c = cluster.start("c", join=[a.address], extra=ROUNDS)
    wait_for(lambda: status(c.address)["consensus"]["applied_index"] >= 8, SETTLE_S, "c to apply rounds")
    c.proc.send_signal(signal.SIGKILL)
    c.proc.wait()
    data_dir = cluster.workdir / "c"
    applied = json.loads((data_dir / "state" / "applied.json").read_text())["index"]
    store = FileStore(data_dir / "consensus")
    store.reload()
    cut = store._offsets[applied - 3 - store.log.snapshot.last_index]  # at a record boundary: no torn bytes
    with open(data_dir / "consensus" / "log", "r+b") as f:
        f.truncate(cut)

    def serve(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "peer.cli", *extra], capture_output=True, text=True,
                              env=_env(), cwd=REPO, timeout=120, check=False)

    refused = serve("serve", "--site", "c", "--insecure", "--data-dir", str(data_dir), "--join", a.address)
    assert refused.returncode == 2, refused.stderr
    assert f"consensus/log ends at index {applied - 3} but index {applied} was applied" in refused.stderr
    assert "peer repair --data-dir" in refused.stderr
    repaired = serve("repair", "--data-dir", str(data_dir), "--yes")
    assert repaired.returncode == 0, repaired.stderr
    assert not (data_dir / "consensus").exists() and list(cluster.workdir.glob("c.damaged-*"))
    c = cluster.start("c", join=[a.address], extra=ROUNDS)
    leader_index = status(a.address)["consensus"]["commit_index"]
    wait_for(lambda: status(c.address)["consensus"]["applied_index"] >= leader_index, SETTLE_S,
             "the repaired site to receive the log from the run")
    wait_for(lambda: "c" in status(a.address)["voters"], SETTLE_S, "the repaired site to be a voter again")
