"""What a site trains (peer/core/agreement.py, peer/trainer/identity.py): path-independent, and a
differing site is refused with a reason naming the field (issue #38).

    .venv/bin/python -m pytest -q tests/unit/test_agreement.py
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from peer.core.agreement import TrainingIdentity, check_member, differs, the_runs, trains
from peer.trainer.blocks import BlockIndex
from peer.trainer.config import MODEL_PRESETS, SHIPPED_CORPUS, SHIPPED_TOKENIZER, DataConfig, TrainerConfig
from peer.trainer.identity import shard_identity, training_identity

DOCS = 8


def _trainer(corpus: Path, cache: Path, **data: object) -> TrainerConfig:
    cfg = DataConfig(shards=(str(corpus),), max_documents=DOCS, cache_dir=str(cache), **data)  # type: ignore[arg-type]
    return TrainerConfig(model=MODEL_PRESETS["micro"], data=cfg)


@pytest.fixture(scope="module")
def two_copies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shipped corpus under two paths and names, as two sites with different layouts hold it."""
    root = tmp_path_factory.mktemp("sites")
    a, b = root / "lumi" / "data" / "docs.jsonl.gz", root / "leonardo" / "scratch" / "corpus-copy.jsonl.gz"
    for p in (a, b):
        p.parent.mkdir(parents=True)
        shutil.copyfile(SHIPPED_CORPUS, p)
    return a, b


