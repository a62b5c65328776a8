"""Rounds trained ahead (overlap) at the training edge, with a real trainer process (micro preset):
where the round after one goes on from (peer/training.py `SiteTraining.train`).

    .venv/bin/python -m pytest -q tests/integration/test_site_training_ahead.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from peer.core.commitlog import Contributor, RoundCommit
from peer.core.samples import SampleRange
from peer.outer import state_dict_hash
from peer.trainer.config import MODEL_PRESETS, DataConfig, TrainerConfig
from peer.trainer.tensor_files import read_state
from peer.outer_config import OuterConfig
from peer.training import SiteTraining

STEPS = 2


def test_after_a_round_ahead_that_no_fold_reached_the_next_starts_from_the_newest_applied_theta(
        tmp_path: Path) -> None:
    """Round 2 trains ahead of θ_1, which is applied only after its last step: no fold reaches it,
    so the trainer's model stays on this site's own line (θ_0 - Δ_1 - Δ_2), never brought back to a
    committed θ. Round 3, also ahead (θ_2 is not there yet), must start from θ_1, the newest θ
    applied here, not go on from that line (a defect once: in the demo each site drifted on its own
    line and the held-out perplexity ended above the untrained model's)."""
    t = SiteTraining("a", tmp_path / "a", TrainerConfig(MODEL_PRESETS["micro"], DataConfig.shipped()), OuterConfig())
    starts: list[tuple[int, str | None]] = []
    train = t.process.train

    async def recording(round_: int, weights_path: Any, *args: Any, **kwargs: Any) -> Any:
        start = None if weights_path is None else state_dict_hash(read_state(weights_path))
        starts.append((round_, start))
        return await train(round_, weights_path, *args, **kwargs)

    t.process.train = recording  # type: ignore[method-assign]

    async def scenario() -> None:
        await t.start()
        try:
            (b1, n1), (b2, n2), (b3, n3) = t.blocks[:3]
            one = await t.train(1, [SampleRange(b1, 0, n1)], STEPS)
            two = await t.train(2, [SampleRange(b2, 0, n2)], STEPS, ahead=True)
            assert two.folded_at is None, "θ_1 was not applied while round 2 trained"
            commit_1 = await t.outcome(1, [("a", "", one.root, one.tokens)])
            await t.install(1, RoundCommit(1, (Contributor("a", one.tokens, one.ranges, one.root),),
                                           commit_1.weights_hash), commit_1)
            await t.train(3, [SampleRange(b3, 0, n3)], STEPS, ahead=True)
        finally:
            await t.close()
        theta_0 = starts[0][1]
        assert theta_0 is not None, "round 1 (serial) starts from θ_0"
        assert starts[1] == (2, None), "round 2 goes on from the model round 1 left"
        assert starts[2] == (3, t.weights_hash.hex()), "round 3 starts from θ_1, not from the site's own line"
        assert t.weights_hash.hex() != theta_0, "θ_1 moved: the check above tells the two apart"

    asyncio.run(scenario())
