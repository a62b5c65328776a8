"""Watching a real run: the per-round timeline, `ops status`, Prometheus metrics, `ops report`.

Two `peer serve --train micro` processes on loopback train a small slice of the shipped corpus to
the end of its data epoch once for the whole module; each test then reads what an operator would.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from peer import timeline
from tests.integration.peers import Cluster, status, wait_for

DOCS = 8  # 141 samples in 3 blocks: several rounds of both sites
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "4", "--batch-size", "2",
         "--round-deadline", "120", "--checkpoint-every", "0"]
SITES = ("a", "b")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("watch"), preset="lan")
    try:
        # Both trainers start at once (a fixed port for the seed): started one after the other on a
        # loaded machine, the first site trains most of the epoch alone while the second one builds.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            seed = f"127.0.0.1:{s.getsockname()[1]}"
        with ThreadPoolExecutor(2) as pool:
            started = [pool.submit(cluster.start, "a", extra=[*TRAIN, "--listen", seed]),
                       pool.submit(cluster.start, "b", join=[seed], extra=TRAIN)]
            for f in started:
                f.result()
        wait_for(lambda: any((t := status(p.address)["training"]) and t["epoch_complete"]
                             for p in cluster.peers.values()), 300.0, "the data epoch to complete")
        wait_for(lambda: len({status(p.address)["training"]["applied_round"] for p in cluster.peers.values()}) == 1,
                 60.0, "both peers to apply the last round")
        yield cluster
    finally:
        cluster.close()


@pytest.mark.timeout(420)
def test_every_site_records_every_round_it_applied(run: Cluster) -> None:
    for site in SITES:
        records = timeline.read(run.workdir / site)
        applied = status(run.peers[site].address)["training"]["applied_round"]
        assert [r.round for r in records] == list(range(1, applied + 1)), f"{site}: one record per round"
        for rec in records:
            assert rec.site == site
            for phase in timeline.PHASES:
                assert getattr(rec, f"{phase}_s") >= 0.0
            assert 0.0 <= rec.overhead_share <= 1.0
        trained = [r for r in records if r.tokens > 0]
        assert trained, f"{site} trained no round"
        assert all(r.compute_s > 0 and r.inner_steps > 0 for r in trained)
        # A round's phases add up to the site's wall time between two applied rounds.
        assert all(r.exchange_s + r.outer_s + r.persist_s > 0 for r in records)