def test_the_same_corpus_under_two_paths_has_one_identity_and_the_same_block_ids(
        two_copies: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_copies
    ta, tb = _trainer(a, tmp_path / "cache-a"), _trainer(b, tmp_path / "cache-b")
    ia, ib = training_identity(ta), training_identity(tb)
    assert ia == ib and ia.fingerprint == ib.fingerprint and ia.labels() == ib.labels()
    assert str(a) not in str(ia.labels()) and str(b) not in str(ia.labels()), "no local path in the identity"
    assert differs(ia, ib, "lumi") is None
    blocks_a, blocks_b = BlockIndex(ta.data).blocks, BlockIndex(tb.data).blocks
    assert len(blocks_a) > 1 and [x.block_id for x in blocks_a] == [x.block_id for x in blocks_b]
    assert BlockIndex(ta.data).fingerprint == ia.data_tag, "block IDs carry the identity's data tag"


def _other_tokenizer(tmp: Path) -> str:
    tok = Tokenizer.from_file(str(SHIPPED_TOKENIZER))
    tok.add_tokens(["<|extra|>"])
    path = tmp / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return str(path)


def _other_corpus(tmp: Path) -> str:
    path = tmp / "other.jsonl"
    path.write_text('{"text": "another corpus entirely"}\n' * 400)
    return str(path)


@pytest.mark.parametrize("change, reason, same_blocks", [
    (lambda t, tmp: dataclasses.replace(t, data=dataclasses.replace(t.data, seq_len=64)),
     "data config differs from the run's: seq_len 64 here, 128 at lumi; fix the run file", False),
    (lambda t, tmp: dataclasses.replace(t, data=dataclasses.replace(t.data, seed=3)),
     "data config differs from the run's: seed 3 here, 0 at lumi; fix the run file", False),
    (lambda t, tmp: dataclasses.replace(t, data=dataclasses.replace(t.data, tokenizer=_other_tokenizer(tmp))),
     "tokenizer differs from the run's: vocab_size 4097 here, 4096 at lumi (and 1 more field(s)); fix the run file",
     False),
    (lambda t, tmp: dataclasses.replace(t, data=dataclasses.replace(t.data, shards=(_other_corpus(tmp),))),
     "data config differs from the run's: shards 1 file(s), content ", False),
    (lambda t, tmp: dataclasses.replace(t, model=dataclasses.replace(t.model, hidden_size=64)),
     "model config differs from the run's: hidden_size 64 here, 32 at lumi; fix the run file", True),
    (lambda t, tmp: dataclasses.replace(t, model=dataclasses.replace(t.model, name="renamed")), None, True),
    (lambda t, tmp: dataclasses.replace(t, data=dataclasses.replace(t.data, cache_dir=str(tmp / "elsewhere"))),
     None, True),
])
def test_a_differing_site_is_refused_with_a_reason_naming_the_field(
        change, reason: str | None, same_blocks: bool, two_copies: tuple[Path, Path], tmp_path: Path) -> None:
    run = _trainer(two_copies[0], tmp_path / "cache")
    here = change(run, tmp_path)
    mine, theirs = training_identity(here), training_identity(run)
    got = differs(mine, theirs, "lumi")
    if reason is None:
        assert got is None and mine.fingerprint == theirs.fingerprint
    else:
        assert got is not None and got.startswith(reason) and "\n" not in got, got
        assert mine.fingerprint != theirs.fingerprint
    assert (mine.data_tag == theirs.data_tag) == same_blocks, "the model is not part of block IDs; data is"


def test_a_shards_content_hash_is_cached_and_a_rewritten_file_is_hashed_again(tmp_path: Path) -> None:
    shard, cache = tmp_path / "s.txt", tmp_path / "cache"
    shard.write_text("x" * 1000)
    first = shard_identity(str(shard), cache)
    st = shard.stat()
    assert first.startswith("blake3:") and first.endswith(":1000") and len(list((cache / "content").iterdir())) == 1
    # Same size and mtime: the cache answers without reading the file (its changed bytes go unseen).
    shard.write_text("y" * 1000)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard_identity(str(shard), cache) == first
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # rewritten: a new mtime
    assert shard_identity(str(shard), cache) not in (first, "")
    assert shard_identity("hf://datasets/allenai/c4/en/c4-train.00000-of-01024.json.gz", cache) == \
        "hf://datasets/allenai/c4/en/c4-train.00000-of-01024.json.gz", "a hub path names the same file everywhere"


MODEL = {"hidden_size": 32}
RUN = TrainingIdentity(MODEL, {"vocab_size": 4096, "content": "aa"}, {"seq_len": 128})
OTHER = TrainingIdentity(MODEL, {"vocab_size": 4096, "content": "aa"}, {"seq_len": 64})


@pytest.mark.parametrize("own, members, sender, labels, refused", [
    (RUN, [], "b", RUN.labels(), None),  # the same identity: welcome
    (RUN, [], "b", OTHER.labels(), "data config differs from the run's: seq_len 64 here, 128 at a; fix the run file"),
    (RUN, [], "b", (("leaving", "true"),), None),  # no trainer (a coordinator): not checked
    (None, [], "b", OTHER.labels(), None),  # nobody here trains: nothing to check against
    (None, [("c", RUN.labels()), ("d", OTHER.labels())], "b", OTHER.labels(),
     "data config differs from the run's: seq_len 64 here, 128 at c; fix the run file"),  # the first trainer's
    (RUN, [], "b", (("train.data", "{not json"),),
     "data config differs from the run's: unreadable {not json here, unset at a"),
])
def test_a_member_is_checked_against_the_runs_identity(own: TrainingIdentity | None, members: list,
                                                         sender: str, labels: tuple, refused: str | None) -> None:
    why = check_member(the_runs("a", own, members), sender, labels)
    assert (why is None) if refused is None else (why is not None and why.startswith(refused)), why


def test_a_member_trains_when_it_publishes_an_identity_and_only_then() -> None:
    """A voter without a trainer (a long-lived coordinator) publishes no identity: rounds neither
    open for it nor wait for its report (PeerCore's View.trainerless)."""
    assert trains(RUN.labels()) and TrainingIdentity.from_labels(RUN.labels()) == RUN
    assert not trains(()) and not trains([("leaving", "true")])
    assert TrainingIdentity.from_labels([("leaving", "true")]) is None
