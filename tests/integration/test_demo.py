"""`ops demo`, the README's main job, end to end on a micro model: it narrates every round with its
timings, ends with the audit, the baseline and the PNG report."""

from __future__ import annotations

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
    # The log's view (leader, voters, samples) on the last round of each look at the peers, the last one included.
    assert re.match(r" +leader \S+ +voters \S+ +samples 141/141 ", lines[-1][1]), out
    assert "left gracefully" in out
    assert re.search(r"^ +0 +141 +141 +0 +0 .* ok$", out, re.MULTILINE), out  # the audit table
    m = re.search(r"sitemesh ([\d.]+); centralised on the same tokens ([\d.]+) \(ratio ([\d.]+)\)", out)
    assert m and float(m.group(1)) > 1 and float(m.group(2)) > 1, out
    png = re.search(r"^report: (\S+)", out, re.MULTILINE)
    assert png, out
    assert matplotlib.image.imread(png.group(1)).shape[0] > 500
