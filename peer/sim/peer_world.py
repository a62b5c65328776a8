"""The world the simulated peers share, and the invariants checked after every event.

`World` is what membership and the disks say (who is live, leaving, gone; each site's durable log
and θ), the truth (the committed log in order, as the first peer to commit each entry saw it) and
the checks every peer's report to it runs at once:

no sample in two commits of a data epoch (I4); no contributor credited with a sample its trainer did
not reach in that round; every commit's θ hash is the function of its contributions and θ_{r-1} (I7
at the leader); every peer applies the committed rounds in log order with the committed hash, each
once, across its restarts (state transfers may skip rounds, never reorder them); the same round at
every log index; a minority cut off never commits first; a site back up while the leader waits for
its report holds the open within RESEND_S of the leader hearing so (unless the network lost that).
`PeerChecker` adds, after every event: while the up sites on one side of any cut hold a majority of
the voters, a round commits within LIVENESS_S; at the end of every data epoch: every sample
committed (I5); at the end: the run finished its data epochs and every up site holds θ of the last
round. Membership's verdicts reach the cores after a detection delay (`join`, `tell`, `say_left`).

    ops simulate --protocol peer --members 5 --seeds 0:100 --faults all
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from peer.core import events as ev
from peer.core.commitlog import RoundCommit
from peer.core.consensus_effects import Rejected
from peer.core.election import Role, SiteId, has_majority
from peer.core.vouchers import VoucherKeys
from peer.logstore import MemoryStore
from peer.sim.faulty import FaultySite
from peer.sim.network import SimNetwork
from peer.sim.peer_config import (CONVERGE_S, DETECT_S, GRACE_S, LEAVE_ALL_S, LEAVE_ALL_WAIT_S, LEFT_S, LIVENESS_S,
                                  RESEND_S, TOKENS_PER_SAMPLE, PeerSimConfig)
from peer.sim.peer_node import THETA0, Durable, PeerNode, theta
from peer.sim.runner import NodeState, Simulation, derive_rng

class _Network(SimNetwork):
    """The seeded network, remembering when it lost messages to each address (drop or cut)."""

    def __init__(self, rng: random.Random, latency_s: tuple[float, float]) -> None:
        super().__init__(rng, latency_s)
        self.lost_at: dict[str, list[float]] = {}

    def send(self, src: str, dst: str, now: float) -> list[float]:
        times = super().send(src, dst, now)
        if not times:
            self.lost_at.setdefault(dst, []).append(now)
        return times

    def lost(self, dst: str, start: float, end: float) -> bool:
        """Some message to `dst` sent from `start` to `end` was lost."""
        return any(start <= t <= end for t in self.lost_at.get(dst, ()))


class World:
    """One seeded run's world: what the nodes share (what membership and the disks say), the truth
    (the committed log in order) and the invariants."""

    def __init__(self, seed: int, cfg: PeerSimConfig, trace: Callable[[str], None] | None = None,
                 keys: Mapping[str, VoucherKeys] | None = None) -> None:
        self.seed, self.cfg = seed, cfg
        self.keys = dict(keys or {})
        """Site -> its voucher keys (a certificate of a run CA): every owner signs, every leader checks
        vouchers and tokens, as a node under TLS. Empty: an insecure run."""
        self.rng = derive_rng(seed, "peer")
        self.universe = {1000 + i: cfg.block_samples - (i % 3 == 2) for i in range(cfg.blocks)}
        net = _Network(derive_rng(seed, "network"), latency_s=(0.001, 0.02))
        if "drop" in cfg.faults:
            net.drop_rate = 0.01
        if "duplicate" in cfg.faults:
            net.duplicate_rate = 0.01
        if "reorder" in cfg.faults:
            net.reorder_rate, net.reorder_window_s = 0.02, 0.05
        self.sim = Simulation(seed, net, trace)
        self.names = [SiteId(f"s{i}") for i in range(cfg.sites)]
        self.disks = {n: Durable(MemoryStore()) for n in self.names}
        self.speeds = {n: self.rng.choice([20.0, 40.0, 80.0]) for n in self.names}  # drawn even if fixed: the seed's other draws stay
        if cfg.speeds:
            self.speeds = dict(zip(self.names, cfg.speeds))
        # Its own random stream: picking the budget leaves every other draw of the seed as it was.
        self.rounds = replace(cfg.rounds, budget_s=derive_rng(seed, "budget").choice(cfg.budgets),
                              overlap=derive_rng(seed, "overlap").choice(cfg.overlaps))
        """The rounds every peer of this seed runs (cfg.rounds with the seed's budget and overlap)."""
        self.folds = 0
        """Fold effects: θ_r handed to a round trained ahead of it (overlapped seeds)."""
        self.live: set[str] = set()
        """The sites membership reports alive (what the cores were told)."""
        self.commits: dict[int, RoundCommit] = {}
        """The committed log's RoundCommits, by round, as the first peer to commit each saw it."""
        self.by_index: dict[int, int] = {}
        self.order: list[int] = []
        self.applied: dict[str, list[int]] = {n: [] for n in self.names}
        self.violations: list[str] = []
        self.epoch_samples: set[tuple[int, int]] = set()
        self.reached: dict[tuple[str, int], set[tuple[int, int]]] = {}
        """(site, round) -> the samples its fake trainer reached in that round: all a commit may credit it with."""
        self.epochs_done = 0
        self.faults: list[tuple[float, str]] = []
        self.excluded = 0
        self.notes: list[str] = []
        """Every decision the sites' round cores took, with its reason (in event order)."""
        self.gone: set[str] = set()
        """Sites that left gracefully (`ops leave`) and have not joined again."""
        self.leaving: str | None = None
        self.leavers: set[str] = set()
        """Sites whose graceful leave has started (membership gossips their `LEAVING` label) and
        that have not started again."""
        self.leave_all_s: list[float] = []
        """Seconds from a SIGTERM to every site at once until the last of them stopped."""
        self.end_leave: tuple[str, float] | None = None
        """The site told to leave as the run's last round committed (its report in it), and when."""
        self.end_leave_s: list[float] = []
        """Seconds from that SIGTERM until the site stopped."""
        self.phase: str | None = None
        """The fault phase under way (partition, leave, restart): the other faults wait for its end."""
        self.phases_done: list[str] = []
        self.cut: tuple[frozenset[str], float] | None = None
        """The minority cut off by a partition, and since when."""
        self.first_seen: dict[int, str] = {}
        self.last_commit = 0.0
        self.disrupted = 0.0
        """When a fault last acted (a kill, start, pause, cut, leave, verdict ...): liveness counts from it."""
        self.longest_stall = 0.0
        """The longest wait for a commit since the previous one or the last fault action."""
        self.network = net
        self.bouncing: set[str] = set()
        """Sites killed and about to restart before membership declares them dead (peer_faults' `_bounce`)."""
        self.bounced_until = 0.0
        """No fault phase starts before this: the round open at a fast restart runs to its deadline."""
        self.opens_lost_to_restart = 0
        """Round opens the leader sent to a site of its live list that was down for a fast restart."""
        self.opens_resent = 0
        """Opens a leader sent again to a site that came back up (RoundLeader.member_up)."""
        self.faulty = (FaultySite(self, derive_rng(seed, "faulty"), self.keys, TOKENS_PER_SAMPLE)
                       if "faulty" in cfg.faults else None)
        """The site that lies (`faulty`): never itself checked, its lies must all be refused."""

    # ----- what the nodes ask -----------------------------------------------------------------------
    def peer(self, name: str) -> PeerNode | None:
        node = self.sim.node(name)
        return node if isinstance(node, PeerNode) else None

    def checked(self, site: str) -> bool:
        """Whether `site`'s invariants are checked: every site but the faulty one."""
        return self.faulty is None or site != self.faulty.name

    def implausible(self, site: str, e: Rejected) -> None:
        """`site`'s consensus refused a message as implausible: no honest one is, the faulty site's lies are."""
        if self.faulty is None or not self.faulty.refused_at(site, e.from_site, self.sim.delivering):
            self.violations.append(f"{site}: {e.reason}")

    def serving(self, site: str) -> bool:
        return self.sim.state(site) is NodeState.UP

    def newest_state(self, site: str) -> tuple[int, int, bytes] | None:
        """θ of the newest committed round from any live peer that applied it (a state transfer)."""
        if not self.order:
            return None
        newest = self.order[-1]
        for n in sorted(self.names):
            d = self.disks[n]
            if n != site and self.serving(n) and d.round == newest:
                return d.index, d.round, d.weights_hash
        return None

    def see_entry(self, site: str, index: int) -> None:
        """`site` committed log index `index`: a minority cut off by a partition must never be the first."""
        if index in self.first_seen:
            return
        self.first_seen[index] = site
        if self.cut is not None and site in self.cut[0] and self.sim.now > self.cut[1] + GRACE_S:
            self.violations.append(f"{site} committed log index {index} first, cut off in a minority "
                                   f"({', '.join(sorted(self.cut[0]))}) since t={self.cut[1]:.2f} (a minority "
                                   "never commits)")

    def see_commit(self, index: int, commit: RoundCommit) -> None:
        """A peer's log committed `commit` at `index`: the first sighting is the truth, later ones must
        agree; the truth's invariants are checked at once."""
        rnd = commit.round
        if index in self.by_index:
            if self.by_index[index] != rnd or self.commits[rnd] != commit:
                self.violations.append(f"log index {index} holds round {rnd} at one peer and another entry "
                                       "elsewhere (commit log safety)")
            return
        self.by_index[index] = rnd
        if rnd in self.commits:
            self.violations.append(f"round {rnd} committed twice (at index {index} and earlier)")
            return
        if self.order and rnd != self.order[-1] + 1:
            self.violations.append(f"round {rnd} committed after round {self.order[-1]} (rounds must be consecutive)")
        previous = self.commits[self.order[-1]].weights_hash if self.order else THETA0
        want = theta(previous, rnd, [(c.site, c.tokens, c.pseudo_gradient_root) for c in commit.contributors])
        if commit.weights_hash != want:
            self.violations.append(f"round {rnd}: committed θ hash is not the outer step of its contributions "
                                   "and θ_{r-1} (I7)")
        self.commits[rnd] = commit
        self.order.append(rnd)
        if self.faulty is not None:
            self.violations += self.faulty.committed(rnd, commit.contributors)
        self.longest_stall = max(self.longest_stall, self.sim.now - max(self.last_commit, self.disrupted))
        self.last_commit = self.sim.now
        for c in commit.contributors:
            reached = self.reached.get((c.site, rnd), set())
            untrained = sum(1 for x in c.ranges for i in range(x.start, x.end) if (x.block_id, i) not in reached)
            if untrained:
                self.violations.append(f"round {rnd}: {c.site} is credited with {untrained} samples its trainer "
                                       "never reached in that round (a time-boxed round claims only what it trained)")
            for x in c.ranges:
                for i in range(x.start, x.end):
                    if (x.block_id, i) in self.epoch_samples:
                        self.violations.append(f"round {rnd}: sample {i} of block {x.block_id} committed twice in "
                                               f"data epoch {self.epochs_done} (by {c.site}) (I4)")
                    self.epoch_samples.add((x.block_id, i))
        total = sum(self.universe.values())
        if len(self.epoch_samples) >= total:
            everything = {(b, i) for b, n in self.universe.items() for i in range(n)}
            if self.epoch_samples != everything:
                self.violations.append(f"data epoch {self.epochs_done} ended without every sample (I5)")
            self.epochs_done += 1
            self.epoch_samples = set()
            if self.epochs_done >= self.cfg.epochs:
                self._leave_at_end(rnd, commit)
                self._finish(self.sim.now + CONVERGE_S)

    def _leave_at_end(self, rnd: int, commit: RoundCommit) -> None:
        """The `leave` fault, once more: SIGTERM to a contributor of the run's last round as it
        commits, before the others fetched its pseudo-gradient. No round after opens to prove that a
        peer that stays holds θ of it: the leader's RunComplete must, so the site stops within
        LEAVE_ALL_S of its LEAVE_ALL_WAIT_S wait (`_finish`), and every site that stays still
        applies the round (`PeerChecker.at_end`)."""
        leader, up = self.leader(), self.up()
        who = [c.site for c in commit.contributors if c.tokens and c.site != leader and c.site in up
               and c.site not in self.leavers]
        if "leave" not in self.cfg.faults or self.phase is not None or not who or len(up) < 2:
            return
        site, t0 = who[0], self.sim.now
        self.end_leave = (site, t0)
        self.note(f"SIGTERM {site}, a contributor of the run's last round {rnd}, as it commits")
        self.disrupted = t0
        self.sim.schedule(t0, lambda: self.sim.act(site, lambda node, now: node.leave(now, LEAVE_ALL_WAIT_S)),
                          f"SIGTERM {site}")

    def waited_out(self, leader: PeerNode, round_: int, site: str) -> None:
        """`leader` excluded `site` from `round_` at the deadline: if the site came back up while the
        round was open and its current process never got the open, although the leader heard it was
        up RESEND_S before and the network lost nothing sent to it since (the open sent again, or a
        later reopen of the round, may be dropped like any message: the deadline bounds that), the
        leader stalled on a site that could not know of the round (docs/decisions/rounds-open-resend.md)."""
        up, opened, node = leader.up_at.get(site), leader.open_at.get(round_), self.sim.node(site)
        if up is None or opened is None or up < opened or not isinstance(node, PeerNode):
            return
        if self.sim.now - up < RESEND_S or round_ in node._opened or self.network.lost(site, up, self.sim.now):
            return
        self.violations.append(f"round {round_}: {site} came back up at t={up:.2f} while the round was open "
                               f"(opened t={opened:.2f}) and never heard of it; {leader.site} waited out the "
                               "deadline for its report (liveness)")

    def applied_by(self, site: str, round_: int, weights_hash: bytes) -> None:
        """`site` applied `round_` (in order, or by a state transfer that skips, never reorders)."""
        seq = self.applied[site]
        if not self.checked(site):
            return
        if seq and round_ <= seq[-1]:
            self.violations.append(f"{site} applied round {round_} after round {seq[-1]} (a round applied twice "
                                   "or out of log order)")
        commit = self.commits.get(round_)
        if commit is None or commit.weights_hash != weights_hash:
            self.violations.append(f"{site} applied round {round_} with θ {weights_hash.hex()[:8]}, not the "
                                   "committed one (I7)")
        seq.append(round_)

    def _finish(self, until: float) -> None:
        """The data is done: stop once every up site holds θ of the last round (at_end checks it) and
        no fault phase is under way (sites it killed are back: every site down would pass vacuously)."""
        if self.phase is not None:
            until = max(until, self.sim.now + CONVERGE_S)  # convergence is timed from the phase's end
        if self.end_leave is not None:
            site, t0 = self.end_leave
            if self.sim.state(site) is NodeState.DOWN:
                self.end_leave_s.append(self.sim.now - t0)
                self.end_leave = None
            elif self.sim.now - t0 > LEAVE_ALL_S:
                self.violations.append(f"{site} was told to leave at t={t0:.2f}, as the run's last round (which "
                                       f"holds its samples) committed, and still runs {LEAVE_ALL_S:g} s later: its "
                                       "leave waits for a round nobody will open (liveness)")
                self.end_leave = None
        if (self.caught_up() and self.phase is None and self.end_leave is None) or self.sim.now >= until:
            self.sim.stop()
        else:
            self.sim.schedule(self.sim.now + 0.5, lambda: self._finish(until), "run complete (converging)")

    # ----- membership, as the membership layer reports it -----------------------------------------
    def note(self, what: str) -> None:
        self.faults.append((self.sim.now, what))

    def up(self) -> list[SiteId]:
        return [n for n in self.names if self.sim.state(n) is NodeState.UP]

    def tell(self, method: str, site: str) -> None:
        """Membership's verdict on `site`, told to every running core."""
        self.tell_some(method, site, [n for n in self.up() if n != site])

    def tell_some(self, method: str, site: str, to: Sequence[str], world: bool = True) -> None:
        """Membership's verdict on `site` reaches `to` (`world`: it is the verdict of the majority side,
        the one the leader's live list and a restarting site see)."""
        self.disrupted = self.sim.now
        if world:
            if method == "member_alive":
                self.live.add(site)
            else:
                self.live.discard(site)
        for n in to:
            self.sim.act(n, lambda node, now: getattr(node, method)(site, now))

    def join(self, name: SiteId) -> None:
        if self.sim.state(name) is not NodeState.DOWN or name in self.gone:
            return
        self.note(f"start {name}")
        self.disrupted = self.sim.now
        self.leavers.discard(name)
        self.sim.restart(name)
        self.sim.schedule(self.sim.now + DETECT_S, lambda: self.tell("member_alive", name), f"{name} alive")

    def leader(self) -> SiteId | None:
        for n in self.up():
            node = self.sim.node(n)
            if isinstance(node, PeerNode) and node.consensus.role is Role.LEADER:
                return n
        return None

    def caught_up(self) -> bool:
        newest = self.order[-1] if self.order else 0
        return all(self.disks[n].round == newest for n in self.up())

    def voters(self, site: str) -> list[str]:
        node = self.sim.node(site)
        if not isinstance(node, PeerNode):
            return []
        return [s for s, _ in node.consensus.log.voters_at(node.consensus.commit_index)]

    def say_leaving(self, site: str) -> None:
        """`site` started a graceful leave: membership gossips its `LEAVING` label (LEFT_S)."""
        self.leavers.add(site)
        self.sim.schedule(self.sim.now + LEFT_S,
                          lambda: self.tell_some("member_leaving", site, [n for n in self.up() if n != site],
                                                 world=False), f"{site} is leaving")

    def say_left(self, site: str) -> None:
        """Membership's LEFT verdict on `site` (its gossip, before or as it stops)."""
        self.sim.schedule(self.sim.now + LEFT_S, lambda: self.tell("member_left", site), f"{site} left")

    def left(self, site: str) -> None:
        """`site`'s `ops leave` is done: the process stops (it said LEFT already)."""
        def gone() -> None:
            self.sim.crash(site)
            self.gone.add(site)
            self.leaving = None
            self.disrupted = self.sim.now
            self.note(f"{site} left")

        self.sim.schedule(self.sim.now, gone, f"{site} stops")

    def majority_live(self) -> bool:
        """The up sites on one side of any cut hold a majority of the voter set (as the most advanced
        up site's log says)."""
        up = self.up()
        nodes = [node for n in up if isinstance(node := self.sim.node(n), PeerNode)]
        if not nodes:
            return False
        ref = max(nodes, key=lambda node: node.consensus.commit_index)
        voters = [s for s, _ in ref.consensus.log.voters()]
        sides = [set(up)] if self.cut is None else [set(up) - self.cut[0], set(up) & self.cut[0]]
        return any(has_majority(map(SiteId, side), voters) for side in sides)


class PeerChecker:
    """The invariants checked after every event and at the end (runner.Checker)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._seen = 0
        self._stalled = False

    def after_event(self, sim: Simulation, address: str, effects: Sequence[Any]) -> list[str]:
        w = self.world
        w.excluded += sum(1 for e in effects if isinstance(e, ev.Excluded))
        if w.epochs_done < w.cfg.epochs and not self._stalled:
            # Whether a majority is live changes only with a fault action (which resets the clock):
            # asked only once the wait is past the bound, it costs nothing on the other events.
            stall = sim.now - max(w.last_commit, w.disrupted)
            if stall > LIVENESS_S and w.majority_live():
                self._stalled = True
                w.violations.append(f"no round committed for {stall:.1f} s while the live sites hold a "
                                    f"majority of the voters (last commit t={w.last_commit:.1f}) (liveness)")
        if len(w.violations) > self._seen:
            new = w.violations[self._seen:]
            self._seen = len(w.violations)
            return [f"t={sim.now:.2f}: {v}" for v in new]
        return []

    def at_end(self, sim: Simulation) -> list[str]:
        w = self.world
        if w.epochs_done < w.cfg.epochs:
            return [f"t={sim.now:.1f}: only {w.epochs_done} of {w.cfg.epochs} data epochs committed, "
                    f"{len(w.order)} rounds (liveness)"]
        behind = {n: w.disks[n].round for n in w.up() if w.disks[n].round != w.order[-1] and w.checked(n)}
        if behind:
            return [f"t={sim.now:.1f}: {behind} still behind round {w.order[-1]} {CONVERGE_S:g} s after the run's "
                    "last commit (convergence)"]
        return []
