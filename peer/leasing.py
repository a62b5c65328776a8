"""The node's data-lease edge (DARL): one peer's lease owner and holder cores, fed from the log.

The cores (peer/leases.py, peer/lease_client.py) are pure; this file gives them what the node has:
the commit log (ring views from committed voter sets, committed samples from RoundCommits), the
clock, a transport (`send(site, msg)`), and the disk: the lease-event ledger
`<data dir>/leases/ledger.jsonl` that `ops audit` reads for grant/reclaim/steal counts, and
`<data dir>/leases/boot`, the count of this peer's process starts, so that a restarted primary mints
lease generations above any it minted before (docs/leases.md, "Record and states").

Log entries reach the cores in log order, in batches: of the ring views in one batch only the
newest is given to the cores (a restarted peer replays many; its owner core must see only the
current one, with the one before it as `previous`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from peer.audit import EpochLedger, event_to_json
from peer.commitlog import Entry, RoundCommit, VoterChange, Voters, apply_voter_change
from peer.durable import write_atomic
from peer.election import SiteId
from peer.lease_client import LeaseClient
from peer.lease_types import EventKind, LeaseEvent, Message, Send, to_ranges
from peer.leases import LeaseConfig, LeaseOwner
from peer.ring import RingView
from peer.samples import SampleRange

log = logging.getLogger("sitemesh.leases")


def next_boot(directory: Path) -> int:
    """Bumps and returns this peer's process-start count (0 on the very first start)."""
    path = directory / "boot"
    try:
        boot = int(path.read_text()) + 1
    except FileNotFoundError:
        boot = 0
    except ValueError as err:
        raise ValueError(f"{path} is corrupt ({err}); it must hold one integer: restore it or, if this "
                         "site's lease state is lost anyway, write a number above any start count it had") from None
    write_atomic(path, str(boot))
    return boot


class Leasing:
    """This peer's DARL cores and their inputs; `send(site, msg)` is the transport."""

    def __init__(self, site: str, universe: Mapping[int, int], cfg: LeaseConfig, directory: Path,
                 send: Callable[[SiteId, Message], None], prefetch: int = 2) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.site = SiteId(site)
        self.ledger = EpochLedger(universe)
        """Committed samples of the current data epoch, as this peer's log says."""
        self.boot = next_boot(directory)
        # A restarted process forgot the lease writes it acknowledged, so its records count in no
        # sync before it has lived through a view (docs/decisions/leases-trust-fresh-joiners.md).
        # This site's first process acknowledged nothing before it started: it is trusted at once.
        self.owner = LeaseOwner(self.site, self.ledger, cfg, amnesiac=self.boot > 0, boot=self.boot)
        self.client = LeaseClient(self.site, self.ledger, cfg, prefetch)
        self._send = send
        self._ledger_path = directory / "ledger.jsonl"
        self._voters: Voters = ()
        self._views: list[RingView] = []
        self.event_counts: Counter[str] = Counter()
        """Lease events this peer logged as an owner, by kind (grant, steal, reclaim...): metrics."""

    # ----- the log -------------------------------------------------------------------------
    def apply_entries(self, entries: Sequence[Entry], now: float) -> None:
        """Committed entries, in log order (a restart replays the applied part of its log here)."""
        seen = len(self._views)
        for entry in entries:
            if isinstance(entry.body, VoterChange):
                if self.owner.view is None and entry.body.site == self.site and not entry.body.add:
                    # The log remembers this site as a voter of an earlier process whose data dir
                    # is gone (a boot count of 0): what that process acknowledged is lost.
                    self.owner.live_since = None
                self._voters = apply_voter_change(self._voters, entry.body)
                self._views.append(RingView.of(entry.index, [s for s, _ in self._voters]))
            elif isinstance(entry.body, RoundCommit):
                self.ledger.apply(entry.body.round, [(c.site, c.ranges) for c in entry.body.contributors])
                self._run(self.owner.on_commit(now) + self.client.on_commit(now))
        if len(self._views) > seen:
            previous = self._views[-2] if len(self._views) > 1 else None
            view = self._views[-1]
            epoch = self.owner.leader_epoch  # every epoch noted here, or newer from a lease message
            self._run(self.owner.set_view(view, epoch, now, previous=previous))
            self._run(self.client.set_view(view, epoch, now))
            self._run(self.owner.on_commit(now) + self.client.on_commit(now))

    def note_leader_epoch(self, epoch: int) -> None:
        self.owner.note_leader_epoch(epoch)
        self.client.note_leader_epoch(epoch)

    # ----- transport and timers ------------------------------------------------------------
    def receive(self, msg: Message, now: float) -> None:
        self._run(self.owner.receive(msg, now) + self.client.receive(msg, now))

    def tick(self, now: float) -> None:
        self._run(self.owner.tick(now) + self.client.tick(now))

    # ----- the trainer's side --------------------------------------------------------------
    def take(self, n: int, now: float) -> tuple[SampleRange, ...]:
        """Up to n samples of started, valid leases, in block order; the client notes them trained."""
        return tuple(r for block, spans in self.client.next_samples(n, now) for r in to_ranges(block, spans))

    def end_round(self, round_: int, now: float) -> None:
        """Claim everything taken since the last claim for `round_` (the owners vouch or refuse)."""
        self._run(self.client.end_round(round_, now))

    def release_all(self, now: float) -> None:
        """Give every lease back and take no more (graceful leave, or the run's data is done)."""
        if not self.client.leaving:
            self._run(self.client.release_all(now))

    @property
    def held(self) -> int:
        return len(self.client.held)

    # ----- internals -----------------------------------------------------------------------
    def _run(self, effects: Sequence[Send | LeaseEvent]) -> None:
        events = []
        for effect in effects:
            if isinstance(effect, LeaseEvent):
                events.append(event_to_json(effect))
                self.event_counts[effect.kind.value] += 1
                if effect.kind is not EventKind.GRANT:
                    log.info("lease %s: block %d generation %d %s", effect.kind.value, effect.block, effect.gen,
                             effect.site or "")
            else:
                self._send(effect.to, effect.msg)
        if events:
            # Appended, not fsynced: the ledger feeds the audit's counters only; I4/I5 come from the log.
            with open(self._ledger_path, "a") as fh:
                fh.write("".join(e + "\n" for e in events))
