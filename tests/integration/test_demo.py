"""`ops demo`, the README's main job, end to end on a micro model: it narrates every round with its
timings, ends with the audit, the baseline and the PNG report."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib.image
import pytest

from peer import timeline_file
from tests.integration.peers import ops


@pytest.mark.timeout(900)
def test_demo_narrates_every_round_and_compares_with_the_baseline(tmp_path: Path) -> None:
    result = ops("demo", "--sites", "2", "--model", "micro", "--max-documents", "8", "--inner-steps", "4",
                 "--batch-size", "2", "--workdir", str(tmp_path), timeout=840)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "waiting for the sites to join" in out
    (workdir,) = tmp_path.iterdir()
    lines = re.findall(r"^round +(\d+) +[\d.]+s +\d+ tok/s +overhead +\d+% +loss (?:[\d.]+|nan)(.*)$", out, re.MULTILINE)
    last = max(r.round for r in timeline_file.read(workdir / "snellius"))
    assert [int(r) for r, _ in lines] == list(range(1, last + 1)), out  # every round, in order, with its timings
    # Every round as the commit log records it, also one that committed between two looks (the
    # round a site left in, typically): leader, voters, samples through it, θ, held by every peer.
    tails = [re.fullmatch(r" +leader \S+ +voters \S+ +samples (\d+)/141 +θ [0-9a-f]{12} same on all live peers", tail)
             for _, tail in lines]
    assert all(tails), out
    samples = [int(m.group(1)) for m in tails if m]
    assert samples == sorted(samples) and samples[-1] == 141, out
    assert "left gracefully" in out
    assert re.search(r"^ +0 +141 +141 +0 +0 .* ok$", out, re.MULTILINE), out  # the audit table
    m = re.search(r"sitemesh ([\d.]+); centralised on the same tokens ([\d.]+) \(ratio ([\d.]+)\)", out)
    assert m and float(m.group(1)) > 1 and float(m.group(2)) > 1, out
    png = re.search(r"^report: (\S+) .* --reference (\S+) ", out, re.MULTILINE)
    assert png, out
    # The baseline's curve (the PNG draws it beside the mesh's; tests/unit/test_baseline.py): points
    # around the tokens of each checkpoint evaluated, ending with the whole epoch, the verdict's.
    curve = [(p["tokens"], p["perplexity"]) for p in json.loads(Path(png.group(2)).read_text())]
    assert len(curve) > 2 and [t for t, _ in curve] == sorted({t for t, _ in curve}), curve
    assert curve[-1][0] == 141 * 128 and math.isclose(curve[-1][1], float(m.group(2)), rel_tol=1e-3), out
    assert matplotlib.image.imread(png.group(1)).shape[0] > 500
