"""The node's data-lease edge (DARL): one peer's lease cores, their transport and their disk.

The cores and what they take from the log (ring views from committed voter sets, committed samples
from RoundCommits) are pure, in peer/core/lease_log.py (the simulator runs the same code), and are
driven by the node's rounds core (peer/core/peer_rounds.py), which hands their effects to `run`; this
file gives those effects a transport (`send(site, msg)`) and the disk: the lease-event ledger
`<data dir>/leases/ledger.jsonl` that `ops audit` reads for grant/reclaim/steal counts, and
`<data dir>/leases/boot`, the count of this peer's process starts, so that a restarted primary mints
lease generations above any it minted before (docs/leases.md, "Record and states"), and
`<data dir>/leases/owners`, the site whose events the ledger holds (the audit's vouch check). With
`keys` (a TLS run) the owner signs its vouchers and the leader checks them against the run CA.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from peer.core.audit import EpochLedger, event_to_json
from peer.core.lease_log import Effect, LeaseLog
from peer.durable import write_atomic
from peer.core.election import SiteId
from peer.core.lease_client import LeaseClient
from peer.core.lease_types import EventKind, LeaseEvent, Message
from peer.core.lease_config import LeaseConfig
from peer.core.leases import LeaseOwner
from peer.core.vouchers import UNSIGNED, VoucherKeys

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
    """This peer's DARL cores (a `LeaseLog`) and their edges; `send(site, msg)` is the transport."""

    def __init__(self, site: str, universe: Mapping[int, int], cfg: LeaseConfig, directory: Path,
                 send: Callable[[SiteId, Message], None], prefetch: int = 2, keys: VoucherKeys | None = None,
                 tokens_per_sample: int = 0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.boot = next_boot(directory)
        # Whose lease events the ledger holds: `ops audit` checks a committed sample against the
        # vouches of the ledgers it is given, and must know whose ledgers those are.
        write_atomic(directory / "owners", site + "\n")
        self.cores = LeaseLog(SiteId(site), universe, cfg, self.boot, prefetch, keys, tokens_per_sample)
        if keys is None:
            log.warning("leases: %s; a site can forge vouchers, and this peer, when it leads, cannot tell "
                        "(docs/decisions/security-work-credit.md)", UNSIGNED)
        self._send = send
        self._ledger_path = directory / "ledger.jsonl"
        self.event_counts: Counter[str] = Counter()
        """Lease events this peer logged as an owner, by kind (grant, steal, reclaim...): metrics."""

    @property
    def ledger(self) -> EpochLedger:
        """Committed samples of the current data epoch, as this peer's log says."""
        return self.cores.ledger

    @property
    def owner(self) -> LeaseOwner:
        return self.cores.owner

    @property
    def client(self) -> LeaseClient:
        return self.cores.client

    @property
    def held(self) -> int:
        return len(self.cores.client.held)

    def note_leader_epoch(self, epoch: int) -> None:
        self.cores.note_leader_epoch(epoch)

    def run(self, effects: Sequence[Effect]) -> None:
        """Sends the cores' messages and appends their lease events to the ledger file."""
        events = []
        for effect in effects:
            if isinstance(effect, LeaseEvent):
                events.append(event_to_json(effect))
                self.event_counts[effect.kind.value] += 1
                if effect.kind not in (EventKind.GRANT, EventKind.VOUCH):  # one of each per lease or claim
                    log.info("lease %s: block %d generation %d %s", effect.kind.value, effect.block, effect.gen,
                             effect.site or "")
            else:
                self._send(effect.to, effect.msg)
        if events:
            # Appended, not fsynced: the ledger feeds the audit's counters only; I4/I5 come from the log.
            with open(self._ledger_path, "a") as fh:
                fh.write("".join(e + "\n" for e in events))
