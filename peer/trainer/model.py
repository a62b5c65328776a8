"""Qwen3 models from presets (random init, no downloads), devices, and the flat weight view.

The model is `transformers.Qwen3ForCausalLM` built from a `Qwen3Config` in code, so a checkpoint
written with `save_pretrained` loads with `AutoModelForCausalLM.from_pretrained(dir)`.

The mesh sees a model as its *weight dict*: `{name: fp32 tensor}` from `named_parameters()`,
which lists a tied embedding once (`model.embed_tokens.weight`; `lm_head.weight` is the same tensor).
Pseudo-gradients, the outer momentum and the weight hash all use these names.

Try it:
    .venv/bin/python -c "from peer.trainer.model import build_model, count_parameters as c; import torch; print(c(build_model('qwen3-0.6b', device=torch.device('meta'))))"
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from peer.trainer.config import MODEL_PRESETS, ModelConfig


def resolve_model_config(preset: str | ModelConfig, vocab_size: int | None = None) -> ModelConfig:
    """A preset by name (or a config as is), with the vocabulary widened to the tokenizer's if needed."""
    cfg = MODEL_PRESETS[preset] if isinstance(preset, str) else preset
    if vocab_size is not None and vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer has {vocab_size} tokens but model {cfg.name} only {cfg.vocab_size} rows")
    return cfg


def hf_config(cfg: ModelConfig) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
        initializer_range=cfg.initializer_range, attention_dropout=0.0, use_cache=False,
        # Pre-training with packed samples: no padding, so the plain causal mask is exact.
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )


def build_model(preset: str | ModelConfig, device: torch.device | None = None, seed: int = 0) -> Qwen3ForCausalLM:
    """A randomly initialised fp32 Qwen3 (same init for the same seed). On the meta device: no memory."""
    cfg = resolve_model_config(preset)
    device = device or torch.device("cpu")
    if device.type == "meta":
        with torch.device("meta"):
            return Qwen3ForCausalLM(hf_config(cfg))
    # Initialise on CPU under a fixed seed, then move: every site and every process of a site gets
    # the same θ_0 regardless of its accelerator's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(hf_config(cfg))
    return model.to(device=device, dtype=torch.float32)


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def pick_device(spec: str = "auto") -> torch.device:
    """"auto": the local accelerator (CUDA, or ROCm which torch also calls cuda) else CPU."""
    if spec != "auto":
        return torch.device(spec)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def autocast(device: torch.device, enabled: bool = True) -> AbstractContextManager[object]:
    """bf16 autocast on accelerators; a no-op on CPU, which trains fp32 (bf16 is ~13x slower there)."""
    if enabled and device.type in ("cuda", "xpu", "hpu"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weight dict: fp32 CPU copies of every unique parameter, by name."""
    return {n: p.detach().to("cpu", torch.float32, copy=True) for n, p in model.named_parameters()}


@torch.no_grad()
def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a weight dict into the model in place (names must match exactly)."""
    params = dict(model.named_parameters())
    if params.keys() != state.keys():
        missing, extra = params.keys() - state.keys(), state.keys() - params.keys()
        raise KeyError(f"weight names differ: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    for name, p in params.items():
        p.copy_(state[name])
