"""Documents -> tokens -> packed samples, with a held-out split and an on-disk token cache.

Recipe (the GPT-2 / HF `run_clm` "group texts" packing used by the reference C4 runs):
each document is tokenized without special tokens and followed by EOS; a shard's documents are
concatenated in file order and cut into samples of exactly `seq_len` tokens; the tail shorter than
`seq_len` is dropped. The causal-LM loss shifts labels inside the model, so a sample trains
`seq_len - 1` next-token predictions.

A shard is one data file (local .jsonl/.json/.parquet/.txt, optionally .gz, or an hf:// path such
as C4's `en/c4-train.00000-of-01024.json.gz`), read with `datasets` in streaming mode so C4 never
needs to be downloaded whole. A document is held out when a hash of its text says so (or when it
comes from `heldout_shards`), so the held-out set does not depend on document order or site count.

Tokenizing a shard is done once per machine and cached as raw uint32 files (written to a temp name,
then renamed); afterwards any sample is a memory-mapped slice, so reading one block never reads
the blocks before it.

Try it:
    .venv/bin/python -m peer.trainer.data     # tokenizes the shipped corpus, prints sizes
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import blake3
import numpy as np
import torch

from peer.durable import write_atomic
from peer.trainer.config import DataConfig
from peer.trainer.tokenizer import TextTokenizer, load_tokenizer

# Bump when the cached file layout or the packing recipe changes: old caches are then ignored.
CACHE_FORMAT = 1
_ENCODE_BATCH = 256  # documents per tokenizer call: enough to keep the Rust thread pool busy


def is_heldout(text: str, per_mille: int) -> bool:
    """Whether a training-shard document belongs to the held-out split (stable, order-free)."""
    h = int.from_bytes(blake3.blake3(text.encode("utf-8")).digest(8), "little")
    return h % 1000 < per_mille


def _builder(shard: str) -> tuple[str, dict[str, object]]:
    name = shard[:-3] if shard.endswith(".gz") else shard
    if name.endswith((".jsonl", ".json")):
        return "json", {}
    if name.endswith(".parquet"):
        return "parquet", {}
    if name.endswith(".txt"):
        # One row per file rather than per line: a text file is one document.
        return "text", {"sample_by": "document"}
    raise ValueError(f"unsupported data file {shard!r} (want .jsonl, .json, .parquet or .txt)")


def iter_documents(shard: str, text_field: str = "text", max_documents: int | None = None) -> Iterator[str]:
    """The documents of one shard in file order, streamed through `datasets`."""
    from datasets import load_dataset  # heavy import, only needed when a shard is (re)tokenized

    builder, kwargs = _builder(shard)
    ds = load_dataset(builder, data_files=shard, split="train", streaming=True, **kwargs)
    for i, row in enumerate(ds):
        if max_documents is not None and i >= max_documents:
            return
        yield row[text_field]


def _shard_key(cfg: DataConfig, shard: str, heldout_only: bool, tok: TextTokenizer) -> str:
    ident: dict[str, object] = {
        "format": CACHE_FORMAT, "shard": shard, "text_field": cfg.text_field,
        "heldout_per_mille": cfg.heldout_per_mille, "heldout_only": heldout_only,
        "max_documents": cfg.max_documents, "tokenizer": tok.fingerprint,
    }
    if "://" not in shard:
        st = Path(shard).stat()  # a rewritten local file must not reuse its old tokens
        ident["local"] = [os.path.abspath(shard), st.st_size, st.st_mtime_ns]
    return blake3.blake3(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


class Corpus:
    """Tokenized, packed view of a `DataConfig`: per-shard training samples and a held-out set."""

    def __init__(self, cfg: DataConfig, tokenizer: TextTokenizer | None = None) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer or load_tokenizer(cfg.tokenizer)
        self._cache = Path(cfg.cache_dir)
        self._train: dict[int, np.ndarray] = {}

    def _tokenize(self, shard: str, heldout_only: bool) -> tuple[Path, Path]:
        """Cache files (train, heldout) of one shard, tokenizing it if needed."""
        key = _shard_key(self.cfg, shard, heldout_only, self.tokenizer)
        train_p, held_p = self._cache / f"{key}.train.u32", self._cache / f"{key}.heldout.u32"
        if train_p.exists() and held_p.exists():
            return train_p, held_p
        self._cache.mkdir(parents=True, exist_ok=True)
        parts: dict[bool, list[np.ndarray]] = {False: [], True: []}
        eos = self.tokenizer.eos_id

        def flush(docs: list[str]) -> None:
            for text, ids in zip(docs, self.tokenizer.encode_batch(docs)):
                held = heldout_only or is_heldout(text, self.cfg.heldout_per_mille)
                parts[held].append(np.asarray(ids + [eos], dtype=np.uint32))

        batch: list[str] = []
        for text in iter_documents(shard, self.cfg.text_field, self.cfg.max_documents):
            batch.append(text)
            if len(batch) == _ENCODE_BATCH:
                flush(batch)
                batch = []
        flush(batch)
        empty = np.zeros(0, dtype=np.uint32)
        write_atomic(held_p, memoryview(np.concatenate(parts[True]) if parts[True] else empty))
        write_atomic(train_p, memoryview(np.concatenate(parts[False]) if parts[False] else empty))
        return train_p, held_p

    def train_tokens(self, shard_index: int) -> np.ndarray:
        """All training tokens of a shard (memory-mapped after the first call)."""
        if shard_index not in self._train:
            path, _ = self._tokenize(self.cfg.shards[shard_index], heldout_only=False)
            self._train[shard_index] = _load(path)
        return self._train[shard_index]

    def num_samples(self, shard_index: int) -> int:
        return len(self.train_tokens(shard_index)) // self.cfg.seq_len

    def samples(self, shard_index: int, indices: np.ndarray) -> torch.Tensor:
        """Packed samples `indices` of a shard as a [len(indices), seq_len] int64 tensor."""
        toks, L = self.train_tokens(shard_index), self.cfg.seq_len
        n = len(toks) // L
        if len(indices) and (indices.min() < 0 or indices.max() >= n):
            raise IndexError(f"sample index out of range [0, {n}) in shard {shard_index}")
        rows = toks[: n * L].reshape(n, L)[indices]
        return torch.from_numpy(rows.astype(np.int64))

    def heldout(self, num_samples: int, at_most: bool = False) -> torch.Tensor:
        """The fixed evaluation set: `num_samples` packed held-out samples spread evenly over the
        held-out documents of the first shards that hold enough of them (taking only the first
        samples would measure one or two documents). `at_most`: every held-out sample there is when
        the split holds fewer (a small corpus), instead of refusing."""
        L, need, got = self.cfg.seq_len, num_samples * self.cfg.seq_len, []
        sources = [(s, True) for s in self.cfg.heldout_shards] or [(s, False) for s in self.cfg.shards]
        for shard, heldout_only in sources:
            _, path = self._tokenize(shard, heldout_only=heldout_only)
            got.append(_load(path))
            if sum(map(len, got)) >= need:
                break
        toks = np.concatenate(got) if got else np.zeros(0, dtype=np.uint32)
        available = len(toks) // L
        if at_most and available:
            num_samples = min(num_samples, available)
        if available < num_samples:
            raise ValueError(f"held-out split has {available} samples of {L} tokens, {num_samples} requested")
        picks = np.linspace(0, available - 1, num_samples).round().astype(np.int64)
        return torch.from_numpy(toks[: available * L].reshape(available, L)[picks].astype(np.int64))


def _load(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:  # np.memmap refuses empty files
        return np.zeros(0, dtype=np.uint32)
    return np.memmap(path, dtype=np.uint32, mode="r")


def main() -> None:
    cfg = DataConfig.shipped()
    corpus = Corpus(cfg)
    for i, shard in enumerate(cfg.shards):
        n = corpus.num_samples(i)
        print(f"shard {i} {shard}: {len(corpus.train_tokens(i))} train tokens, {n} samples of {cfg.seq_len}")
    print("held-out sample 0:", corpus.tokenizer.decode(corpus.heldout(1)[0].tolist())[:200])


if __name__ == "__main__":
    main()
