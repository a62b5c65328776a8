"""Watching a real run: the per-round timeline, `ops status`, Prometheus metrics, `ops report`.

Two `peer serve --train micro` processes on loopback train a small slice of the shipped corpus to
the end of its data epoch once for the whole module; each test then reads what an operator would.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib
import matplotlib.image
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ops import report
from peer.exchange.bulk import MAGIC, TOKEN_BYTES
from ops.audit import read_round_commits
from peer import timeline_file
from peer.job_record import read_dir
from peer.core.timeline import PHASES
from tests.integration.peers import REPO, Cluster, Peer, _env, ops, status, wait_for

DOCS = 8  # 141 samples in 3 blocks: several rounds of both sites
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "4", "--batch-size", "2",
         "--round-deadline", "120", "--checkpoint-every", "3"]
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
            started = [pool.submit(cluster.start, site, join=join, extra=[*TRAIN, *more, "--metrics-listen",
                                                                          "127.0.0.1:0"])
                       for site, join, more in (("a", None, ["--listen", seed]), ("b", [seed], []))]
            for f in started:
                f.result()
        wait_for(lambda: any((t := status(p.address)["training"]) and t["epoch_complete"]
                             for p in cluster.peers.values()), 300.0, "the data epoch to complete")
        wait_for(lambda: len({status(p.address)["training"]["applied_round"] for p in cluster.peers.values()}) == 1,
                 60.0, "both peers to apply the last round")
        # The leader's record of the last round waits for its held-out evaluation (peer/heldout.py).
        last = status(cluster.peers["a"].address)["training"]["applied_round"]
        wait_for(lambda: all([r.round for r in timeline_file.read(cluster.workdir / s)][-1:] == [last] for s in SITES),
                 30.0, "every site's record of the last round")
        yield cluster
    finally:
        cluster.close()


def _transferred_round(log: Path) -> int:
    """The round a site caught up to by state transfer, or 0 when it applied every round itself."""
    found = re.findall(r"caught up by state transfer from \S+: round (\d+)", log.read_text())
    return int(found[0]) if found else 0


@pytest.mark.timeout(420)
def test_every_site_records_every_round_it_applied(run: Cluster) -> None:
    for site in SITES:
        records = timeline_file.read(run.workdir / site)
        applied = status(run.peers[site].address)["training"]["applied_round"]
        # A site whose trainer built after the other had committed rounds alone (a loaded machine)
        # takes θ of that round by state transfer and records from it on; its log must say so. Every
        # round it applied has exactly one record.
        first = _transferred_round(run.peers[site].log_path) or 1
        assert [r.round for r in records] == list(range(first, applied + 1)), f"{site}: one record per round"
        for rec in records:
            assert rec.site == site
            for phase in PHASES:
                assert getattr(rec, f"{phase}_s") >= 0.0
            assert 0.0 <= rec.overhead_share <= 1.0
        trained = [r for r in records if r.tokens > 0]
        assert trained, f"{site} trained no round"
        assert all(r.inner_steps > 0 for r in trained)
        # Compute is booked to the record whose wall time it ran in (RoundClock): with overlap a
        # round may train wholly inside the previous round's record, so its own record holds no
        # compute unless a later round trained meanwhile (never the case for the epoch's last).
        for prev, rec in zip(records, records[1:]):
            if rec.tokens > 0 and rec.compute_s == 0:
                assert prev.compute_s > 0, f"{site}: round {rec.round} trained in no record's wall time"
        if records[0].tokens > 0:
            assert records[0].compute_s > 0, f"{site}: round 1 trained before any record began"
        # A round's phases add up to the site's wall time between two applied rounds.
        assert all(r.exchange_s + r.outer_s + r.persist_s > 0 for r in records)


def test_status_shows_each_sites_last_round(run: Cluster) -> None:
    for site in SITES:
        doc = status(run.peers[site].address)
        last = doc["training"]["last_round"]
        rec = timeline_file.read(run.workdir / site)[-1]
        assert last["round"] == rec.round == doc["training"]["applied_round"]
        assert last["compute_s"] == pytest.approx(rec.compute_s, abs=1e-3)
        assert last["overhead_share"] == pytest.approx(rec.overhead_share, abs=1e-3)
        assert last["tokens_per_s"] == pytest.approx(rec.tokens_per_s, abs=0.1)
    table = ops("status", "--peer", run.peers["a"].address)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("SITE  ROUND"))
    rows = {line.split()[0]: line.split() for line in lines[head + 1:head + 3]}
    assert set(rows) == set(SITES), table.stdout  # b's row comes from b itself
    for site, row in rows.items():
        rec = timeline_file.read(run.workdir / site)[-1]
        assert row[1] == str(rec.round) and row[8] == f"{100 * rec.overhead_share:.0f}%"


def _metrics_url(peer: Peer) -> str:
    """The second line a peer prints names its metrics endpoint (the first, its gRPC address)."""
    assert peer.proc.stdout is not None
    if not hasattr(peer, "metrics_url"):
        line = peer.proc.stdout.readline()
        assert " metrics on " in line, line
        peer.metrics_url = line.strip().rsplit(" ", 1)[-1]  # type: ignore[attr-defined]
    return peer.metrics_url  # type: ignore[attr-defined]


def _scrape(peer: Peer) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """family name -> {labels: value} of one scrape, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(_metrics_url(peer), timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_of_a_live_peer(run: Cluster) -> None:
    pulled = 0.0
    for site in SITES:
        m = _scrape(run.peers[site])
        doc = status(run.peers[site].address)
        assert m["sitemesh_members"][(("state", "alive"),)] == 2
        assert m["sitemesh_members"][(("state", "dead"),)] == 0
        assert m["sitemesh_consensus_epoch"][()] == doc["epoch"] >= 1
        assert m["sitemesh_consensus_leader"] == {(("site", doc["leader"]),): 1.0}
        assert m["sitemesh_rounds_committed_total"][()] == doc["committed_round"]
        assert m["sitemesh_round_applied"][()] == doc["training"]["applied_round"]
        rec = timeline_file.read(run.workdir / site)[-1]
        phases = m["sitemesh_round_last_phase_seconds"]
        assert phases[(("phase", "compute"),)] == pytest.approx(rec.compute_s)
        # Serial rounds: the phases partition the wall time. With overlap compute runs beside the
        # exchange and the commit wait, so they sum to more; either way the metric is the record's.
        assert sum(phases.values()) == pytest.approx(sum(getattr(rec, f"{p}_s") for p in PHASES))
        assert sum(phases.values()) >= rec.wall_s - 1e-6
        assert m["sitemesh_round_last_overhead_ratio"][()] == pytest.approx(rec.overhead_share)
        records = timeline_file.read(run.workdir / site)
        assert m["sitemesh_trainer_tokens_total"][()] == sum(r.tokens for r in records) > 0
        assert m["sitemesh_round_phase_seconds_total"][(("phase", "compute"),)] == pytest.approx(
            sum(r.compute_s for r in records))
        assert m["sitemesh_samples_committed_total"][()] == doc["training"]["samples_committed"] == 141
        assert m["sitemesh_trainer_peak_memory_bytes"][()] > 10 << 20  # a torch process
        assert 0 < m["sitemesh_trainer_loss"][()] < 20
        other = next(s for s in SITES if s != site)
        # A site pulls from the other in every round the other contributed to (its pseudo-gradient or
        # mean shard); on a loaded machine one site may contribute to none, so ask the commit log.
        commits = read_round_commits(run.workdir / site)
        with_other = [r for r, cs in commits if other in {c for c, _ in cs}]
        received = m["sitemesh_exchange_received_bytes_total"][(("peer", other),)]
        assert (received > 0) == bool(with_other), (site, with_other, received)
        pulled += received
        # ... and the other pulled from this site in every round this site contributed to.
        with_me = [r for r, cs in commits if site in {c for c, _ in cs}]
        assert (sum(m["sitemesh_exchange_sent_bytes_total"].values()) > 0) == bool(with_me), (site, with_me)
        assert {k for ((_, k),) in m["sitemesh_exchange_sent_bytes_total"]} <= {
            "pseudo_gradient", "mean_shard", "global_state"}
        assert m["sitemesh_exchange_hash_mismatches_total"][(("peer", other),)] == 0
        assert {k for ((_, k),) in m["sitemesh_lease_events_total"]} >= {"grant", "reclaim", "steal"}
        assert (("reason", "not_leased"),) in m["sitemesh_rounds_excluded_total"]  # every reason, 0 or not
    assert pulled > 0, "no site pulled anything from the other"
    grants = sum(_scrape(run.peers[s])["sitemesh_lease_events_total"][(("kind", "grant"),)] for s in SITES)
    assert grants >= 3, "141 samples in 3 blocks: at least one grant per block"
    leader = next(s for s in SITES if _scrape(run.peers[s])["sitemesh_consensus_is_leader"][()] == 1)
    latency = _scrape(run.peers[leader])
    assert latency["sitemesh_consensus_commit_latency_seconds_count"][()] >= 1


def test_refused_bulk_connections_are_counted_by_status(run: Cluster) -> None:
    """A connection to a site's bulk data plane that is not a bulk request, and one with a token no
    OpenBulk handed out, are refused and show up in sitemesh_exchange_bulk_refused by status."""
    peer = run.peers[SITES[0]]
    host, port = re.findall(r"exchange bulk data plane on (\S+):(\d+)", peer.log())[-1]
    before = _scrape(peer).get("sitemesh_exchange_bulk_refused_total", {})
    for payload in (b"GET / HTTP/1.0\r\n\r\n" + bytes(64), MAGIC + bytes(TOKEN_BYTES) + bytes(4)):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(payload)
            assert sock.recv(1 << 16), "a refused connection gets an error frame before it is closed"
    after = _scrape(peer)["sitemesh_exchange_bulk_refused_total"]
    for code in ("INVALID_ARGUMENT", "UNAUTHENTICATED"):
        key = (("status", code),)
        assert after[key] == before.get(key, 0) + 1, (code, before, after)


def test_report_draws_the_run(run: Cluster, tmp_path: Path) -> None:
    dirs = [run.workdir / s for s in SITES]
    data = report.collect(dirs, heldout_documents=DOCS)
    assert data.sites == list(SITES)
    for site in SITES:
        records = timeline_file.read(run.workdir / site)
        assert data.seconds(site) == [(r.round, r.compute_s, r.wall_s - r.compute_s) for r in records]
        assert data.tokens_cumulative(site)[-1][1] == sum(r.tokens for r in records) > 0
        assert data.loss(site) and all(0 < loss < 20 for _, loss in data.loss(site))
    assert [(e.site, e.kind) for e in data.members] == [("b", "join")]
    assert sum(v["grant"] for v in data.leases.values()) >= 3
    last = status(run.peers["a"].address)["training"]["applied_round"]
    ckpt_rounds = [r for r, _ in data.perplexity]
    assert ckpt_rounds == list(range(3, last + 1, 3)), "every checkpoint evaluated, oldest first"
    initial = report.untrained_perplexity("micro", DOCS)
    assert all(1 < p < initial for _, p in data.perplexity), (data.perplexity, initial)
    out = tmp_path / "report.png"
    result = ops("report", *(a for d in dirs for a in ("--data-dir", str(d))), "--out", str(out),
                 "--heldout-documents", str(DOCS), timeout=120)
    assert result.returncode == 0, result.stderr
    image = matplotlib.image.imread(out)
    assert image.shape[0] > 500 and image.shape[1] > 1000 and image.std() > 0.05  # drawn, not blank
    md = ops("report", *(a for d in dirs for a in ("--data-dir", str(d))), "--format", "md")
    assert md.returncode == 0, md.stderr
    per_round, allocations = md.stdout.split("Allocations:")
    rows = [line for line in per_round.splitlines() if line.startswith(("| a ", "| b "))]
    assert len(rows) == 2 and all(f"| {len(timeline_file.read(run.workdir / r[2]))} |" in r for r in rows)
    assert "| total | 2 |" in allocations, allocations  # each peer's job record (peer/job_record.py)


def test_report_refuses_a_dir_without_rounds(tmp_path: Path) -> None:
    result = ops("report", "--data-dir", str(tmp_path), "--out", str(tmp_path / "r.png"))
    assert result.returncode == 2 and "no round timeline" in result.stderr


def test_status_watch_refreshes_until_interrupted(run: Cluster) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "ops.cli", "status", "--peer", run.peers["a"].address,
                             "--watch", "--interval", "0.3"], stdout=subprocess.PIPE, text=True,
                            env=_env(), cwd=REPO,
                            # SIGINT is what Ctrl-C sends; a test runner started in the background
                            # may ignore it, and children inherit that.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    assert proc.stdout is not None
    stamps = 0
    deadline = time.monotonic() + 60
    while stamps < 3 and time.monotonic() < deadline:
        if "Ctrl-C to stop" in proc.stdout.readline():
            stamps += 1
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0
    assert stamps == 3, "three refreshes (stdout is a pipe: plain repeated tables)"


