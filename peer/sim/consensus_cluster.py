"""The consensus cores of a simulated cluster, their disks and the invariant checks (I1-I3).

`Cluster` holds one `ConsensusCore` per site, its "disk" (`MemoryStore`) and its applied state (a
hash chain of the applied entries), executes each core's effects in order as the node does, and
raises `Violation` the moment an invariant breaks (architecture.md I1-I3, docs/consensus.md):

  I1 at most one leader per epoch; a message with a stale epoch never changes the receiver's state;
  I2 no two different entries committed for one round or one index, on any two peers;
  I3 a committed entry is never lost: every new leader's log holds all of them;
  apply exactly once and in order (checked through a hash chain every peer computes);
  lease: at most one leader with a valid lease at any real time (`check_leases`).

It is transport-agnostic: `Lockstep` (peer/sim/lockstep.py) and the seeded scenario
(peer/sim/consensus_sim.py) deliver its messages.

    .venv/bin/python -m pytest tests/unit/test_election_core.py -q
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from peer.core.commitlog import DurableState, Entry, RoundCommit, encode_entry
from peer.core.consensus import ConsensusCore, fencing_epoch
from peer.core.consensus_checks import Message, RefusalKind
from peer.core.consensus_effects import Committed, Effect, LeaderChanged, Rejected, Send, SnapshotInstalled
from peer.core.election import ElectionConfig, Role, SiteId
from peer.logstore import MemoryStore

SIM_CONFIG = ElectionConfig(election_timeout_min_s=0.3, election_timeout_max_s=0.6, heartbeat_interval_s=0.05,
                            max_clock_drift=0.01, max_batch=16)


class Violation(AssertionError):
    pass


@dataclass
class _App:
    """A peer's applied state: the hash chain of applied entries (stands in for θ and the ledger)."""

    index: int = 0
    chain: bytes = b""


def _chain(prev: bytes, entry: Entry) -> bytes:
    return hashlib.blake2b(prev + encode_entry(entry), digest_size=16).digest()


def _fingerprint(c: ConsensusCore) -> tuple[object, ...]:
    return (c.role, c.hard, c.leader, c.commit_index, c.applied_index, c.log.snapshot, list(c.log.entries),
            c.votes.copy(), c.election_deadline, dict(c.match_index), dict(c.next_index))


