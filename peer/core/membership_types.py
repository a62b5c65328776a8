"""Value types of the membership protocol: states, metadata, rumours, the five messages, effects.

They mirror `protos/sitemesh/v1/membership.proto` and `common.proto` one to one (field names and
meaning), so the conversion to and from protobuf in the transport layer is mechanical. The core
(`peer.core.membership.Membership`) consumes and produces only these frozen dataclasses; it never sees
protobuf or gRPC. Import them from `peer.core.membership`, which re-exports everything here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class MemberState(enum.Enum):
    """Liveness of a member as one member sees it (proto `MemberState` minus the prefix)."""

    ALIVE = 1
    SUSPECT = 2
    DEAD = 3
    LEFT = 4


LIVE = (MemberState.ALIVE, MemberState.SUSPECT)
"""States of a member counted live: a suspect may still answer, and only DEAD or LEFT ends it."""

# Precedence at equal incarnation (proto: ALIVE < SUSPECT < DEAD, LEFT). LEFT outranks DEAD so that a
# member that left gracefully is never shown DEAD by a late failure detector at the same incarnation.
STATE_RANK: dict[MemberState, int] = {
    MemberState.ALIVE: 0,
    MemberState.SUSPECT: 1,
    MemberState.DEAD: 2,
    MemberState.LEFT: 3,
}


@dataclass(frozen=True)
class MemberMeta:
    """What a member says about itself (proto `MemberMeta`)."""

    site: str
    address: str
    role: str = "voter"
    accelerator: str = ""
    tokens_per_s: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()


LEAVING = ("leaving", "true")
"""The label (`MemberMeta.labels`) a member publishes when its graceful leave starts (`ops leave`,
SIGTERM): its round work still runs, and LEFT comes once that is done, but it will not stay. A
leaving site ends its wait for a round nobody would open when every other live member is leaving
too (peer/core/site_round.py); a new process of the site publishes metadata without it."""


@dataclass(frozen=True)
class MemberUpdate:
    """A rumour about one member: `site` is in `state` at `incarnation`, asserted by `from_site`."""

    site: str
    state: MemberState
    incarnation: int
    meta: MemberMeta | None
    from_site: str


@dataclass(frozen=True)
class Ping:
    """Direct probe; the target answers with an Ack carrying the same seq."""

    seq: int
    from_site: str
    from_address: str
    target_site: str
    updates: tuple[MemberUpdate, ...] = ()


@dataclass(frozen=True)
class Ack:
    """Answer to a Ping, or relayed by an intermediary to a PingReq (then from_site is the relay)."""

    seq: int
    from_site: str
    updates: tuple[MemberUpdate, ...] = ()


@dataclass(frozen=True)
class PingReq:
    """Indirect probe: ask `from_site`'s chosen intermediary to ping the target and relay the Ack."""

    seq: int
    from_site: str
    from_address: str
    target_site: str
    target_address: str
    updates: tuple[MemberUpdate, ...] = ()


@dataclass(frozen=True)
class Nack:
    """The intermediary of a PingReq got no answer from the target within the probe timeout."""

    seq: int
    from_site: str


@dataclass(frozen=True)
class PushPull:
    """Anti-entropy: the sender's whole table. join=True asks a seed to take us in; reply=True answers."""

    from_site: str
    from_address: str
    members: tuple[MemberUpdate, ...]
    join: bool = False
    reply: bool = False


Message = Ping | Ack | PingReq | Nack | PushPull


@dataclass(frozen=True)
class Send:
    """Effect: send `msg` one-way to the member listening at address `to`."""

    to: str
    msg: Message


@dataclass(frozen=True)
class StateChanged:
    """Effect: `site` moved from `old` (None: first heard of) to `new`; `reason` is for logs/tests.
    ALIVE to ALIVE: a new process of `site` at a new address (its view has the address)."""

    site: str
    old: MemberState | None
    new: MemberState
    incarnation: int
    reason: str


class RefusalKind(enum.Enum):
    """Why the membership core refused a rumour or a message, as a kind: logs, metrics and the
    simulator read this, never the human reason (peer/core/membership_guard.py)."""

    MALFORMED = "malformed"
    """A rumour no peer of this version writes: no site name, metadata of another site."""
    OVER_LIMIT = "over limit"
    """An incarnation above `INCARNATION_LIMIT`: its subject could never refute it."""
    JUMP = "jump"
    """An incarnation far above what this peer holds, from a sender other than the subject. An
    honest run makes none; a peer away for very long may see one, and then hears the subject."""
    FULL = "full"
    """A bounded table is full (members, indirect probes in flight): overload or a flood."""


@dataclass(frozen=True)
class Rejected:
    """Effect: a rumour or message this core refused; it changed nothing. `from_site` is the
    message's sender (under mutual TLS the certificate's name), `what` the message type."""

    from_site: str
    what: str
    reason: str
    kind: RefusalKind


Effect = Send | StateChanged | Rejected


@dataclass(frozen=True)
class MemberView:
    """One row of a member's table, as returned by `Membership.members()`."""

    site: str
    address: str
    state: MemberState
    incarnation: int
    last_heard: float
    meta: MemberMeta | None
    rtt_s: float | None = None
    """Round trip of this member's last direct probe (Ping to Ack), transport included; None before one."""
