"""Round scheduling for DiLoCo outer rounds, sans I/O: the leader opens rounds and decides them.

The leader of the current epoch opens round r = last committed round + 1 once round r-1 is
committed, and expects a report from every live site. Which samples a site trains is not the
leader's business: sites train samples they hold data leases on (DARL, peer/lease_client.py) and
report exactly those, with the lease owners' vouchers. The leader decides when every expected site
reported or the deadline passed: `admit_round` (peer/admission.py) includes a contribution only if
every range is vouched for that site and round and none is committed in the data epoch (I6);
anything else is excluded with a reason and its samples go back to free. The node turns a
`Decide` into the outer step and a RoundCommit proposal; the commit log alone says which samples
are trained (I4, I5).

    .venv/bin/python -m pytest tests/unit/test_rounds.py -q
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Union

from peer import admission
from peer.audit import EpochLedger
from peer.commitlog import SampleRange
from peer.election import Header, SiteId
from peer.lease_types import Voucher


@dataclass(frozen=True)
class RoundOpen:
    header: Header
    round: int
    inner_steps: int
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
    """Exactly the samples trained; empty: this site trained nothing this round."""
    pseudo_gradient_root: bytes
    vouchers: tuple[Voucher, ...] = ()

    def accounting(self) -> admission.Contribution:
        return admission.Contribution(SiteId(self.site), self.round, self.ranges, self.vouchers)


Message = Union[RoundOpen, Contribution]


@dataclass(frozen=True)
class RoundsConfig:
    inner_steps: int
    """H: inner steps each site runs per round."""
    samples_per_step: int
    """Samples one inner step consumes at a site (the trainer's batch size): a round is H x this."""
    deadline_s: float
    """How long the leader waits for contributions after opening a round."""
    data_epochs: int = 1
    """Passes over the dataset; no round opens once the log has completed this many."""
    idle_wait_s: float = 1.0
    """After a round in which no site trained anything, wait this long before opening it again."""
    gather_s: float = 2.0
    """A site stops collecting leased samples for a round when none came for this long (its next
    block needs the owner's Start ack; at the end of the data epoch nothing may come at all)."""

    def __post_init__(self) -> None:
        if (self.inner_steps < 1 or self.samples_per_step < 1 or self.deadline_s <= 0 or self.data_epochs < 1
                or self.idle_wait_s < 0 or self.gather_s <= 0):
            raise ValueError("inner_steps, samples_per_step, deadline_s and data_epochs must be positive")

    @property
    def samples_per_round(self) -> int:
        return self.inner_steps * self.samples_per_step


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
    """(site, reason) of every expected site or contribution that is not in the round."""


@dataclass(frozen=True)
class EpochComplete:
    """Effect (leader): the log completed `data_epochs` passes, every sample exactly once per pass."""

    samples: int
    data_epochs: int


Effect = Union[Broadcast, Decide, EpochComplete]


@dataclass
class _Open:
    round: int
    deadline: float
    expected: frozenset[str]
    got: dict[str, Contribution] = field(default_factory=dict)
    """Reports with samples, by site (the first one of each site counts)."""
    idle: set[str] = field(default_factory=set)
    """Sites that reported they trained nothing."""
    dead: set[str] = field(default_factory=set)
    """Sites membership stopped counting as live while the round was open (DEAD or LEFT): one that
    reported is dropped at once, since its pseudo-gradient cannot be fetched any more."""


class RoundLeader:
    """The leader's side. Feed it commits, contributions and ticks; it says when to open and decide.

    `ledger` is the node's EpochLedger of the commit log (the lease cores share it); the node
    folds every RoundCommit into it before calling `on_commit`.
    """

    def __init__(self, config: RoundsConfig, ledger: EpochLedger) -> None:
        self.config = config
        self.ledger = ledger
        self._open: _Open | None = None
        self._decided: int | None = None  # round handed to the node, awaiting its commit
        self._idle_until = float("-inf")
        self._epoch_reported = False

    @property
    def done(self) -> bool:
        """The log completed every data epoch the run asked for."""
        return self.ledger.data_epoch >= self.config.data_epochs

    def on_commit(self, round_: int) -> None:
        """Round `round_` is committed (on every peer, in log order)."""
        if self._decided is not None and round_ >= self._decided:
            self._decided = None
        if self._open is not None and round_ >= self._open.round:
            self._open = None

    def step_down(self) -> None:
        """Lost the leadership: whatever was open is abandoned; a successor reopens the round."""
        self._open, self._decided = None, None

    def tick(self, now: float, header: Header, committed_round: int, live_sites: Sequence[str],
             base_hash: bytes) -> list[Effect]:
        if self._decided is not None:
            return []
        o = self._open
        if o is None:
            if self.done:
                if self._epoch_reported:
                    return []
                self._epoch_reported = True
                return [EpochComplete(self.ledger.total, self.config.data_epochs)]
            if now < self._idle_until or not live_sites:
                return []
            rnd = committed_round + 1
            self._open = _Open(rnd, now + self.config.deadline_s, frozenset(live_sites))
            return [Broadcast(RoundOpen(header, rnd, self.config.inner_steps, self.config.deadline_s, base_hash))]
        o.dead |= o.expected - set(live_sites)
        # Waiting for a site that membership no longer counts as live cannot pay off: decide now.
        if now >= o.deadline or not self._waiting(o) - o.dead:
            return self._close(now)
        return []

    def member_down(self, site: str, now: float) -> list[Effect]:
        """Membership declared `site` DEAD or LEFT: drop it from the open round at once (its report,
        if any, cannot be fetched) and decide if it was the last one waited for."""
        o = self._open
        if o is None or site not in o.expected:
            return []
        o.dead.add(site)
        return [] if self._waiting(o) - o.dead else self._close(now)

    @staticmethod
    def _waiting(o: _Open) -> set[str]:
        return set(o.expected - set(o.got) - o.idle)

    def receive(self, msg: Contribution, now: float) -> list[Effect]:
        """Collects one report; decides once every expected site has reported."""
        o = self._open
        if o is None or msg.round != o.round or msg.site in o.got:
            return []  # late, early, or a duplicate delivery of what we have
        if msg.ranges:
            o.got[msg.site] = msg
            o.idle.discard(msg.site)
        else:
            o.idle.add(msg.site)
        return [] if self._waiting(o) - o.dead else self._close(now)

    def _close(self, now: float) -> list[Effect]:
        """Decide the open round (I6), or, if nobody trained anything, drop it and open it again
        later: a commit with no claim to settle would only lengthen the log."""
        o = self._open
        assert o is not None
        self._open = None
        if not o.got:
            self._idle_until = now + self.config.idle_wait_s
            return []
        # A report of samples without a pseudo-gradient (its training failed) is there to have its
        # claims settled by this round's commit, never to be included.
        failed = sorted(s for s, c in o.got.items() if c.tokens <= 0 or not c.pseudo_gradient_root)
        gone = sorted(set(o.got) & o.dead - set(failed))
        offers = {s: c for s, c in o.got.items() if s not in failed and s not in gone}
        decisions = admission.admit_round(o.round, (c.accounting() for c in offers.values()), self.ledger)
        admitted = tuple(offers[d.site] for d in decisions if d.included)
        excluded: list[tuple[str, str]] = [(d.site, d.reason) for d in decisions if not d.included]
        excluded += [(s, f"excluded: {s} trained nothing usable in round {o.round} (its training failed)")
                     for s in failed]
        excluded += [(s, f"excluded: {s} is dead (membership), its reported pseudo-gradient cannot be fetched")
                     for s in gone]
        excluded += [(s, f"excluded: {s} did not report (" + ("membership declared it dead or left)" if s in o.dead
                                                                else "deadline passed)"))
                     for s in sorted(self._waiting(o))]
        self._decided = o.round
        return [Decide(o.round, admitted, tuple(excluded))]
