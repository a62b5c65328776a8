"""`ops report` from data dirs written by hand (the real run: tests/integration/test_watch_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image

from ops import report
from peer.core import timeline
from peer.core.timeline import RoundTimeline


def _site(root: Path, site: str, rounds: list[tuple[int, float, float, int]], grants: int, steals: int) -> Path:
    d = root / site
    (d / "leases").mkdir(parents=True)
    for r, compute, idle, tokens in rounds:
        timeline.append(d, RoundTimeline(r, site, compute_s=compute, idle_s=idle, exchange_s=0.5, tokens=tokens,
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
