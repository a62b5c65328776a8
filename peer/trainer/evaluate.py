"""Held-out perplexity: exp(mean next-token NLL) over a fixed set of packed samples.

The set is `Corpus.heldout(n)`: the first n packed samples of the held-out documents (a hash of each
document's text decides, or C4's validation file in real runs), so every site and every round is
measured on the same tokens. Token-weighted: every sample has seq_len - 1 targets, and losses are
summed in float64 before the mean, so batch size and rank count do not change the value beyond
float rounding.

Try it:
    .venv/bin/python -c "from peer.trainer.inner import demo; demo()"
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from peer.trainer.model import autocast


@torch.no_grad()
def perplexity(
    model: torch.nn.Module,
    samples: torch.Tensor,
    device: torch.device,
    bf16: bool = True,
    batch_size: int = 16,
    world: int = 1,
) -> float:
    """Perplexity of a causal LM on `samples` [n, L]; with world > 1, each rank passes its slice and
    the token losses are summed over the process group."""
    nll = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(samples), batch_size):
            x = samples[i:i + batch_size].to(device)
            with autocast(device, bf16):
                loss = model(input_ids=x, labels=x).loss
            n = x.shape[0] * (x.shape[1] - 1)  # the model's loss is a mean over the shifted targets
            nll += loss.double() * n
            count += n
    finally:
        model.train(was_training)
    if world > 1:
        dist.all_reduce(nll)
        dist.all_reduce(count)
    return math.exp(float(nll / count))
