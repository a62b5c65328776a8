"""Events into and effects out of the round cores (peer/core/): plain frozen dataclasses.

Events are what happened (a message, a timer, an effect finishing); effects are what the executor
must do. A long effect (train, fetch, apply, state transfer) always ends in exactly one completion
event, success or failure, so a core waiting for it needs no timeout of its own except where the
protocol has one (the claim's vouchers, the leave's wait for a commit).

    .venv/bin/python -c "from peer.core.events import Note; print(Note('round 3: no samples came'))"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from peer.core.commitlog import RoundCommit
from peer.core.exclusion import ExclusionKind
from peer.core.lease_types import Send as LeaseSend
from peer.core.rounds import Contribution, Decide, RoundOpen
from peer.core.samples import SampleRange

# ----- events -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passed: a deadline of `next_deadline()` may be due."""


@dataclass(frozen=True)
class LeasesChanged:
    """The lease cores took a message or a tick: started blocks may have samples, claims answers."""


@dataclass(frozen=True)
class Opened:
    """The current leader opened a round (PeerRounds.round_message refused stale epochs already)."""

    msg: RoundOpen


@dataclass(frozen=True)
class TrainDone:
    """The trainer trained `ranges` of `round` and published Δ with Merkle root `root`."""

    round: int
    ranges: tuple[SampleRange, ...]
    tokens: int
    root: bytes
    seconds: float = 0.0
    """Of inner steps (what the trainer timed); the rest of the effect was encoding and publishing."""
    steps: int = 0
    mean_loss: float = float("nan")
    folded_at: int | None = None
    """An overlapped round: after how many steps θ_{round-1} was folded in (None: it came later)."""


@dataclass(frozen=True)
class TrainFailed:
    round: int
    reason: str


@dataclass(frozen=True)
class Committed:
    """A RoundCommit at log index `index`, in log order."""

    index: int
    commit: RoundCommit


@dataclass(frozen=True)
class Persisted:
    """θ_round is this peer's durable state (`transfer`: installed by a state transfer)."""

    index: int
    round: int
    weights_hash: bytes
    transfer: bool = False


ApplyFailure = Literal["diverged", "unavailable", "error"]


@dataclass(frozen=True)
class ApplyFailed:
    """Applying `round` failed: θ disagreed with the log (I7), a Δ is served by nobody, or else."""

    round: int
    kind: ApplyFailure
    reason: str


@dataclass(frozen=True)
class CatchUpFailed:
    reason: str


@dataclass(frozen=True)
class Diverged:
    """This peer's θ disagrees with the log (found at start-up): re-sync before applying."""

    reason: str


@dataclass(frozen=True)
class LeaveRequested:
    """Graceful leave (I8): wait up to `wait_s` for a round this site reported samples for."""

    wait_s: float


@dataclass(frozen=True)
class DecideRound:
    """The leader core decided a round: fetch and average the admitted contributions."""

    decide: Decide
    live: frozenset[str]


@dataclass(frozen=True)
class MemberDown:
    """Membership declared `site` DEAD or LEFT."""

    site: str


@dataclass(frozen=True)
class MemberSuspect:
    """Membership suspects `site`: its probes, direct and through others, went unanswered."""

    site: str


@dataclass(frozen=True)
class NobodyStays:
    """While this site leaves: whether every other live member is leaving too (membership's
    `LEAVING` label) and this peer leads no round in progress, so that no round after this
    site's last one will open (a leaving leader opens none)."""

    value: bool


@dataclass(frozen=True)
class RunCompleted:
    """The leader of this peer's epoch said (`RunComplete`) that the run's data is complete, that no
    round after `round` opens and that it holds θ_round."""

    round: int


@dataclass(frozen=True)
class MemberUp:
    """Membership saw `site` come (back) up: ALIVE after SUSPECT, DEAD or LEFT, first heard of, or a
    new process of it at a new address. What was sent to it meanwhile may never have arrived."""

    site: str


@dataclass(frozen=True)
class OutcomeReady:
    round: int
    attempt: int
    weights_hash: bytes


@dataclass(frozen=True)
class OutcomeFailed:
    """A fetch failed; `site` is the contributor to blame ("" if no single one is)."""

    round: int
    attempt: int
    site: str
    reason: str


Event = Union[Tick, LeasesChanged, Opened, TrainDone, TrainFailed, Committed, Persisted, ApplyFailed,
              CatchUpFailed, Diverged, LeaveRequested, DecideRound, MemberDown, MemberSuspect, MemberUp, NobodyStays, RunCompleted,
              OutcomeReady, OutcomeFailed]

# ----- effects ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Note:
    """A decision and its reason, for the log (and `RoundCore.reasons`)."""

    text: str
    warning: bool = False


@dataclass(frozen=True)
class Train:
    """Train `ranges` from θ_{round-1}; ends in TrainDone or TrainFailed."""

    round: int
    ranges: tuple[SampleRange, ...]
    inner_steps: int
    budget_s: float | None = None
    """A time-boxed round (RoundOpen.budget_s): as many of the inner steps as fit, at least one."""
    ahead: bool = False
    """An overlapped round, trained before θ_{round-1} exists here: go on from the trainer's model
    and fold θ_{round-1} in when a `Fold` says it is applied (docs/decisions/rounds-overlap-fold.md)."""


@dataclass(frozen=True)
class Fold:
    """θ_round is applied here: hand it to the round `round + 1` trained ahead, to fold in between
    two of its steps (the executor writes it where the trainer looks)."""

    round: int


@dataclass(frozen=True)
class Report:
    """Send `contribution` to the current leader: PeerRounds addresses it (`SendReport`), since the
    round core does not know who leads."""

    contribution: Contribution


@dataclass(frozen=True)
class SendReport:
    """Send `contribution` to `leader`; its header carries the epoch consensus knows now (a successor
    that reopened the round accepts a report made under its predecessor). `leader` None: none is
    known, the report is not sent and waits for the next open (which asks again)."""

    contribution: Contribution
    leader: str | None


@dataclass(frozen=True)
class Fetch:
    """Leader: pull, verify and average `admitted`'s Δ of `round`; ends in OutcomeReady/Failed."""

    round: int
    attempt: int
    admitted: tuple[Contribution, ...]


@dataclass(frozen=True)
class CancelFetch:
    round: int
    attempt: int


@dataclass(frozen=True)
class Excluded:
    """Leader: `site` is not in `round`, for `reason` (counted by `kind` in the metrics)."""

    round: int
    site: str
    kind: ExclusionKind
    reason: str


@dataclass(frozen=True)
class Propose:
    commit: RoundCommit


@dataclass(frozen=True)
class Apply:
    """Make committed `commit` this peer's state; ends in Persisted or ApplyFailed."""

    index: int
    commit: RoundCommit


@dataclass(frozen=True)
class CancelApply:
    """Stop fetching what the running `Apply` of `round` needs: a `CatchUp` takes its place. An
    apply that completes anyway is ignored (its Persisted is not a transfer's)."""

    round: int


@dataclass(frozen=True)
class CatchUp:
    """State transfer of the newest committed round; ends in Persisted(transfer=True) or CatchUpFailed."""


@dataclass(frozen=True)
class RoundApplied:
    """θ_round is applied here: the executor closes the round's timeline record."""

    round: int


@dataclass(frozen=True)
class LeaveReady:
    """The leave's round work is done and every lease was given back (the Sends came first)."""


Effect = Union[Note, Train, Fold, Report, LeaseSend, Fetch, CancelFetch, Excluded, Propose, Apply, CancelApply, CatchUp,
               RoundApplied, LeaveReady]
