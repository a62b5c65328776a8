"""Config agreement, sans I/O: what a site trains, and why a site that trains something else is refused.

Every site of a run must train the same model on the same samples cut the same way, or the block IDs
one site leases name nothing (or other tokens) at another, and the mean of the pseudo-gradients mixes
shapes. A site with a trainer publishes what it trains in its membership metadata
(`MemberMeta.labels`, gossiped with every state change and push-pull), one label per part:

    train.model       the architecture (every ModelConfig field but its display name)
    train.tokenizer   vocabulary size and a content hash of the serialised tokenizer
    train.data        seq_len, block_samples, seed, held-out rule, text field, max_documents, and the
                      shards named by content (peer/trainer/identity.py), never by local path

each a JSON object of field -> value. A peer refuses every membership message (a join's push-pull
first) in which the sender's own metadata says it trains something other than the run, with a
one-line reason naming the first differing field: "data config differs from the run's: seq_len 64
here, 128 at a; fix the run file" ("here" is the refused site, which reads it). The run's identity
is this peer's own when it trains, else the one the live trainer members publish; a site that
publishes none (a peer without a trainer) is neither checked nor a reference.
(docs/decisions/security-config-agreement.md)

The 16-bit tag of block IDs (bits 63..48, peer/trainer/blocks.py) is `data_tag`: the tokenizer and
data parts only, so the same corpus under another path gives the same block IDs.

    .venv/bin/python -m pytest -q tests/unit/test_agreement.py
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import blake3

MODEL, TOKENIZER, DATA = "train.model", "train.tokenizer", "train.data"
PARTS = ((DATA, "data config"), (TOKENIZER, "tokenizer"), (MODEL, "model config"))
"""The labels, in the order a refusal names them (data first: it is what makes block IDs foreign)."""

Labels = Iterable[tuple[str, str]]


def _canonical(part: Mapping[str, object]) -> str:
    return json.dumps(dict(part), sort_keys=True, separators=(",", ":"))


def _shown(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def trains(labels: Labels) -> bool:
    """Whether a member publishes a training identity, i.e. has a trainer (TrainingIdentity.from_labels
    is not None), without parsing it."""
    return any(key == part for key, _ in labels for part, _ in PARTS)


@dataclass(frozen=True)
class TrainingIdentity:
    """What a site trains: three parts, each a JSON-able mapping of field -> value."""

    model: Mapping[str, object]
    tokenizer: Mapping[str, object]
    data: Mapping[str, object]

    def labels(self) -> tuple[tuple[str, str], ...]:
        """The membership labels that publish it (each well under the wire's 1,024 characters)."""
        return ((MODEL, _canonical(self.model)), (TOKENIZER, _canonical(self.tokenizer)),
                (DATA, _canonical(self.data)))

    @classmethod
    def from_labels(cls, labels: Labels) -> TrainingIdentity | None:
        """The identity a member publishes; None when it publishes none (no trainer). A label that
        is not a JSON object stands as `{"unreadable": text}`, which differs from any identity."""
        if not trains(labels):
            return None
        got = dict(labels)
        parts: dict[str, Mapping[str, object]] = {}
        for key, _ in PARTS:
            raw = got.get(key, "")
            try:
                value = json.loads(raw)
            except ValueError:
                value = None
            parts[key] = value if isinstance(value, dict) else {"unreadable": raw[:40]}
        return cls(parts[MODEL], parts[TOKENIZER], parts[DATA])

    def part(self, key: str) -> Mapping[str, object]:
        return {MODEL: self.model, TOKENIZER: self.tokenizer, DATA: self.data}[key]

    @property
    def fingerprint(self) -> str:
        """16 hex digits of everything a site trains (for logs and `ops status`)."""
        return blake3.blake3("\n".join(v for _, v in self.labels()).encode()).hexdigest()[:16]

    @property
    def data_tag(self) -> int:
        """The 16-bit tag of this identity's block IDs (`data_tag`)."""
        return data_tag(self.tokenizer, self.data)


def data_tag(tokenizer: Mapping[str, object], data: Mapping[str, object]) -> int:
    """16-bit tag of everything that changes which tokens a block ID denotes: the tokenizer and data
    parts. The model is not in it (another model trains the same blocks)."""
    text = _canonical({"tokenizer": _canonical(tokenizer), "data": _canonical(data)})
    return int.from_bytes(blake3.blake3(text.encode()).digest(2), "big")


def differs(here: TrainingIdentity, there: TrainingIdentity, there_site: str) -> str | None:
    """None when both train the same; else one line for the site with `here`, naming the first
    differing field of the first differing part (and how many more fields differ)."""
    diffs: list[tuple[str, str, object, object]] = []
    for key, name in PARTS:
        mine, theirs = here.part(key), there.part(key)
        for fld in [*mine, *(f for f in theirs if f not in mine)]:
            if mine.get(fld) != theirs.get(fld):
                diffs.append((name, fld, mine.get(fld, "unset"), theirs.get(fld, "unset")))
    if not diffs:
        return None
    name, fld, mine_v, theirs_v = diffs[0]
    more = f" (and {len(diffs) - 1} more field(s))" if len(diffs) > 1 else ""
    return (f"{name} differs from the run's: {fld} {_shown(mine_v)} here, {_shown(theirs_v)} at {there_site}"
            f"{more}; fix the run file")


@dataclass(frozen=True)
class RunIdentity:
    """The identity a site must match to take part, and the site it is taken from."""

    site: str
    identity: TrainingIdentity


def the_runs(own_site: str, own: TrainingIdentity | None,
             live_members: Iterable[tuple[str, Labels]]) -> RunIdentity | None:
    """This peer's own identity when it trains; else the first live member's (by site) that
    publishes one; None when nobody does (nothing to check against)."""
    if own is not None:
        return RunIdentity(own_site, own)
    for site, labels in sorted(live_members, key=lambda m: m[0]):
        if site != own_site and (identity := TrainingIdentity.from_labels(labels)) is not None:
            return RunIdentity(site, identity)
    return None


def check_member(run: RunIdentity | None, site: str, labels: Labels) -> str | None:
    """None: `site`, publishing `labels`, may take part in the run; else the reason it may not,
    phrased for `site`. A site publishing no identity (no trainer) is not checked."""
    if run is None or site == run.site:
        return None
    identity = TrainingIdentity.from_labels(labels)
    if identity is None:
        return None
    return differs(identity, run.identity, run.site)
