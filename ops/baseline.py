"""The centralised baseline `ops demo` judges the mesh by, as a held-out curve by tokens trained.

One trainer (peer/trainer/inner.py, the sites' own class) from the same seeded θ_0 with every
site's batch at once (sites x batch), on every sample of the data epoch once in the epoch's block
order (the tokens the mesh trained), with the same inner-optimizer defaults, evaluated on the same
held-out samples as the mesh's checkpoints (docs/decisions/ops-demo-baseline.md). It trains in
pieces that end at the step boundaries around each token count the mesh was evaluated at, and is
evaluated there: a piece continues the model, the optimizer state and the LR schedule, so the run is
the one a single `train_round` over the epoch makes, and the report interpolates it at exactly the
mesh's token counts (ops/report.py, `reference_at`).

    .venv/bin/python -c "from ops.baseline import *; print(stops([30720, 366848], seq_len=128, batch=24, total=2866))"
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: it pulls in torch, and `ops` starts fast
    from peer.core.samples import SampleRange
    from peer.trainer.blocks import BlockIndex

__all__ = ["centralised_curve", "epoch_samples", "shipped_index", "stops"]


def stops(tokens: list[int], seq_len: int, batch: int, total: int) -> list[int]:
    """Sample counts at which the baseline is evaluated so that each of `tokens` is bracketed: the
    step boundary at or below it and the one above (one when it falls on a boundary). The last
    step of the epoch may be short, so a boundary past `total` is `total`."""
    out: set[int] = set()
    for t in tokens:
        samples = min(t // seq_len, total)
        below = samples // batch * batch
        out.add(below)
        if below < samples:
            out.add(min(below + batch, total))
    return sorted(out)


def shipped_index(max_documents: int) -> BlockIndex:
    """The blocks of the shipped corpus's first `max_documents` documents, the demo's data. Building
    it reads the corpus (about a second): build it once and hand it to `epoch_samples` and
    `centralised_curve`."""
    from peer.trainer.blocks import BlockIndex
    from peer.trainer.config import DataConfig

    return BlockIndex(DataConfig.shipped(max_documents=max_documents))


def _epoch_queue(index: BlockIndex) -> list[SampleRange]:
    """Every sample of the epoch once, in the epoch's block order (what the mesh commits once each)."""
    return [b.full_range() for b in index.epoch_order()]


def epoch_samples(index: BlockIndex) -> int:
    """Samples in one epoch of `index`."""
    return sum(r.num_samples for r in _epoch_queue(index))


def centralised_curve(model: str, index: BlockIndex, sites: int, batch_size: int, heldout: Any,
                      tokens: list[int], lr: float) -> list[tuple[int, float]]:
    """(tokens trained, held-out perplexity) of the baseline on the data of `index` (`shipped_index`)
    at the `stops` of `tokens` (the mesh's committed tokens at its held-out points) and at the end of
    the epoch, by tokens. `heldout`: the samples the mesh's checkpoints were evaluated on (a
    [n, seq_len] tensor); `lr`: the mesh's inner peak learning rate (the schedule spans the
    baseline's run, as the mesh's spans a site's)."""
    import torch

    from peer.trainer.blocks import take_samples
    from peer.trainer.config import MODEL_PRESETS, InnerConfig, TrainerConfig
    from peer.trainer.evaluate import perplexity
    from peer.trainer.inner import Trainer

    data = index.cfg
    queue = _epoch_queue(index)
    total = epoch_samples(index)
    batch = batch_size * sites
    # Every sample once, as the mesh commits it: the last step takes the short remainder.
    steps = math.ceil(total / batch)
    inner = InnerConfig(lr=lr, batch_size=batch, micro_batch_size=batch_size, total_steps=steps,
                        warmup_steps=min(50, steps // 10))
    trainer = Trainer(TrainerConfig(MODEL_PRESETS[model], data, inner), index=index)
    theta: dict[str, torch.Tensor] | None = trainer.model_weights()  # θ_0, the mesh's start
    out: list[tuple[int, float]] = []
    done = 0
    for stop in stops([*tokens, total * data.seq_len], data.seq_len, batch, total):
        piece, queue = take_samples(queue, stop - done)
        if piece:
            # None after the first piece: go on from the model as the last piece left it.
            trainer.train_round(theta, piece, math.ceil((stop - done) / batch))
            theta = None
        done = stop
        out.append((stop * data.seq_len, perplexity(trainer.module, heldout, torch.device("cpu"), bf16=False)))
    return out
