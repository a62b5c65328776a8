"""Which membership messages a peer lets into its membership core at all, and why not.

Three senders are refused before membership (and so consensus, the lease ring and the rounds)
ever counts them:
- a second live process under a site name already in the run: it would take over the site's
  gossip, and its leave would evict the real one (a restarted site, the old process silent for a
  few probe periods, is welcome);
- rumours of more new sites than the member table holds (`max_members`);
- a sender whose own metadata says it trains something other than the run: its leases would name
  blocks nobody else can train. This refusal is final (`Refusal.final`): no retry can change it,
  the sender's run file must.

Pure: the node hands the message, the members it knows and `now`; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peer.core import agreement
from peer.core.membership_types import LIVE, Message, MemberState, MemberUpdate, MemberView, PushPull


@dataclass(frozen=True)
class Refusal:
    reason: str
    final: bool = False
    """The sender's configuration differs from the run's: answer so that it stops trying."""
    first: bool = False
    """A final refusal whose reason differs from the last given to this sender (worth a log line)."""


class MemberAdmission:
    def __init__(self, site: str, max_members: int, probe_interval_s: float) -> None:
        self.site = site
        self.max_members = max_members
        self.probe_interval_s = probe_interval_s
        self.refused_config: dict[str, str] = {}
        """Site -> why its configuration was refused, so a repeated refusal is logged once."""

    def check(self, msg: Message, address: str, members: Sequence[MemberView], now: float,
              identity: agreement.TrainingIdentity | None) -> Refusal | None:
        """None to let `msg` in; else why not. `address`: this peer's own advertised address."""
        reason = self._duplicate_site(msg, address, members, now) or self._table_full(msg, members)
        return Refusal(reason) if reason is not None else self._other_config(msg, members, identity)

    def _table_full(self, msg: Message, members: Sequence[MemberView]) -> str | None:
        known = {view.site for view in members}
        new = {u.site for u in _rumours(msg)} - known
        if new and len(known) + len(new) > self.max_members:
            return f"{len(new)} new members would pass the limit of {self.max_members} members this peer holds"
        return None

    def _other_config(self, msg: Message, members: Sequence[MemberView],
                      identity: agreement.TrainingIdentity | None) -> Refusal | None:
        sender = msg.from_site
        own = next((u.meta for u in _rumours(msg) if u.site == sender and u.meta is not None), None)
        if own is None or sender == self.site:
            return None
        live = ((v.site, v.meta.labels) for v in members
                if v.meta is not None and v.state in LIVE)
        run = agreement.the_runs(self.site, identity, live)
        why = agreement.check_member(run, sender, own.labels)
        if why is None:
            self.refused_config.pop(sender, None)
            return None
        first = self.refused_config.get(sender) != why
        self.refused_config[sender] = why
        return Refusal(why, final=True, first=first)

    def _duplicate_site(self, msg: Message, address: str, members: Sequence[MemberView], now: float) -> str | None:
        sender = getattr(msg, "from_address", None)
        if sender is None:
            return None
        if msg.from_site == self.site and sender != address:
            return f"site {msg.from_site} is this peer ({address}); a second process with its name is refused"
        view = next((v for v in members if v.site == msg.from_site), None)
        if view is None or view.state is not MemberState.ALIVE or view.address == sender:
            return None
        quiet = now - view.last_heard
        if quiet < self.probe_interval_s * 3:
            return (f"site {msg.from_site} is live at {view.address} (heard {quiet:.1f} s ago); a second "
                    f"process with its name at {sender} is refused: stop one of them")
        return None


def _rumours(msg: Message) -> tuple[MemberUpdate, ...]:
    """What `msg` says about members: a push-pull's whole table, or a probe's piggybacked updates."""
    return msg.members if isinstance(msg, PushPull) else getattr(msg, "updates", ())
