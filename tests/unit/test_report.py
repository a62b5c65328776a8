"""`ops report` from data dirs written by hand (the real run: tests/integration/test_watch_run.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.image
import pytest

from ops import report
from peer import timeline_file
from peer.core.timeline import RoundTimeline


def _site(root: Path, site: str, rounds: list[tuple[int, float, float, int]], grants: int, steals: int) -> Path:
    d = root / site
    (d / "leases").mkdir(parents=True)
    for r, compute, idle, tokens in rounds:
        timeline_file.append(d, RoundTimeline(r, site, compute_s=compute, idle_s=idle, exchange_s=0.5, tokens=tokens,
                                         loss=8.0 - r))
    events = [{"kind": "grant", "epoch": 0, "block": i, "gen": 1, "site": site, "at": 1.0} for i in range(grants)]
    events += [{"kind": "steal", "epoch": 0, "block": 9, "gen": 2, "site": site, "at": 2.0}] * steals
    (d / "leases" / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return d


def test_panels_data_and_png(tmp_path: Path) -> None:
    a = _site(tmp_path, "a", [(1, 3.0, 1.0, 100), (2, 2.0, 0.5, 80)], grants=2, steals=0)
    b = _site(tmp_path, "b", [(1, 1.0, 3.0, 40), (2, 0.0, 1.0, 0)], grants=1, steals=1)
    data = report.collect([a, b])
    assert data.sites == ["a", "b"]
    assert data.seconds("a") == [(1, 3.0, 1.5), (2, 2.0, 1.0)]  # compute, then everything else
    assert data.tokens_cumulative("b") == [(1, 40), (2, 40)]
    assert data.loss("b") == [(1, 7.0)]  # a round it only applied has no loss
    assert data.leases == {"a": {"grant": 2, "reclaim": 0, "steal": 0}, "b": {"grant": 1, "reclaim": 0, "steal": 1}}
    assert data.members == [] and data.perplexity == []  # no commit log, not evaluated
    out = tmp_path / "r.png"
    report.render(data, out)
    image = matplotlib.image.imread(out)
    assert image.shape[:2] == (760, 1440) and image.std() > 0.05
    md = report.markdown(data)
    assert "| a | 2 | 2 | 180 | 5.0 | 2.5 | 33% | 24 | 6.000 | 2 | 0 | 0 |" in md, md


def test_in_run_heldout_points_and_the_reference_at_the_same_tokens(tmp_path: Path) -> None:
    """The leader (a) evaluated θ_2 and θ_4; b lagged the log and counted round 4's tokens at round 3.
    The reference is drawn at the tokens the mesh had committed at those rounds, log-linearly."""
    for site, rounds in (("a", [(1, 1000, None), (2, 2000, 800.0), (3, 3000, None), (4, 4000, 200.0)]),
                         ("b", [(1, 1000, None), (2, 2000, None), (3, 4000, None), (4, 4000, None)])):
        d = tmp_path / site
        d.mkdir()
        for r, tokens, ppl in rounds:
            timeline_file.append(d, RoundTimeline(r, site, compute_s=1.0, idle_s=0.5, tokens=500, loss=7.0 - r,
                                             committed_tokens=tokens, heldout_perplexity=ppl))
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps([{"tokens": 1000, "perplexity": 1000.0}, {"tokens": 3000, "perplexity": 250.0},
                                     {"tokens": 5000, "perplexity": 100.0}]))
    data = report.collect([tmp_path / "a", tmp_path / "b"], reference=reference)
    assert data.heldout() == [(2, 800.0), (4, 200.0)]
    assert data.committed_tokens()[3] == 3000  # the least any site says
    (r2, t2, ref2), (r4, t4, ref4) = data.reference_at()
    assert (r2, t2, r4, t4) == (2, 2000, 4, 4000)
    assert ref2 == pytest.approx(500.0) and ref4 == pytest.approx(math.sqrt(250.0 * 100.0))  # geometric midpoints
    fig = report.figure(data)
    lines = {line.get_label(): line for line in fig.axes[1].get_lines()}
    ref_line = lines["centralised reference, same tokens"]
    assert list(ref_line.get_xdata()) == [2, 4] and list(ref_line.get_ydata()) == pytest.approx([ref2, ref4])
    assert list(lines["θ during the run"].get_ydata()) == [800.0, 200.0]
    md = report.markdown(data)
    assert "round 2 (2000 tokens): 800.0 (reference 500.0, ratio 1.600)" in md, md
    # The same points as CSV; a point outside the reference's range has no reference value.
    csv_ref = tmp_path / "reference.csv"
    csv_ref.write_text("tokens,perplexity,lr\n3000,250.0,3e-3\n5000,100.0,3e-3\n")
    assert [r for r, _, _ in report.collect([tmp_path / "a"], reference=csv_ref).reference_at()] == [4]


def test_a_malformed_reference_is_refused_with_the_file_named(tmp_path: Path) -> None:
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps([{"tokens": 10}]))
    with pytest.raises(ValueError, match="ref.json: every point needs tokens and perplexity"):
        report.read_reference(bad)
    bad.write_text(json.dumps([{"tokens": 10, "perplexity": -1}]))
    with pytest.raises(ValueError, match="positive"):
        report.read_reference(bad)
