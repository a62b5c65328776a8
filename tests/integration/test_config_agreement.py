"""Sites agree on what they train before they train (issue #38), with real `peer serve --train` processes.

a founds the run on the shipped corpus; b joins with the same corpus under another path and name (its
block IDs must be a's, or none of its contributions would be admitted); c joins with another seq_len
and must be refused at the door, exit with the one-line reason, and never become a member, while a
and b keep committing rounds they both contribute to.

    .venv/bin/python -m pytest -q tests/integration/test_config_agreement.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from peer.trainer.config import SHIPPED_CORPUS
from tests.integration.peers import Cluster, commits, states, wait_for

TRAIN = ["--train", "micro", "--max-documents", "8", "--inner-steps", "4", "--batch-size", "1",
         "--round-deadline", "30", "--start-sites", "2", "--trainer-threads", "1"]


def _rounds_with(cluster: Cluster, sites: set[str]) -> list[int]:
    """Rounds in a's log on disk whose contributors include every site of `sites`."""
    return [c.round for c in commits(cluster.workdir / "a") if sites <= {x.site for x in c.contributors}]


@pytest.mark.timeout(120)
def test_a_site_with_another_data_config_is_refused_at_join_and_the_run_goes_on(
        cluster: Cluster, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "python-docs-copy.jsonl.gz"
    copy.parent.mkdir()
    shutil.copyfile(SHIPPED_CORPUS, copy)
    a = cluster.start("a", extra=TRAIN)
    cluster.start("b", join=[a.address], extra=[*TRAIN, "--data", str(copy)])
    c = cluster.start("c", join=[a.address], extra=[*TRAIN, "--seq-len", "64"])
    assert c.proc.wait(timeout=30) == 2, "a refused site exits with the usage status"
    reason = "data config differs from the run's: seq_len 64 here, 128 at a; fix the run file"
    (line,) = [x for x in c.log().splitlines() if "peer: error:" in x]
    assert line.endswith(reason) and "the run refused this site" in line, line
    assert f"refused c: {reason}" in a.log()
    # The run goes on without c, and a round after c's refusal has both a and b in it: b's blocks,
    # cut from its copy under another path, are a's blocks.
    wait_for(lambda: bool(_rounds_with(cluster, {"a", "b"})), 60.0, "a round with a and b as contributors")
    assert "c" not in states(a.address), "a refused site never becomes a member"
    assert "does not belong to this data config" not in a.log() + cluster.peers["b"].log()
