"""Each applied round's numbers as TensorBoard scalars in `<data-dir>/tensorboard/`.

    tensorboard --logdir runs/demo/20261206-101500     # one run per site: SITE/tensorboard

The offline event files torchtitan and most training stacks write (torch.utils.tensorboard), so a
run can be set beside others in the tools people already use. One scalar per tag and round record
(peer/core/timeline.py): this site's mean inner loss, the held-out perplexity where this site
evaluated θ (peer/heldout.py), tokens, round wall, compute and overhead seconds and the phases.

The global step is the tokens the run had committed through the round, not the round: runs with
another H, batch or number of sites then line up at equal training data, as a centralised run
does by its tokens (docs/decisions/heldout-during-run.md). The round is a scalar of its own.

Writing is for people: a failure (a full disk, tensorboard not installed) logs a warning and never
stops a round; after a failed write the next round starts a fresh event file.

Try it:
    .venv/bin/python -m pytest -q tests/unit/test_tensorboard_log.py
"""

from __future__ import annotations

import atexit
import logging
import math
from pathlib import Path
from typing import Any

from peer.core.timeline import PHASES, RoundTimeline

log = logging.getLogger("sitemesh.tensorboard")

TENSORBOARD_DIR = "tensorboard"
FLUSH_S = 2.0
"""The writer's thread puts the scalars on disk within this long: the event loop never waits for a
disk (SummaryWriter's 120 s default would leave a crashed peer's last two minutes unwritten)."""
QUEUE = 1000
"""Events the writer's thread may lag behind (~50 rounds) before `write` waits for it."""


def scalars(record: RoundTimeline) -> dict[str, float]:
    """Tag -> value of one round's record; what a round did not have (no training, no evaluation)
    is left out rather than written as NaN, which TensorBoard draws as a gap in any case."""
    out = {
        "round": float(record.round),
        "tokens/site_round": float(record.tokens),
        "tokens/site_per_s": record.tokens_per_s,
        "time/round_wall_s": record.wall_s,
        "time/compute_s": record.compute_s,
        "time/overhead_s": record.wall_s - record.compute_s,
        "time/overhead_share": record.overhead_share,
        **{f"phase/{p}_s": getattr(record, f"{p}_s") for p in PHASES},
    }
    if record.committed_tokens is not None:
        out["tokens/committed"] = float(record.committed_tokens)
    if not math.isnan(record.loss):
        out["loss/train"] = record.loss
    if record.heldout_perplexity is not None:
        out["eval/heldout_perplexity"] = record.heldout_perplexity
        out["eval/heldout_loss"] = math.log(record.heldout_perplexity)
    if record.heldout_s is not None:
        out["eval/seconds"] = record.heldout_s
    return out


def step(record: RoundTimeline) -> int:
    """The global step: tokens committed through the round (the round in a record without them)."""
    return record.committed_tokens if record.committed_tokens is not None else record.round


class TensorBoardLog:
    """A SummaryWriter opened at the first record; its own thread writes and flushes (FLUSH_S)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._writer: Any = None  # torch.utils.tensorboard.SummaryWriter, imported when first needed
        self._missing = False
        """tensorboard is not installed here: warned once, nothing written."""
        # A peer that stops gracefully exits normally: what is queued reaches the disk then (the
        # writer's thread is a daemon, stopped without a word at exit otherwise).
        atexit.register(self.close)

    def write(self, record: RoundTimeline) -> None:
        if self._missing:
            return
        try:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.log_dir), max_queue=QUEUE, flush_secs=FLUSH_S)
            for tag, value in scalars(record).items():
                self._writer.add_scalar(tag, value, step(record))
        except ImportError as err:
            self._missing = True
            log.warning("TensorBoard event files not written (pip install tensorboard): %s", err)
        except Exception as err:  # noqa: BLE001 - for people: a full disk must not stop the round
            log.warning("round %d: TensorBoard scalars not written: %s", record.round, err)
            self.close()

    def close(self) -> None:
        """Writes what is queued and closes the event file; the next `write` opens a new one."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as err:  # noqa: BLE001 - the background writer already failed: said above
                log.debug("closing the TensorBoard writer: %s", err)
