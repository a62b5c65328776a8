"""Error feedback: over rounds, what a site sent sums to what it meant to send, up to one round's
rounding error; the residual survives a restart and a mismatched file is ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peer.exchange import codec
from peer.exchange.feedback import ErrorFeedback
from tests.support.exchange import decoded


@pytest.mark.parametrize("wire", [codec.WireDtype.INT8, codec.WireDtype.INT4])
def test_sent_sums_to_meant_up_to_one_rounds_error(tmp_path: Path, wire: codec.WireDtype) -> None:
    g = torch.Generator().manual_seed(1)
    like = {"w": torch.zeros(2000), "b": torch.zeros(3)}
    fb = ErrorFeedback(tmp_path / "r.safetensors", like)
    meant_total = {n: torch.zeros_like(t) for n, t in like.items()}
    sent_total = {n: torch.zeros_like(t) for n, t in like.items()}
    plain_total = {n: torch.zeros_like(t) for n, t in like.items()}  # without feedback, for contrast
    for r in range(30):
        # A small persistent bias under the quantization step of each group: rounding alone drops it.
        delta = {n: torch.randn(t.shape, generator=g) * 1e-3 + 2e-5 for n, t in like.items()}
        for n in delta:
            meant_total[n] += delta[n]
        plain = decoded(codec.encode(delta, round=r, site="s", tokens=1, wire=wire, chunk_size=512))
        fb.add_to(delta)
        enc = codec.encode(delta, round=r, site="s", tokens=1, wire=wire, chunk_size=512)
        fb.keep(delta, enc)
        for n, t in decoded(enc).items():
            sent_total[n] += t
            plain_total[n] += plain[n]
    for n in like:
        # Telescoping: sum(sent) = sum(meant) - last residual, up to fp32 summation error.
        assert torch.allclose(sent_total[n] + fb.residual[n], meant_total[n], atol=1e-6)
    err_fb = float((sent_total["w"] - meant_total["w"]).abs().mean())
    err_plain = float((plain_total["w"] - meant_total["w"]).abs().mean())
    assert err_fb < err_plain / 3, (err_fb, err_plain)


def test_the_residual_survives_a_restart_and_a_mismatch_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "r.safetensors"
    like = {"w": torch.zeros(300)}
    fb = ErrorFeedback(path, like)
    delta = {"w": torch.randn(300) * 1e-3}
    enc = codec.encode(delta, round=1, site="s", tokens=1, wire=codec.WireDtype.INT4)
    fb.keep(delta, enc)
    again = ErrorFeedback(path, like)
    assert torch.equal(again.residual["w"], fb.residual["w"]) and bool(fb.residual["w"].abs().sum() > 0)
    assert ErrorFeedback(path, {"w": torch.zeros(301)}).residual == {}


def test_a_decayed_residual_joins_the_next_pseudo_gradient_scaled_and_a_reset_forgets_it(tmp_path: Path) -> None:
    """The sparse wire's accumulator (SparseLoCo): e <- beta e + delta; a re-synced site starts over."""
    path = tmp_path / "r.safetensors"
    like = {"w": torch.zeros(5000)}
    fb = ErrorFeedback(path, like, decay=0.5)
    delta = {"w": torch.randn(5000)}
    enc = codec.encode(delta, round=1, site="s", tokens=1, wire=codec.WireDtype.SPARSE, keep=64)
    meant = delta["w"].clone()
    fb.keep(delta, enc)
    residual = fb.residual["w"].clone()
    assert torch.equal(residual, meant - decoded(enc)["w"])  # the 4,936 entries not sent, and the rounding
    nxt = {"w": torch.ones(5000)}
    ErrorFeedback(path, like, decay=0.5).add_to(nxt)  # restarted: loaded from disk
    assert torch.equal(nxt["w"], torch.ones(5000).add_(residual, alpha=0.5))
    fb.reset()
    assert fb.residual == {} and not path.exists()
    assert ErrorFeedback(path, like).residual == {}
    with pytest.raises(ValueError, match="decay 0 must be in"):
        ErrorFeedback(path, like, decay=0)
