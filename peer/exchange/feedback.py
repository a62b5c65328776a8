"""Error feedback for the lossy wire formats: what rounding dropped from one round's pseudo-gradient
is added to the next round's, so over many rounds a site sends the sum of its pseudo-gradients up to
one round's rounding error (Seide et al. 2014; Karimireddy et al. 2019), even at 4 bits.

The residual is site-local state: it is not part of θ and no other peer needs it. It lives on disk
beside the site's state, written atomically after each publish, so a restart keeps it. A site that
re-syncs (installs θ by state transfer) resets it: it missed the rounds the residual was meant for.

With a `decay` β < 1 (the sparse wire, SparseLoCo) the residual is an accumulator e ← β e + Δ that
also stands in for the outer momentum: what was not sent fades instead of waiting for ever.

    .venv/bin/python -m pytest tests/unit/test_exchange_feedback.py -q
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from peer.durable import replace_atomic, temp_sibling
from peer.exchange import codec, decoding

log = logging.getLogger("sitemesh.exchange")


class ErrorFeedback:
    """The residual of one site's last sent pseudo-gradient, persisted at `path`."""

    def __init__(self, path: Path, like: Mapping[str, torch.Tensor], decay: float = 1.0) -> None:
        """Loads the residual at `path` if it matches `like`'s names and shapes (else starts at zero).
        `decay`: the factor on the residual before it is added to the next pseudo-gradient."""
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"error-feedback decay {decay} must be in (0, 1]")
        self.path = path
        self.decay = decay
        self.residual: dict[str, torch.Tensor] = {}
        if path.exists():
            held = load_file(path)
            if sorted(held) == sorted(like) and all(held[n].shape == like[n].shape for n in held):
                self.residual = held
                log.info("error feedback: residual of the last round sent loaded from %s", path)
            else:
                log.warning("%s does not match the model; error feedback restarts from zero", path)

    def add_to(self, delta: Mapping[str, torch.Tensor]) -> None:
        """delta += decay x residual, in place: the pseudo-gradient this round must send."""
        for name, t in self.residual.items():
            delta[name].add_(t, alpha=self.decay)

    def keep(self, meant: Mapping[str, torch.Tensor], sent: codec.Encoded) -> None:
        """residual = `meant` - what every peer decodes from `sent`; then written to disk.
        `meant` is consumed (its tensors become the residual)."""
        got = {e.name: torch.empty(e.shape, dtype=meant[e.name].dtype) for e in sent.manifest.layout.tensors}
        decoding.decode(sent, got, made_here=True)  # encoded here: no second hash
        self.residual = {n: meant[n].sub_(got[n]) for n in got}
        tmp = temp_sibling(self.path)
        save_file({n: t.contiguous() for n, t in self.residual.items()}, tmp)
        replace_atomic(tmp, self.path)

    def reset(self) -> None:
        """Forgets the residual, on disk too (a re-synced site: see the module doc)."""
        self.residual = {}
        self.path.unlink(missing_ok=True)
        log.info("error feedback: residual reset (this site re-synced its state)")
