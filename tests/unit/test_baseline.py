"""The demo's centralised baseline as a curve at the mesh's token counts, and the report drawing it
beside the mesh's held-out curve (issue 37, item 3). A real trainer on the micro preset."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ops import baseline, report
from peer import timeline_file
from peer.core.timeline import RoundTimeline

SEQ = 128


def test_stops_bracket_every_token_count_at_step_boundaries() -> None:
    # batch 24, 100 samples in the epoch: steps end at 24, 48, 72, 96 and 100 (a short last step)
    assert baseline.stops([48 * SEQ], SEQ, 24, 100) == [48]  # on a boundary: that one
    assert baseline.stops([30 * SEQ], SEQ, 24, 100) == [24, 48]  # between: both around it
    assert baseline.stops([98 * SEQ, 100 * SEQ], SEQ, 24, 100) == [96, 100]  # the short last step
    assert baseline.stops([30 * SEQ, 40 * SEQ, 5 * SEQ], SEQ, 24, 100) == [0, 24, 48]


@pytest.mark.timeout(300)
def test_the_baseline_is_evaluated_at_the_mesh_token_counts_and_drawn_beside_the_mesh(tmp_path: Path) -> None:
    """A 2-site mesh of batch 2 per site whose checkpoints were evaluated at rounds 2, 4 and 6: the
    baseline (batch 4) is evaluated at the step boundaries around each of those token counts, its
    pieces make the same run as one uninterrupted `train_round`, and the report's held-out panel
    draws it at those rounds, beside the mesh's curve."""
    docs, sites, batch = 8, 2, 2
    heldout = report.heldout_samples(docs)[:8]
    committed = {2: 16 * SEQ, 4: 30 * SEQ, 6: 141 * SEQ}  # round -> tokens the mesh had committed
    index = baseline.shipped_index(docs)
    curve = baseline.centralised_curve("micro", index, sites, batch, heldout, list(committed.values()),
                                       lr=2e-3)
    assert [t // SEQ for t, _ in curve] == [16, 28, 32, 140, 141]  # 141 samples: the last step is 1
    assert all(math.isfinite(p) and p > 1 for _, p in curve)
    assert baseline.epoch_samples(index) == 141

    # The same trainer on the whole epoch at once ends where the pieces end.
    from peer.trainer.blocks import BlockIndex
    from peer.trainer.config import MODEL_PRESETS, DataConfig, InnerConfig, TrainerConfig
    from peer.trainer.evaluate import perplexity
    from peer.trainer.inner import Trainer

    data = DataConfig.shipped(max_documents=docs)
    index = BlockIndex(data)
    steps = math.ceil(141 / (sites * batch))
    whole = Trainer(TrainerConfig(MODEL_PRESETS["micro"], data, InnerConfig(
        lr=2e-3, batch_size=sites * batch, micro_batch_size=batch, total_steps=steps, warmup_steps=steps // 10)), index=index)
    whole.train_round(whole.model_weights(), [b.full_range() for b in index.epoch_order()], steps)
    assert perplexity(whole.module, heldout, torch.device("cpu"), bf16=False) == curve[-1][1]

    site = tmp_path / "a"
    site.mkdir()
    for r in range(1, 7):
        timeline_file.append(site, RoundTimeline(r, "a", compute_s=1.0, tokens=4 * SEQ, loss=7.0,
                                                 committed_tokens=committed.get(r, committed.get(r - 1))))
    data_ = report.collect([site])
    data_.perplexity = [(2, 900.0), (4, 700.0), (6, 400.0)]  # the checkpoints, as the demo evaluates them
    data_.reference = curve
    points = {t: p for t, p in curve}
    at = data_.reference_at()
    assert [(r, t) for r, t, _ in at] == sorted(committed.items())
    assert at[0][2] == points[16 * SEQ] and at[2][2] == points[141 * SEQ]  # on a boundary: the point itself
    assert min(points[28 * SEQ], points[32 * SEQ]) <= at[1][2] <= max(points[28 * SEQ], points[32 * SEQ])
    lines = {line.get_label(): line for line in report.figure(data_).axes[1].get_lines()}
    assert list(lines["θ checkpoints"].get_xdata()) == [2, 4, 6]
    ref = lines["centralised reference, same tokens"]
    assert list(ref.get_xdata()) == [2, 4, 6] and list(ref.get_ydata()) == [p for _, _, p in at]
