"""The fault schedule of the data-lease simulator (peer/sim/leases_sim.py), seeded per run.

At seeded random times: crash and restart of a holder; the owners of a block crashed in turn (each
after the previous one is back); a majority of a block's owners crashed at once (rebuild from the
log); a zombie paused past its lease (SIGSTOP: its messages wait); a late join; a rolling restart of
every site; a graceful leave and rejoin. A site is picked when its fault fires (one picked in advance
may be down). The schedule also plays the membership layer: a crashed site is reported dead, and so
leaves the voter set and the ring view, 2 s later; a leaver when its process ends.

    .venv/bin/python -m pytest tests/sim/test_leases_sim.py -q
"""

from __future__ import annotations

import random
from collections.abc import Callable

from peer.core.election import SiteId
from peer.sim.lease_checks import Truth
from peer.sim.runner import NodeState, Simulation


class LeaseFaults:
    """One run's faults on `sim`; `commit_view(members)` commits a voter set, as consensus does."""

    def __init__(self, sim: Simulation, rng: random.Random, truth: Truth, universe: dict[int, int],
                 commit_view: Callable[[set[SiteId]], None]) -> None:
        self.sim, self.rng, self.truth, self.universe = sim, rng, truth, universe
        self.commit_view = commit_view
        self.notes: list[tuple[float, str]] = []
        """(time, what) of every fault that hit."""

    # --- membership as the membership layer reports it ---

    def _members(self) -> set[SiteId]:
        view = self.truth.view
        return set(view.members) if view else set()

    def _joined(self, name: SiteId) -> None:
        self.commit_view(self._members() | {name})

    def _dead(self, name: SiteId) -> None:
        if not self._up(name):
            self.commit_view(self._members() - {name})

    def _left(self, name: SiteId) -> None:
        self.commit_view(self._members() - {name})

    # --- faults ---

    def schedule(self, names: list[SiteId], sites: int, span: float, ttl: float) -> None:
        """Every fault of the run, at seeded times within a few `span`s (`names`: every site, the
        last one joining late; `ttl`: the lease ttl a zombie's pause outlasts)."""
        rng, at = self.rng, self.sim.schedule
        at(rng.uniform(5, span), lambda: self._join(names[-1]), "late join")
        down_for, paused_for = rng.uniform(3, 15), ttl * rng.uniform(1.5, 3)
        at(rng.uniform(10, span), lambda: self._crash_then_restart(self._pick_up(), down_for), "crash a holder")
        at(rng.uniform(10, span), lambda: self._pause(self._pick_up(), paused_for), "zombie")
        block = rng.choice(sorted(self.universe))
        at(rng.uniform(span, 2 * span), lambda: self._owners_in_turn(block, 0), "owners in turn")
        at(rng.uniform(2 * span, 3 * span), lambda: self._rolling(list(names), 0), "rolling restart")
        if sites >= 5:
            at(rng.uniform(3 * span, 4 * span), lambda: self._majority_loss(rng.choice(sorted(self.universe))),
               "majority loss")
        at(rng.uniform(4 * span, 5 * span), lambda: self._leave(self._pick_up()), "graceful leave")

    def _note(self, what: str) -> None:
        self.notes.append((self.sim.now, what))

    def _up(self, name: str) -> bool:
        return self.sim.state(name) is not NodeState.DOWN

    def _pick_up(self) -> SiteId | None:
        """A running member, chosen when the fault fires (a site picked in advance may be down)."""
        up = sorted(n for n in self._members() if self.sim.state(n) is NodeState.UP)
        return self.rng.choice(up) if up else None

    def _join(self, name: SiteId) -> None:
        if self._up(name):
            return
        self._note(f"join {name}")
        self.sim.restart(name)
        self.sim.schedule(self.sim.now + 1.0, lambda: self._joined(name), f"view: {name} joins")

    def _crash(self, name: SiteId | None) -> bool:
        if name is None or not self._up(name) or len(self._members()) <= 2:
            return False
        self._note(f"crash {name}")
        self.sim.crash(name)
        self.sim.schedule(self.sim.now + 2.0, lambda: self._dead(name), f"view: {name} dead")
        return True

    def _later(self, action: Callable[[], None], label: str) -> None:
        """A fault that cannot hit now (too few sites up): try again a little later."""
        self.sim.schedule(self.sim.now + 3.0, action, label)

    def _crash_then_restart(self, name: SiteId | None, after: float) -> None:
        if self._crash(name):
            self.sim.schedule(self.sim.now + after, lambda: self._join(name), f"restart {name}")  # type: ignore[arg-type]

    def _pause(self, name: SiteId | None, dt: float) -> None:
        if name is None:
            self._later(lambda: self._pause(self._pick_up(), dt), "zombie")
            return
        self._note(f"pause {name} for {dt:.1f}s")
        self.sim.pause(name)
        self.sim.schedule(self.sim.now + dt, lambda: self.sim.resume(name), f"resume {name}")

    def _leave(self, name: SiteId | None) -> None:
        if name is None or len(self._members()) <= 2:
            self._later(lambda: self._leave(self._pick_up()), "graceful leave")
            return
        self._note(f"leave {name}")
        self.sim.act(name, lambda node, now: node.leave(now))
        self.sim.schedule(self.sim.now + 0.5, lambda: self._gone(name), f"{name} exits")

    def _gone(self, name: SiteId) -> None:
        self._left(name)
        self.sim.schedule(self.sim.now + 3.0, lambda: self.sim.crash(name), f"{name} process ends")
        self.sim.schedule(self.sim.now + self.rng.uniform(10, 30), lambda: self._join(name), f"{name} returns")

    def _owners_in_turn(self, block: int, i: int) -> None:
        view = self.truth.view
        owners = view.owners(block) if view else ()
        if i >= len(owners):
            return
        self._note(f"owner {i} of block {block}")
        self._crash_then_restart(owners[i], 5.0)
        self.sim.schedule(self.sim.now + 12.0, lambda: self._owners_in_turn(block, i + 1), "next owner")

    def _majority_loss(self, block: int) -> None:
        view = self.truth.view
        owners = view.owners(block) if view else ()
        up = [self.sim.state(o) is NodeState.UP for o in owners[:2]]
        if len(owners) < 3 or len(self._members()) < 4 or not all(up):
            self._later(lambda: self._majority_loss(block), "majority loss")
            return
        self._note(f"majority of owners of block {block}")
        for name in owners[:2]:
            self._crash_then_restart(name, 6.0)

    def _rolling(self, names: list[SiteId], i: int) -> None:
        if i >= len(names):
            return
        self._note(f"rolling restart {i}")
        self._crash_then_restart(names[i], 4.0)
        self.sim.schedule(self.sim.now + 10.0, lambda: self._rolling(names, i + 1), "rolling restart")
