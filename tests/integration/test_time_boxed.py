"""Time-boxed rounds with sites of unequal speed, through the real mesh: every site trains for the
round's budget (`peer serve --round-budget`), so a slow site contributes fewer tokens instead of
holding the fast one back, the token-weighted mean weighs each by what it did, and the samples a
slow site took but did not reach go back on their lease (the data epoch is still committed exactly
once).

Real `peer serve --train micro` processes on loopback; site b's trainer is made 6x slower with the
test fault SITEMESH_FAULT_SLOW_TRAINER (peer/trainer/inner.py), as a site on slower accelerators.
How much the fast site idles is a benchmark figure, not asserted here (`scripts/bench_overhead
--slow 3 --budget S` prints it).

    .venv/bin/python -m pytest -q tests/integration/test_time_boxed.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.trainer.inner import SLOW_ENV
from tests.integration.peers import Cluster, audit, commits, status, wait_for

DOCS = 16  # ~280 samples
# In a 2 s budget the fast site runs 7-50 steps (the cap) and the slow one a sixth of that, at the
# loads this suite runs under. (A machine so loaded that one step takes longer than the budget
# gives both sites the one step a round always runs, and this test nothing to tell them apart.)
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "50", "--batch-size", "2",
         "--round-budget", "2", "--round-deadline", "120", "--start-sites", "2"]
SLOW = 6


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path, preset="lan")
    yield c
    c.close()


@pytest.mark.timeout(600)
def test_a_slow_site_contributes_less_in_the_same_time_and_nothing_is_lost(cluster: Cluster) -> None:
    a = cluster.start("a", extra=TRAIN)
    b = cluster.start("b", join=[a.address], extra=TRAIN, env={SLOW_ENV: str(SLOW)})
    wait_for(lambda: any(status(p.address)["training"]["epoch_complete"] for p in (a, b)), 400.0,
             "the data epoch to complete")
    wait_for(lambda: status(a.address)["training"]["applied_round"] == status(b.address)["training"]["applied_round"],
             60.0, "both peers to apply the last round")
    both = [c for c in commits(cluster.workdir / "a") if {x.site for x in c.contributors} == {"a", "b"}]
    assert len(both) >= 2, f"too few rounds with both sites: {commits(cluster.workdir / 'a')}"
    tokens = [{x.site: x.tokens for x in c.contributors} for c in both]
    # Same budget, a sixth of the speed: b trains fewer steps (the same cap would have let it run as
    # many), half or less of a's tokens in all.
    assert sum(t["a"] for t in tokens) >= 2 * sum(t["b"] for t in tokens), tokens
    assert sum(t["a"] > t["b"] for t in tokens) >= len(tokens) // 2, tokens
    thetas_a, thetas_b = a.thetas(), b.thetas()
    common = thetas_a.keys() & thetas_b.keys()
    assert len(common) >= 2 and {r: thetas_a[r] for r in common} == {r: thetas_b[r] for r in common}, \
        f"I7: θ differs: a {thetas_a}, b {thetas_b}"
    epoch = audit(cluster.workdir / "a", cluster.workdir / "b")
    assert (epoch["duplicated"], epoch["lost"]) == (0, 0), epoch
    assert epoch["committed_once"] == epoch["samples_total"], epoch