@dataclass
class Cluster:
    """Cores, their disks and the invariant checker. Transport-agnostic: callers deliver messages."""

    config: ElectionConfig
    seed: int
    founders: dict[SiteId, str]
    boot: bool = True
    """Start the founders at time 0 (False: the caller starts every peer, e.g. the runner's factory)."""
    core_type: type[ConsensusCore] = ConsensusCore
    cores: dict[SiteId, ConsensusCore | None] = field(default_factory=dict)
    disks: dict[SiteId, MemoryStore] = field(default_factory=dict)
    apps: dict[SiteId, _App] = field(default_factory=dict)
    leaders: dict[int, SiteId] = field(default_factory=dict)
    committed: dict[int, Entry] = field(default_factory=dict)
    commit_epochs: dict[int, int] = field(default_factory=dict)
    rounds: dict[int, Entry] = field(default_factory=dict)
    chains: dict[int, bytes] = field(default_factory=dict)
    history: list[tuple[SiteId, Message]] = field(default_factory=list)
    """Messages delivered so far, for the `replay` fault."""
    events: int = 0

    def __post_init__(self) -> None:
        if self.boot:
            for site in sorted(self.founders):
                self.start(site, 0.0)

    def address(self, site: SiteId) -> str:
        return f"{site}:7000"

    def start(self, site: SiteId, now: float) -> None:
        """Start (or restart, from its disk) the peer `site`; a new site that is no founder joins."""
        if site not in self.disks:
            disk = MemoryStore()
            fresh = DurableState.fresh(self.founders if site in self.founders else None)
            disk.save_hard_state(fresh.hard)
            disk.write_log(1, tuple(fresh.entries))
            self.disks[site], self.apps[site] = disk, _App()
        rng = random.Random(f"{self.seed}/{site}/{self.events}")
        self.cores[site] = self.core_type.start(site, self.address(site), self.config, self.disks[site].load(),
                                                now, rng, self.apps[site].index)

    def crash(self, site: SiteId) -> None:
        self.cores[site] = None

    def live(self) -> list[SiteId]:
        return [s for s, c in sorted(self.cores.items()) if c is not None]

    def core(self, site: SiteId) -> ConsensusCore:
        c = self.cores[site]
        assert c is not None, f"{site} is down"
        return c

    # ----- driving -----

    def tick(self, site: SiteId, now: float) -> list[Send]:
        return self.execute(site, self.core(site).tick(now))

    def deliver(self, site: SiteId, msg: Message, now: float) -> list[Send]:
        core = self.core(site)
        stale = fencing_epoch(msg) < core.hard.epoch
        before = _fingerprint(core) if stale else None
        effects = core.receive(msg, now)
        if stale and _fingerprint(core) != before:
            raise Violation(f"stale {type(msg).__name__} (epoch {fencing_epoch(msg)}) from {msg.header.from_site} "
                            f"changed {site} at epoch {core.hard.epoch}")
        return self.execute(site, effects)

    def execute(self, site: SiteId, effects: Iterable[Effect]) -> list[Send]:
        """Run effects in order like the node: persist first, collect sends, apply commits."""
        self.events += 1
        sends: list[Send] = []
        disk, app = self.disks[site], self.apps[site]
        for e in effects:
            if disk.persist(e):
                continue
            if isinstance(e, Send):
                sends.append(e)
            elif isinstance(e, Committed):
                self._apply(site, app, e.entry)
            elif isinstance(e, Rejected) and e.kind is RefusalKind.IMPLAUSIBLE:
                raise Violation(f"{site} refused an honest {e.what} from {e.from_site} as implausible: {e.reason}")
            elif isinstance(e, SnapshotInstalled):
                app.index, app.chain = e.snapshot.last_index, e.snapshot.app_state
                self._check_chain(site, app.index, app.chain)
            elif isinstance(e, LeaderChanged) and e.leader == site:
                self._on_leader(site, e.epoch)
        return sends

    # ----- invariants -----

    def _apply(self, site: SiteId, app: _App, entry: Entry) -> None:
        if entry.index != app.index + 1:
            raise Violation(f"{site} applied index {entry.index} after {app.index} (exactly once, in order)")
        known = self.committed.setdefault(entry.index, entry)
        # The first peer to apply an index is the leader that committed it, at its epoch.
        self.commit_epochs.setdefault(entry.index, self.core(site).hard.epoch)
        if known != entry:
            raise Violation(f"index {entry.index} committed as {known} and as {entry} (on {site})")
        if isinstance(entry.body, RoundCommit):
            first = self.rounds.setdefault(entry.body.round, entry)
            if first != entry:
                raise Violation(f"round {entry.body.round} committed twice: {first} / {entry} (on {site})")
        app.index, app.chain = entry.index, _chain(app.chain, entry)
        self._check_chain(site, app.index, app.chain)

    def _check_chain(self, site: SiteId, index: int, chain: bytes) -> None:
        if self.chains.setdefault(index, chain) != chain:
            raise Violation(f"{site} applied state at index {index} differs from another peer's")

    def _on_leader(self, site: SiteId, epoch: int) -> None:
        other = self.leaders.setdefault(epoch, site)
        if other != site:
            raise Violation(f"two leaders in epoch {epoch}: {other} and {site}")
        # Leader completeness (Raft 5.4): a leader of epoch e holds every entry committed before e.
        # (A leader of an older epoch may still appear late, from held votes; it is fenced.)
        log = self.core(site).log
        for index, entry in self.committed.items():
            if self.commit_epochs[index] < epoch and index > log.snapshot.last_index and log.entry(index) != entry:
                raise Violation(f"leader {site} of epoch {epoch} lacks committed index {index} ({entry}); "
                                f"it holds {log.entry(index)}")

    def check_leases(self, local_now: dict[SiteId, float]) -> None:
        """At most one leader whose lease is valid at this instant (each judged by its own clock)."""
        holders = [s for s in self.live() if self.core(s).role is Role.LEADER
                   and local_now[s] < self.core(s)._lease_expiry()]
        if len(holders) > 1:
            raise Violation(f"overlapping leases: {holders} at epochs {[self.core(s).hard.epoch for s in holders]}")

    def compact_all(self, every: int) -> None:
        """Each peer folds its applied log into a snapshot every `every` entries (as after a checkpoint)."""
        for site in self.live():
            core, app = self.core(site), self.apps[site]
            if app.index - core.log.snapshot.last_index >= every:
                self.execute(site, core.compact(app.index, app.chain))
