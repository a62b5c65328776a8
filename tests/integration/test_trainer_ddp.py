"""The inner loop data-parallel inside a site: 2 gloo processes (DDP) == 1 process on the same batch.

Rank 0 alone is handed the round's arguments (as the node does) and broadcasts them; both ranks
must end bit-identical, and the pseudo-gradient, tokens, cursor and held-out perplexity must match
a single-process trainer with the same site batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from peer.outer import state_dict_hash
from peer.trainer.config import MODEL_PRESETS, DataConfig, InnerConfig, TrainerConfig
from peer.trainer.inner import Trainer

STEPS = 3


def config(cache_dir: str, micro: int) -> TrainerConfig:
    data = DataConfig.shipped(max_documents=40, seq_len=32, block_samples=16, heldout_per_mille=100,
                              cache_dir=cache_dir)
    inner = InnerConfig(lr=3e-3, warmup_steps=1, total_steps=10, batch_size=8, micro_batch_size=micro)
    return TrainerConfig(MODEL_PRESETS["micro"], data, inner, eval_samples=16)


def run(t: Trainer, rank: int) -> dict:
    theta = t.model_weights()
    queue = [b.full_range() for b in t.index.epoch_order()]
    # Only rank 0 knows the round (it talks to the mesh); the other ranks pass None.
    r = t.train_round(theta if rank == 0 else None, queue if rank == 0 else None, STEPS if rank == 0 else None)
    ppl = t.evaluate({n: theta[n] - r.pseudo_gradient[n] for n in theta} if rank == 0 else None)
    return {"pg": r.pseudo_gradient, "tokens": r.tokens, "trained": r.trained, "ppl": ppl,
            "losses": r.losses, "hash": state_dict_hash(t.model_weights())}


def worker(rank: int, store: str, cache_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        result = run(Trainer(config(cache_dir, micro=2)), rank)  # 2 ranks x 2 micro-steps x 2 samples
        hashes: list[str | None] = [None, None]
        dist.all_gather_object(hashes, result["hash"])
        result["all_hashes"] = hashes
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(600)  # ~20 s on an idle 2-core box; minutes when it is shared
def test_two_gloo_ranks_match_one_process(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cache = str(tmp_path / "tokens")
    single = run(Trainer(config(cache, micro=4)), 0)  # also fills the token cache for the workers
    mp.spawn(worker, args=(str(tmp_path / "store"), cache, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in (0, 1))
    assert r0["all_hashes"][0] == r0["all_hashes"][1]  # DDP kept the replicas bit-identical
    assert r0["tokens"] == r1["tokens"] == single["tokens"] == STEPS * 8 * 32
    assert r0["trained"] == r1["trained"] == single["trained"]
    for n, d in single["pg"].items():
        # Summation order differs (per-rank means, then the all-reduce). AdamW's update m/sqrt(v) is
        # sign-like where a gradient is ~0 (embedding rows of rare tokens), so there a rounding
        # difference can move a weight by up to ~lr/1000 per step: atol 1e-5 = 0.3% of one step.
        torch.testing.assert_close(r0["pg"][n], d, rtol=1e-4, atol=1e-5)
    assert r0["losses"] == pytest.approx(single["losses"], rel=1e-5)
    assert r0["ppl"] == r1["ppl"] == pytest.approx(single["ppl"], rel=1e-5)