def test_each_peer_keeps_its_job_record_to_its_exit(run: Cluster) -> None:
    """Runs last: it stops b. Each peer's record says when it trained; b's, after its graceful
    leave, when it exited (peer/job_record.py)."""
    for site in SITES:
        (rec,) = read_dir(run.workdir / site)
        records = timeline_file.read(run.workdir / site)
        assert rec.member == site and rec.job.startswith("local-") and rec.exited is None
        assert rec.inner_steps >= sum(r.inner_steps for r in records) > 0  # a run trained ahead may never commit
        assert rec.first_step is not None and rec.last_step is not None
        assert rec.job_start <= rec.first_step < rec.last_step <= rec.updated
        assert 0 < rec.inner_s <= rec.last_step - rec.first_step + 1.0
    peer = run.peers["b"]
    # The leader said so over the wire (RunComplete): a leave with samples in the last round ends
    # there instead of waiting out the round deadline (docs/decisions/rounds-leave-at-runs-end.md).
    wait_for(lambda: "the run's data is complete: no round after round" in peer.log_path.read_text(), 30.0,
             "the leader's RunComplete at b")
    peer.proc.send_signal(signal.SIGTERM)
    assert peer.proc.wait(timeout=60) == 0
    (rec,) = read_dir(run.workdir / "b")
    assert rec.exited is not None and rec.last_step is not None and rec.last_step <= rec.exited <= time.time()
