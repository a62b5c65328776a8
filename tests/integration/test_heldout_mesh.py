"""Held-out quality during a real run: with `--eval-every 1` the leader evaluates the committed θ
after every round it applies, and the perplexity reaches timeline.jsonl, the metrics endpoint,
TensorBoard event files and `ops report` (against a reference at the same tokens).

Two `peer serve --train micro` processes on loopback train a small slice of the shipped corpus to
the end of its data epoch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from peer import timeline_file
from peer.core.timeline import RoundTimeline
from peer.tensorboard_log import TENSORBOARD_DIR
from peer.trainer.blocks import BlockIndex
from peer.trainer.config import DataConfig
from tests.integration.peers import Cluster, ops, status, wait_for
from tests.integration.test_watch_run import _scrape

PRESET = "lan"
DOCS = 8  # 141 samples in 3 blocks: about 9 rounds of two sites
TRAIN = ["--train", "micro", "--max-documents", str(DOCS), "--inner-steps", "4", "--batch-size", "2",
         "--round-deadline", "120", "--start-sites", "2", "--eval-every", "1", "--metrics-listen", "127.0.0.1:0"]
SITES = ("a", "b")
UNTRAINED_PPL = 4096  # the shipped tokenizer's vocabulary: a random model is about uniform over it


def _scalars(data_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(data_dir / TENSORBOARD_DIR))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.timeout(300)
def test_the_leader_evaluates_theta_into_timeline_metrics_tensorboard_and_report(cluster: Cluster) -> None:
    a = cluster.start("a", extra=TRAIN)
    cluster.start("b", join=[a.address], extra=TRAIN)
    wait_for(lambda: any((t := status(p.address)["training"]) and t["epoch_complete"]
                         for p in cluster.peers.values()), 240.0, "the data epoch to complete")
    wait_for(lambda: len({status(p.address)["training"]["applied_round"] for p in cluster.peers.values()}) == 1,
             60.0, "both peers to apply the last round")
    last = status(a.address)["training"]["applied_round"]
    # Where the job's seconds went so far, as `ops status` shows it (outside Slurm: no end, one node).
    job = status(a.address)["training"]["job"]
    assert (job["member"], job["nodes"], job["ends_in_s"]) == ("a", 1, None)
    assert 0 < job["joining_s"] < job["allocated_s"] and 0 < job["training_s"] < job["allocated_s"]
    assert job["goodput"] == pytest.approx(job["training_s"] / job["allocated_s"], abs=0.01)  # of unrounded seconds
    # The last round's record waits for its evaluation (peer/heldout.py) before it is written.
    wait_for(lambda: all([r.round for r in timeline_file.read(cluster.workdir / s)][-1:] == [last] for s in SITES),
             30.0, "every record in timeline.jsonl")
    records = {s: timeline_file.read(cluster.workdir / s) for s in SITES}

    # θ is the same at every site: one evaluation per round, by the leader of the moment.
    evaluated: dict[int, RoundTimeline] = {}
    for site in SITES:
        for rec in records[site]:
            if rec.heldout_perplexity is not None:
                assert rec.round not in evaluated, f"round {rec.round} evaluated twice without a leader change"
                evaluated[rec.round] = rec
    assert len(evaluated) >= last // 2, f"{sorted(evaluated)} of {last} rounds evaluated"
    assert last in evaluated, "the run's last θ is evaluated"
    points = [evaluated[r] for r in sorted(evaluated)]
    for rec in points:
        assert rec.heldout_perplexity is not None and math.isfinite(rec.heldout_perplexity)
        assert 1.0 < rec.heldout_perplexity < 2 * UNTRAINED_PPL
        assert rec.heldout_samples and rec.heldout_s is not None and rec.heldout_s > 0
        assert rec.committed_tokens is not None and rec.committed_tokens > 0
    assert [r.committed_tokens for r in points] == sorted(r.committed_tokens or 0 for r in points)
    assert points[-1].heldout_perplexity < points[0].heldout_perplexity, "training lowers held-out perplexity"
    data = DataConfig.shipped(max_documents=DOCS)
    samples = sum(b.num_samples for b in BlockIndex(data).blocks)
    for site in SITES:  # the epoch's every sample, once: its tokens are what θ_last was trained on
        assert records[site][-1].committed_tokens == samples * data.seq_len

    # The metrics endpoint of the site that evaluated the last round says the same.
    leader = cluster.peers[points[-1].site]
    scraped = _scrape(leader)
    assert scraped["sitemesh_heldout_perplexity"][()] == pytest.approx(points[-1].heldout_perplexity)
    assert scraped["sitemesh_heldout_round"][()] == last

    # TensorBoard: every site's rounds (its loss where it trained), the evaluator's perplexities,
    # at the tokens committed through each round.
    expected = [(r.committed_tokens, pytest.approx(r.heldout_perplexity)) for r in points if r.site == leader.site]
    wait_for(lambda: _scalars(cluster.workdir / leader.site).get("eval/heldout_perplexity") == expected, 30.0,
             "the writer's thread to put the perplexities on disk")
    for site in SITES:
        got = _scalars(cluster.workdir / site)
        assert len(got["round"]) == len(records[site]), site
        assert got["loss/train"], f"{site} wrote no training loss"
        assert got["time/round_wall_s"][-1] == (records[site][-1].committed_tokens,
                                                pytest.approx(records[site][-1].wall_s))

    # ops report: the in-run curve against a centralised reference at the same tokens.
    reference = cluster.workdir / "reference.json"
    reference.write_text(json.dumps([{"tokens": 0, "perplexity": UNTRAINED_PPL},
                                     {"tokens": 10 * samples * data.seq_len, "perplexity": 100.0}]))
    md = ops("report", *[a for s in SITES for a in ("--data-dir", str(cluster.workdir / s))], "--format", "md",
             "--reference", str(reference))
    assert md.returncode == 0, md.stderr
    assert f"round {last} ({samples * data.seq_len} tokens): {points[-1].heldout_perplexity:.1f} (reference" \
        in md.stdout, md.stdout
    png = ops("report", *[a for s in SITES for a in ("--data-dir", str(cluster.workdir / s))],
              "--out", str(cluster.workdir / "report.png"), "--reference", str(reference))
    assert png.returncode == 0 and (cluster.workdir / "report.png").stat().st_size > 0, png.stderr
