"""What a site trains, independent of where its files lie: the parts of `peer.core.agreement.TrainingIdentity`.

A shard is named by what it is, not where: an hf:// path names a file of a dataset repository (the
same string on every site), a local file by its size and a blake3 hash of its bytes. The hash of a
local file is cached under the data config's `cache_dir`, keyed by (absolute path, size, mtime), so
a start re-reads no file it has hashed before: one stat and one small read per shard (a 3 MB shard
hashes in ~1 ms, a 300 MB C4 file in ~0.2 s, once). Same corpus under another path: same identity,
same block IDs; a rewritten file: another hash.

    .venv/bin/python -c "from peer.trainer.identity import *; from peer.trainer.config import *; print(training_identity(TrainerConfig(MODEL_PRESETS['tiny'], DataConfig.shipped())).labels())"
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import blake3

from peer.core.agreement import TrainingIdentity
from peer.durable import write_atomic
from peer.trainer.config import DataConfig, ModelConfig, TrainerConfig
from peer.trainer.tokenizer import TextTokenizer, load_tokenizer

_CHUNK = 16 << 20  # bytes hashed per read: big enough for blake3's threads, small enough for memory


def shard_identity(shard: str, cache_dir: str | Path) -> str:
    """`shard` named by content: hf:// paths as they are, local files as "blake3:<32 hex>:<size>"."""
    if "://" in shard:
        return shard
    path = os.path.abspath(shard)
    st = os.stat(path)
    key = blake3.blake3(json.dumps([path, st.st_size, st.st_mtime_ns]).encode()).hexdigest()[:32]
    cached = Path(cache_dir) / "content" / f"{key}.json"
    try:
        return str(json.loads(cached.read_text())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    ident = f"blake3:{digest.hexdigest()[:32]}:{st.st_size}"
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cached, json.dumps({"id": ident, "path": path}))
    except OSError:
        pass  # a read-only cache costs a re-hash at the next start, nothing else
    return ident


def _files(shards: Sequence[str], cache_dir: str) -> str:
    """A list of shards as one short value: their count and a hash of their identities, in order
    (shard order is part of the block IDs)."""
    if not shards:
        return "none"
    ids = [shard_identity(s, cache_dir) for s in shards]
    return f"{len(ids)} file(s), content {blake3.blake3(json.dumps(ids).encode()).hexdigest()[:16]}"


def data_identity(cfg: DataConfig) -> dict[str, object]:
    """Every field of the data config that changes which samples exist, without `cache_dir` and with
    the shards named by content."""
    return {
        "shards": _files(cfg.shards, cfg.cache_dir), "heldout_shards": _files(cfg.heldout_shards, cfg.cache_dir),
        "seq_len": cfg.seq_len, "block_samples": cfg.block_samples, "seed": cfg.seed,
        "text_field": cfg.text_field, "heldout_per_mille": cfg.heldout_per_mille,
        "max_documents": cfg.max_documents,
    }


def tokenizer_identity(tok: TextTokenizer) -> dict[str, object]:
    """The vocabulary size (readable in a refusal) and the hash of the serialised tokenizer."""
    return {"vocab_size": tok.vocab_size, "content": tok.fingerprint[:16]}


def model_identity(model: ModelConfig) -> dict[str, object]:
    """Every architecture field; the preset's display name is not one."""
    fields = asdict(model)
    fields.pop("name")
    return fields


def data_tag(cfg: DataConfig, tok: TextTokenizer) -> int:
    """The 16-bit tag of this data config's block IDs (peer.core.agreement.data_tag)."""
    return TrainingIdentity({}, tokenizer_identity(tok), data_identity(cfg)).data_tag


def training_identity(cfg: TrainerConfig, tok: TextTokenizer | None = None) -> TrainingIdentity:
    """What a site with this trainer config trains (loads the tokenizer unless given)."""
    tok = tok or load_tokenizer(cfg.data.tokenizer)
    # The wire format is part of what a site sends: every site must encode alike (a sparse site's
    # manifests name its entries per group, which another density's peers would refuse every round).
    model = {**model_identity(cfg.model), "wire": cfg.wire, "wire_keep": cfg.sparse_keep}
    return TrainingIdentity(model, tokenizer_identity(tok), data_identity(cfg.data))
