"""The invariants of the data-lease simulator (peer/sim/leases_sim.py), checked after every event.

`Truth` is the committed log as the simulation sees it, in the order every peer applies it: the
reference ledger. `LeaseChecker` watches every node's effects: no sample in two commits of a data
epoch (I4); no two sites vouched for the same sample in undecided rounds unless its record was
rebuilt; no lease generation acknowledged as started to two sites. At the end: every epoch exactly
once (I5, via peer/core/audit.py), all finished.

    .venv/bin/python -m pytest tests/sim/test_leases_sim.py -q
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from peer.core.audit import EpochLedger, audit
from peer.core.commitlog import SampleRange
from peer.core.election import SiteId
from peer.core.lease_types import EventKind, LeaseEvent, Send, Spans, StartReply, TrainedReply, fmt, intersect, normalize
from peer.core.ring import RingView
from peer.sim.runner import Simulation


class Truth:
    """The committed log as the simulation sees it (the order every peer applies it in): the reference
    ledger of the invariants, the audit's input and the committed sample set of every epoch."""

    def __init__(self, universe: dict[int, int]) -> None:
        self.ledger = EpochLedger(universe)
        self.index = 0
        """Last log position seen."""
        self.view: RingView | None = None
        self.commits: list[tuple[int, list[tuple[SiteId, tuple[SampleRange, ...]]]]] = []
        self.excluded: list[tuple[str, str]] = []
        """(site, reason) of every report or expected site the round leader left out of a round."""
        self.duplicates: list[str] = []
        self.committed_sets: list[frozenset[tuple[int, int]]] = []
        self._epoch_samples: set[tuple[int, int]] = set()

    def see_view(self, index: int, view: RingView) -> None:
        if index > self.index:
            self.index, self.view = index, view

    def see_commit(self, index: int, rnd: int, included: Iterable[tuple[SiteId, tuple[SampleRange, ...]]]) -> None:
        if index <= self.index:
            return
        self.index = index
        included = list(included)
        applied = self.ledger.apply(rnd, included)
        if applied.duplicated_samples:
            self.duplicates.append(f"round {rnd} commits {applied.duplicated_samples} samples twice in data "
                                   f"epoch {applied.data_epoch} (I4)")
        for _, ranges in included:
            for rg in ranges:
                self._epoch_samples.update((rg.block_id, i) for i in range(rg.start, rg.end))
        if applied.epoch_ended:
            self.committed_sets.append(frozenset(self._epoch_samples))
            self._epoch_samples = set()
        self.commits.append((rnd, included))


class LeaseChecker:
    """Invariants after every event; the end-of-run audit."""

    def __init__(self, truth: Truth, universe: dict[int, int], epochs: int) -> None:
        self.truth = truth
        self.universe = universe
        self.epochs = epochs
        """Data epochs the run must finish (liveness)."""
        self.vouched: dict[tuple[int, int], list[tuple[str, int, Spans]]] = {}
        self.started: dict[tuple[int, int, int], str] = {}
        self.rebuilt: set[tuple[int, int]] = set()
        self.events: list[LeaseEvent] = []
        self.by_kind: dict[str, int] = {}
        """Messages sent, per type (the benchmark's grant and renewal counts)."""
        self._dups_seen = 0

    def after_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> list[str]:
        out: list[str] = []
        truth = self.truth
        if len(truth.duplicates) > self._dups_seen:
            out += [f"t={sim.now:.1f}: {d}" for d in truth.duplicates[self._dups_seen:]]
            self._dups_seen = len(truth.duplicates)
        for e in effects:
            if hasattr(e, "msg"):
                kind = type(e.msg).__name__
                self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            if isinstance(e, LeaseEvent):
                self.events.append(e)
                if e.kind is EventKind.REBUILD:
                    self.rebuilt.add((e.data_epoch, e.block))
            elif isinstance(e, Send) and isinstance(e.msg, StartReply) and e.msg.ok:
                key = (e.msg.header.data_epoch, e.msg.lease.block_id, e.msg.lease.generation)
                if self.started.setdefault(key, e.to) != e.to:
                    out.append(f"t={sim.now:.1f}: generation {key[2]} of block {key[1]} started by "
                               f"{self.started[key]} and {e.to}")
            elif isinstance(e, Send) and isinstance(e.msg, TrainedReply):
                out += self._vouchers(sim.now, e.to, e.msg)
        return out

    def _vouchers(self, t: float, to: str, msg: TrainedReply) -> list[str]:
        ledger = self.truth.ledger
        if msg.round <= ledger.last_round or msg.header.data_epoch != ledger.data_epoch:
            return []
        out = []
        for v in msg.vouched:
            key = (msg.header.data_epoch, v.block_id)
            live = [x for x in self.vouched.get(key, []) if x[1] > ledger.last_round]
            for site, rnd, spans in live:
                clash = intersect(spans, v.spans)
                if (site, rnd) != (to, msg.round) and clash and key not in self.rebuilt:
                    out.append(f"t={t:.1f}: block {v.block_id} samples {fmt(clash)} vouched to {site} "
                               f"(round {rnd}) and {to} (round {msg.round})")
            self.vouched[key] = live + [(to, msg.round, normalize(v.spans))]
        return out

    def at_end(self, sim: Simulation) -> list[str]:
        truth = self.truth
        out = []
        if truth.ledger.data_epoch < self.epochs:
            out.append(f"t={sim.now:.1f}: only {truth.ledger.data_epoch} of {self.epochs} epochs "
                       f"finished (liveness)")
        out += [f"audit: {a}" for a in audit(self.universe, truth.commits, self.events) if not a.ok]
        return out
