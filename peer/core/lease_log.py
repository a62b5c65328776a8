"""One peer's DARL cores fed from the commit log, sans I/O: the lease owner and holder, and their views.

The cores (peer/core/leases.py owner, peer/core/lease_client.py holder) know nothing of the log; this gives
them what it says: ring views from committed voter sets (the voters that train), committed samples from RoundCommits. Log
entries reach the cores in log order, in batches: of the ring views in one batch only the newest
is given to the cores (a restarted peer replays many; its owner core must see only the current one,
with the one before it as `previous`). Every method returns the cores' effects (Sends and lease
events); the node's edge (peer/leasing.py) sends and records them, the simulator delivers them.

    .venv/bin/python -m pytest -q tests/unit/test_leasing.py
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from peer.core.admission import Credit
from peer.core.audit import EpochLedger
from peer.core.commitlog import (
    Entry, RoundCommit, VoterChange, Voters, apply_trainerless, apply_voter_change, lease_owners
)
from peer.core.ids import SiteId
from peer.core.lease_client import LeaseClient
from peer.core.lease_types import LeaseEvent, Message, Send
from peer.core.lease_config import LeaseConfig
from peer.core.leases import LeaseOwner
from peer.core.ring import RingView
from peer.core.vouchers import VoucherKeys

Effect = Send | LeaseEvent


class LeaseLog:
    """This peer's owner and holder cores and the log-derived inputs they share."""

    def __init__(self, site: SiteId, universe: Mapping[int, int], cfg: LeaseConfig, boot: int,
                 prefetch: int = 2, keys: VoucherKeys | None = None, tokens_per_sample: int = 0) -> None:
        self.site = site
        self.ledger = EpochLedger(universe)
        """Committed samples of the current data epoch, as this peer's log says."""
        # A restarted process forgot the lease writes it acknowledged, so its records count in no
        # sync before it has lived through a view (docs/decisions/leases-trust-fresh-joiners.md).
        # This site's first process acknowledged nothing before it started: it is trusted at once.
        self.owner = LeaseOwner(site, self.ledger, cfg, amnesiac=boot > 0, boot=boot, keys=keys)
        self.credit = Credit(tokens_per_sample, self.accepted_view, keys.verify if keys else None)
        """What this peer checks, when it leads, before crediting a contribution (admission.Credit):
        vouchers of the views `accepted_view` gives, signed as `keys` verify, tokens bounded by
        `tokens_per_sample` (0: unbounded)."""
        self.client = LeaseClient(site, self.ledger, cfg, prefetch)
        self._voters: Voters = ()
        self._trainerless: frozenset[SiteId] = frozenset()
        self._views: list[RingView] = []
        self._round_views = (0, 0)
        """Positions in `_views` of the views in force when the last two RoundCommits were applied
        (so when the round before the one being decided, and that one, opened): vouchers of the
        earlier, the one before it, and any later view are accepted (`accepted_view`)."""

    def apply_entries(self, entries: Sequence[Entry], now: float) -> list[Effect]:
        """Committed entries, in log order (a restart replays the applied part of its log here)."""
        out: list[Effect] = []
        seen = len(self._views)
        for entry in entries:
            if isinstance(entry.body, VoterChange):
                if self.owner.view is None and entry.body.site == self.site and not entry.body.add:
                    # The log remembers this site as a voter of an earlier process whose data dir
                    # is gone (a boot count of 0): what that process acknowledged is lost.
                    self.owner.live_since = None
                self._voters = apply_voter_change(self._voters, entry.body)
                self._trainerless = apply_trainerless(self._trainerless, entry.body)
                self._views.append(RingView.of(entry.index, lease_owners(self._voters, self._trainerless)))
            elif isinstance(entry.body, RoundCommit):
                self._round_views = (self._round_views[1], max(len(self._views) - 1, 0))
                self.ledger.apply(entry.body.round, [(c.site, c.ranges) for c in entry.body.contributors])
                out += [*self.owner.on_commit(now), *self.client.on_commit(now)]
        if len(self._views) > seen:
            previous = self._views[-2] if len(self._views) > 1 else None
            view = self._views[-1]
            epoch = self.owner.leader_epoch  # every epoch noted here, or newer from a lease message
            out += self.owner.set_view(view, epoch, now, previous=previous)
            out += self.client.set_view(view, epoch, now)
            out += [*self.owner.on_commit(now), *self.client.on_commit(now)]
        return out

    def accepted_view(self, version: int) -> RingView | None:
        """The ring view of `version` if vouchers of it are accepted for the round being decided: the
        log's last three views, and every view since the one before the view in force when the
        round before this one opened (a site training ahead claims this round's samples while that
        one is decided; docs/decisions/rounds-overlap-fold.md). Voters change one at a time, a
        restart is two (out, in), and an owner may lag the log a little: an honest voucher names
        one of these (the whole-peer simulator's faults found none older). An older view is not
        accepted, so blocks a site was the primary of long ago (a founder alone owns every block)
        are not its to vouch; before the second round commits, every view of the run's start is."""
        first = min(self._round_views[0] - 1, len(self._views) - 3)
        return next((v for v in self._views[max(first, 0):] if v.version == version), None)

    def note_leader_epoch(self, epoch: int) -> None:
        self.owner.note_leader_epoch(epoch)
        self.client.note_leader_epoch(epoch)

    def receive(self, msg: Message, now: float) -> list[Effect]:
        return [*self.owner.receive(msg, now), *self.client.receive(msg, now)]

    def tick(self, now: float) -> list[Effect]:
        return [*self.owner.tick(now), *self.client.tick(now)]

    def next_deadline(self) -> float:
        times = [self.owner.next_deadline(), self.client.next_deadline()]
        return min((t for t in times if t is not None), default=float("inf"))

    def release_all(self, now: float) -> list[Effect]:
        """Give every lease back and take no more (graceful leave, or the run's data is done)."""
        return [] if self.client.leaving else list(self.client.release_all(now))
