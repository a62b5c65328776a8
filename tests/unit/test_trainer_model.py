"""Model presets: the real Qwen3-0.6B shape (on the meta device), init, the weight dict, config checks."""

from __future__ import annotations

import pytest
import torch

from peer.trainer.config import MODEL_PRESETS, InnerConfig, ModelConfig
from peer.trainer.model import autocast, build_model, count_parameters, hf_config, load_weights, weights


def expected_parameters(c: ModelConfig) -> int:
    """Qwen3 parameter count from the architecture, written out by hand."""
    attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) + 2 * c.head_dim  # q,o,k,v + q/k norms
    mlp = 3 * c.hidden_size * c.intermediate_size
    layer = attn + mlp + 2 * c.hidden_size  # input and post-attention RMSNorm
    embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return embed + c.num_layers * layer + c.hidden_size  # final norm


def test_qwen3_06b_preset_has_the_published_shape() -> None:
    c = MODEL_PRESETS["qwen3-0.6b"]
    hf = hf_config(c)
    assert (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim,
            hf.intermediate_size, hf.vocab_size, hf.tie_word_embeddings) == \
        (1024, 28, 16, 8, 128, 3072, 151_936, True)
    assert hf.rope_parameters["rope_theta"] == 1_000_000.0
    model = build_model("qwen3-0.6b", device=torch.device("meta"))
    assert all(p.device.type == "meta" for p in model.parameters())
    assert count_parameters(model) == expected_parameters(c) == 596_049_920
    # 0.44B without embeddings, as published for Qwen3-0.6B.
    assert round((count_parameters(model) - c.vocab_size * c.hidden_size) / 1e9, 2) == 0.44


@pytest.mark.parametrize("name", ["tiny", "micro", "small"])
def test_small_presets_count(name: str) -> None:
    model = build_model(name, device=torch.device("meta"))
    assert count_parameters(model) == expected_parameters(MODEL_PRESETS[name])


def test_init_is_seeded_and_weight_dict_round_trips() -> None:
    a, b, c = build_model("micro", seed=1), build_model("micro", seed=1), build_model("micro", seed=2)
    wa = weights(a)
    assert "lm_head.weight" not in wa and "model.embed_tokens.weight" in wa  # tied: listed once
    assert all(torch.equal(wa[n], t) for n, t in weights(b).items())
    assert not torch.equal(wa["model.embed_tokens.weight"], weights(c)["model.embed_tokens.weight"])
    load_weights(c, wa)
    x = torch.randint(0, 4096, (2, 8))
    assert torch.equal(a(x).logits, c(x).logits)
    assert a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr()
    with pytest.raises(KeyError, match="missing"):
        load_weights(c, {n: t for n, t in wa.items() if "norm" not in n})


def test_autocast_is_off_on_cpu() -> None:
    with autocast(torch.device("cpu")):
        assert not torch.is_autocast_enabled("cpu")
        y = torch.ones(2, 2) @ torch.ones(2, 2)
    assert y.dtype == torch.float32


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divide"):
        ModelConfig("x", 64, 1, num_heads=3, num_kv_heads=2, head_dim=16, intermediate_size=64, vocab_size=10)
    with pytest.raises(ValueError, match="micro_batch_size"):
        InnerConfig(batch_size=8, micro_batch_size=3)
    with pytest.raises(ValueError, match="lr"):
        InnerConfig(lr=0)
