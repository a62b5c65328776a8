"""What the runtime's parts see of each other: small Protocols instead of the concrete node.

The node (node.py) owns the cores, the server and the timers. The coordinator drives a round
through the node's sends and proposals (`Runtime`); the Admin servicer and the metrics collector
read the node and its coordinator (`PeerView`, `TrainingView`). Declaring what each needs here,
below all of them, keeps imports one way (docs/layers.md): nothing imports the node but the CLI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any, Protocol

from peer.config import PeerConfig
from peer.core.consensus import ConsensusCore
from peer.core.consensus_effects import Status
from peer.core.events import Event
from peer.core.peer_rounds import PeerRounds
from peer.core.lease_types import Message as LeaseMessage
from peer.core.membership_types import MemberView
from peer.core.rounds import Message as RoundMessage
from peer.core.timeline import RoundClock, RoundTimeline
from peer.heldout import HeldOut
from peer.job_record import JobLog
from peer.leasing import Leasing
from peer.peer_events import PeerEvents
from peer.reach import Reach
from peer.training import SiteTraining
from peer.transport.channels import Credentials


class Runtime(Protocol):
    """The node as the coordinator drives it: time, members, the log, the protocol's inputs and the
    sends of a round."""

    config: PeerConfig
    address: str
    data_dir: Path
    creds: Credentials
    events: PeerEvents

    def now(self) -> float: ...

    def members(self) -> list[MemberView]: ...

    def member(self, site: str) -> MemberView | None: ...

    def consensus_status(self) -> Status: ...

    def last_round_entry(self, upto: int | None = None) -> tuple[int, int, bytes]: ...

    def attach(self, rounds: PeerRounds, first: Event | None) -> None: ...

    def feed(self, event: Event) -> None: ...

    def send_round_message(self, address: str, msg: RoundMessage) -> None: ...

    def send_lease_message(self, address: str, msg: LeaseMessage) -> None: ...

    def deliver_lease(self, msg: LeaseMessage) -> None: ...

    def spawn(self, coro: Awaitable[Any]) -> None: ...

    def wake(self) -> None: ...


class TrainingView(Protocol):
    """A training peer's round state as `ops status` and the metrics read it."""

    training: SiteTraining
    leasing: Leasing | None
    clock: RoundClock
    heldout: HeldOut
    job: JobLog
    last_timeline: RoundTimeline | None

    @property
    def samples_total(self) -> int: ...

    @property
    def samples_committed(self) -> int: ...

    @property
    def epoch_complete(self) -> bool: ...

    @property
    def diverged(self) -> str: ...

    @property
    def last_reason(self) -> str: ...


class PeerView(Protocol):
    """The node as its Admin servicer and metrics see it: status to read, join and leave to ask."""

    config: PeerConfig
    events: PeerEvents
    reach: Reach
    """How it reaches the others and is reached (the path column of `ops status`)."""

    @property
    def coordinator(self) -> TrainingView | None: ...

    @property
    def version(self) -> str: ...

    def now(self) -> float: ...

    def uptime_s(self) -> float: ...

    def members(self) -> list[MemberView]: ...

    def consensus_core(self) -> ConsensusCore: ...

    def consensus_status(self) -> Status: ...

    async def join(self, seeds: Iterable[str]) -> int: ...

    async def leave(self) -> int: ...
