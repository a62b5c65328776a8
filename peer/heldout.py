"""Held-out quality during a run: the committed θ evaluated every N rounds, and the round records.

    peer serve --site a --train tiny --eval-every 10 ...   # θ_10, θ_20, ... and the last; 0: never
    .venv/bin/python -m pytest -q tests/unit/test_heldout.py

θ_r is the same at every peer (I7), so one evaluation per round is enough mesh-wide: the leader
makes it. It applies θ_r before it opens round r+1, so the tokens its ledger has committed then
are exactly the ones θ_r was trained on (a lagging follower may count the next round's too), and
a change of leader costs at most a point evaluated twice or not at all. It runs in this site's
trainer process between two rounds (`Trainer.evaluate`, on the fixed held-out set of
TrainerConfig.eval_samples, leaving the model where it was for a round trained ahead), off the
event loop; this site's next round trains once it is done. What that costs per round and why N
defaults as it does: docs/decisions/heldout-during-run.md.

Every applied round's record (peer/core/timeline.py) leaves the node here, in round order, to
timeline.jsonl and to TensorBoard (peer/tensorboard_log.py): a record whose θ is being evaluated
waits for the perplexity, and one closed meanwhile waits behind it. `last` is the newest evaluated
record, for the metrics (sitemesh_heldout_perplexity).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from peer import timeline_file
from peer.core.timeline import RoundTimeline
from peer.tensorboard_log import TENSORBOARD_DIR, TensorBoardLog
from peer.trainer.process import Evaluation

log = logging.getLogger("sitemesh.heldout")

EVAL_SHARE = 0.02
"""At most this share of the rounds' inner compute goes to evaluations by default (issue 37)."""
TRAINED_VS_EVALUATED = 2.0
"""A sample trained (forward, backward, optimizer step) costs at least this many evaluated (a
forward): 2.5 measured on CPU by scripts/bench_heldout, about 3 on accelerators, whose backward is
twice the forward. The low end keeps the default within its share."""


def default_eval_every(eval_samples: int, inner_steps: int, batch_size: int) -> int:
    """The smallest N for which evaluating `eval_samples` every N rounds of `inner_steps` x
    `batch_size` trained samples costs at most EVAL_SHARE of the rounds' compute (of their wall
    time, less still): 80 at the demo's H=10, batch 8 with 256 samples; 1 for H=500, batch 16."""
    per_round = EVAL_SHARE * TRAINED_VS_EVALUATED * inner_steps * batch_size
    return max(1, math.ceil(eval_samples / per_round))


class HeldOut:
    """Decides which applied rounds this peer evaluates, runs the evaluation, and writes every
    record, in round order, once its evaluation (if any) is done."""

    def __init__(self, data_dir: Path, every: int, spawn: Callable[[Coroutine[Any, Any, None]], object]) -> None:
        self.every = every
        self.data_dir = data_dir
        self.board = TensorBoardLog(data_dir / TENSORBOARD_DIR)
        self._spawn = spawn
        """Runs a coroutine on the node's loop (cancelled at stop)."""
        self._held: list[RoundTimeline] = []
        """Records not written yet, oldest first: the first one's θ is being evaluated."""
        self.last: RoundTimeline | None = None
        """The newest record with a held-out perplexity (this peer evaluated its θ)."""

    def due(self, round_: int, leading: bool, last: bool) -> bool:
        """This peer evaluates θ_round: it leads, and the round is a multiple of `every` or the run's
        `last`; never while an evaluation is under way (a slow one skips points, never queues them)."""
        return self.every > 0 and leading and not self._held and (round_ % self.every == 0 or last)

    def closed(self, record: RoundTimeline, evaluate: Callable[[], Awaitable[Evaluation]] | None) -> None:
        """A round's record is closed (θ_round applied here); `evaluate` (when `due`) measures θ_round."""
        self._held.append(record)
        if evaluate is not None:
            self._spawn(self._evaluated(evaluate))
        elif len(self._held) == 1:
            self._flush()

    async def _evaluated(self, evaluate: Callable[[], Awaitable[Evaluation]]) -> None:
        first = self._held[0]
        try:
            result = await evaluate()
        except Exception as err:  # noqa: BLE001 - a lost point of the curve, never a lost round
            log.warning("round %d: held-out evaluation failed: %s", first.round, err)
        else:
            self._held[0] = self.last = replace(first, heldout_perplexity=result.perplexity,
                                                heldout_samples=result.samples, heldout_s=result.seconds)
            log.info("round %d: held-out perplexity %.2f on %d samples, %d tokens committed (%.2fs)",
                     first.round, result.perplexity, result.samples, first.committed_tokens or 0, result.seconds)
        finally:  # also when the node stops mid-evaluation: the records are written without it
            self._flush()

    def _flush(self) -> None:
        held, self._held = self._held, []
        for record in held:
            try:
                timeline_file.append(self.data_dir, record)
            except OSError as err:  # the timeline is for people: a full disk must not stop the round
                log.warning("round %d: timeline not written: %s", record.round, err)
            self.board.write(record)
