"""Round scheduling for DiLoCo outer rounds, sans I/O: the leader grants data and decides.

The leader of the current epoch opens round r = last committed round + 1 once round r-1 is
committed, granting each live site disjoint sample ranges that no commit holds yet (per-round
leases whose only owner is the leader; see protos/sitemesh/v1/rounds.proto). Sites train their
grant from θ_{r-1} and report a `Contribution`. The leader decides when every grant is reported or
the deadline passes: a contribution is admitted only if every range it names lies inside that
site's grant for r and none was committed before (invariant I6); anything else is excluded with a
reason and its samples stay free. The node turns a `Decide` into the outer step and a RoundCommit
proposal; the commit log alone says which samples are trained (I4, I5).

    .venv/bin/python -m pytest tests/unit/test_rounds.py -q
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Union

from peer.commitlog import RoundCommit, SampleRange
from peer.election import Header


@dataclass(frozen=True)
class RoundGrant:
    site: str
    ranges: tuple[SampleRange, ...]


@dataclass(frozen=True)
class RoundOpen:
    header: Header
    round: int
    inner_steps: int
    grants: tuple[RoundGrant, ...]
    deadline_s: float
    base_weights_hash: bytes


@dataclass(frozen=True)
class Contribution:
    header: Header
    round: int
    site: str
    address: str
    tokens: int
    ranges: tuple[SampleRange, ...]
    pseudo_gradient_root: bytes


Message = Union[RoundOpen, Contribution]


@dataclass(frozen=True)
class RoundsConfig:
    inner_steps: int
    """H: inner steps each site runs per round."""
    samples_per_step: int
    """Samples one inner step consumes at a site (the trainer's batch size): a grant is H x this."""
    deadline_s: float
    """How long the leader waits for contributions after opening a round."""

    def __post_init__(self) -> None:
        if self.inner_steps < 1 or self.samples_per_step < 1 or self.deadline_s <= 0:
            raise ValueError("inner_steps, samples_per_step and deadline_s must be positive")


@dataclass(frozen=True)
class Broadcast:
    """Effect: send `msg` to every live member (the node resolves addresses)."""

    msg: RoundOpen


@dataclass(frozen=True)
class Decide:
    """Effect (leader): fetch, verify and average `admitted`, then propose the RoundCommit."""

    round: int
    admitted: tuple[Contribution, ...]
    excluded: tuple[tuple[str, str], ...]
    """(site, reason) of every contribution or grant that is not in the round."""


@dataclass(frozen=True)
class EpochComplete:
    """Effect (leader): every sample of the data epoch is committed exactly once."""

    samples: int


Effect = Union[Broadcast, Decide, EpochComplete]


class Ledger:
    """Which samples of the epoch's blocks are committed, rebuilt from the commit log alone."""

    def __init__(self, blocks: Sequence[tuple[int, int]]) -> None:
        self.blocks = list(blocks)
        """(block_id, num_samples) in epoch order."""
        self._sizes = dict(self.blocks)
        self._committed: dict[int, list[tuple[int, int]]] = {}

    def commit(self, ranges: Iterable[SampleRange]) -> None:
        for r in ranges:
            self._committed.setdefault(r.block_id, []).append((r.start, r.end))
            self._committed[r.block_id].sort()

    def overlaps_committed(self, r: SampleRange) -> bool:
        return any(s < r.end and r.start < e for s, e in self._committed.get(r.block_id, ()))

    def known(self, r: SampleRange) -> bool:
        return r.block_id in self._sizes and 0 <= r.start < r.end <= self._sizes[r.block_id]

    def free(self, taken: Iterable[SampleRange] = ()) -> Iterable[SampleRange]:
        """Free ranges in epoch order, excluding committed samples and `taken` (in-flight grants)."""
        busy: dict[int, list[tuple[int, int]]] = {b: list(v) for b, v in self._committed.items()}
        for r in taken:
            busy.setdefault(r.block_id, []).append((r.start, r.end))
        for block_id, size in self.blocks:
            cursor = 0
            for s, e in sorted(busy.get(block_id, ())):
                if s > cursor:
                    yield SampleRange(block_id, cursor, s)
                cursor = max(cursor, e)
            if cursor < size:
                yield SampleRange(block_id, cursor, size)

    @property
    def total(self) -> int:
        return sum(self._sizes.values())

    @property
    def committed_samples(self) -> int:
        return sum(e - s for v in self._committed.values() for s, e in v)


def _take(free: Iterable[SampleRange], n: int) -> tuple[SampleRange, ...]:
    out: list[SampleRange] = []
    for r in free:
        if n <= 0:
            break
        end = min(r.end, r.start + n)
        out.append(SampleRange(r.block_id, r.start, end))
        n -= end - r.start
    return tuple(out)


def within_grant(r: SampleRange, grant: Sequence[SampleRange]) -> bool:
    """True if the samples of `r` all lie inside one range of `grant`."""
    return any(g.block_id == r.block_id and g.start <= r.start and r.end <= g.end for g in grant)


@dataclass
class _Open:
    round: int
    epoch: int
    deadline: float
    grants: dict[str, tuple[SampleRange, ...]]
    got: dict[str, Contribution] = field(default_factory=dict)
    excluded: list[tuple[str, str]] = field(default_factory=list)


class RoundLeader:
    """The leader's side. Feed it commits, contributions and ticks; it says when to open and decide."""

    def __init__(self, config: RoundsConfig, ledger: Ledger) -> None:
        self.config = config
        self.ledger = ledger
        self._open: _Open | None = None
        self._decided: int | None = None  # round handed to the node, awaiting its commit
        self._epoch_reported = False

    def on_commit(self, commit: RoundCommit) -> None:
        """Every committed round (from the log, on every peer) updates the ledger."""
        for c in commit.contributors:
            self.ledger.commit(c.ranges)
        if self._decided is not None and commit.round >= self._decided:
            self._decided = None
        if self._open is not None and commit.round >= self._open.round:
            self._open = None

    def step_down(self) -> None:
        """Lost the leadership: whatever was open is abandoned; its grants lapse with the round."""
        self._open, self._decided = None, None

    def tick(self, now: float, header: Header, committed_round: int, live_sites: Sequence[str],
             base_hash: bytes) -> list[Effect]:
        if self._decided is not None:
            return []
        if self._open is None:
            return self._maybe_open(now, header, committed_round, live_sites, base_hash)
        o = self._open
        waiting = set(o.grants) - set(o.got) - {site for site, _ in o.excluded}
        # Waiting for a site that membership no longer counts as live cannot pay off: decide now.
        if now >= o.deadline or not waiting & set(live_sites):
            return [self._decide()]
        return []

    def receive(self, msg: Contribution, now: float) -> list[Effect]:
        """Admission of one contribution (I6); returns Decide once every grant has reported."""
        o = self._open
        if o is None or msg.round != o.round:
            return []
        grant = o.grants.get(msg.site)
        reason = ""
        if grant is None:
            reason = f"excluded: {msg.site} holds no grant in round {msg.round}"
        elif msg.site in o.got:
            return []  # a duplicate delivery of what we already admitted
        elif msg.tokens <= 0 or not msg.ranges:
            reason = f"excluded: {msg.site} trained nothing in round {msg.round}"
        else:
            for r in msg.ranges:
                if not self.ledger.known(r) or not within_grant(r, grant):
                    reason = f"excluded: {msg.site} names block {r.block_id} [{r.start}, {r.end}) outside its grant"
                    break
                if self.ledger.overlaps_committed(r):
                    reason = f"excluded: block {r.block_id} [{r.start}, {r.end}) is already committed"
                    break
        if reason:
            o.excluded.append((msg.site, reason))
            return []
        o.got[msg.site] = msg
        return [self._decide()] if set(o.got) == set(o.grants) else []

    def _maybe_open(self, now: float, header: Header, committed_round: int, live_sites: Sequence[str],
                    base_hash: bytes) -> list[Effect]:
        quota = self.config.inner_steps * self.config.samples_per_step
        grants: dict[str, tuple[SampleRange, ...]] = {}
        taken: list[SampleRange] = []
        for site in sorted(live_sites):
            ranges = _take(self.ledger.free(taken), quota)
            if not ranges:
                break
            grants[site] = ranges
            taken.extend(ranges)
        if not grants:
            if not self._epoch_reported and self.ledger.committed_samples == self.ledger.total:
                self._epoch_reported = True
                return [EpochComplete(self.ledger.total)]
            return []
        rnd = committed_round + 1
        self._open = _Open(rnd, header.epoch, now + self.config.deadline_s, grants)
        msg = RoundOpen(header, rnd, self.config.inner_steps,
                        tuple(RoundGrant(s, g) for s, g in sorted(grants.items())), self.config.deadline_s, base_hash)
        return [Broadcast(msg)]

    def _decide(self) -> Decide:
        o = self._open
        assert o is not None
        heard = set(o.got) | {site for site, _ in o.excluded}
        missing = [(s, f"excluded: {s} did not report (deadline passed or it left the mesh)")
                   for s in o.grants if s not in heard]
        self._decided, self._open = o.round, None
        admitted = tuple(o.got[s] for s in sorted(o.got))
        return Decide(o.round, admitted, tuple(o.excluded + missing))
