"""The whole-peer simulation's fault schedule: seeded faults at seeded times, and the fault phases.

Faults per seed, at seeded times: a late join (`World.join`), a contributor killed mid-round (kill
-9: its pending training and Δ are lost) and restarted, another killed mid-exchange (while the leader
fetches its Δ), the leader killed mid-round (a leader change reopens the round) and restarted, a site
killed as the leader opens a round and restarted before membership declares it dead (the open
reaches no process; membership's news of the new process must bring it again), a site SIGSTOPped
past its lease ttl; then, one at a time at quiet moments in a seeded order, the phases: a partition
(a minority cut off past a lease, then healed), a one-way cut (the same, one direction only: the
minority hears but is not heard, or the reverse), `ops leave` down to one site that commits alone
and back (`leave`), SIGTERM to every site at once and all back (`leave_all`, with `leave`), every
site killed at once and restarted from its disk (`restart`). Only by name (`--faults all,faulty`): a
faulty site (peer/sim/faulty.py). Message loss, duplication, reordering and skewed clocks are the
network's and the clocks' (peer/sim/peer_world.py, peer/sim/peer_sim.py).

Every site told to leave at once must stop within LEAVE_ALL_S, with θ of the last committed round
on some disk (or only commits without contributors after it): checked here, as the phase ends.

    ops simulate --protocol peer --members 5 --seeds 0:100 --faults all
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

from peer.core.election import SiteId
from peer.sim.faulty import Stranger
from peer.sim.peer_config import DETECT_S, LEAVE_ALL_S, LEAVE_ALL_WAIT_S, LEFT_S, LIVENESS_S, UP_S
from peer.sim.peer_node import PeerNode
from peer.sim.peer_world import World
from peer.sim.runner import NodeState, derive_rng


class FaultSchedule:
    """The faults of one seed's `World`: planned at the start (`plan`), each acting on the world's
    state (what membership says, the cut, the sites gone) as it comes due."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.sim, self.rng = world.sim, world.rng

    def plan(self) -> None:
        """Schedule the seed's faults (after the late join, from the world's random stream)."""
        w, cfg = self.world, self.world.cfg
        rng, at = self.rng, self.sim.schedule
        if "crash" in cfg.faults:
            at(rng.uniform(4, 12), lambda: self._kill_contributor(20), "kill a contributor mid-round")
            at(rng.uniform(8, 20), self._kill_leader, "kill the leader mid-round")
            # Its own random stream: the other faults of a seed stay where they were.
            own = derive_rng(w.seed, "kill mid-exchange")
            at(own.uniform(6, 30), lambda: self._kill_mid_exchange(own, 400), "kill a contributor mid-exchange")
            fast = derive_rng(w.seed, "fast restart")
            at(fast.uniform(5, 40), lambda: self._bounce(fast, 400), "kill and restart a site as a round opens")
        if "pause" in cfg.faults:
            at(rng.uniform(5, 25), lambda: self._pause(cfg.lease.ttl * rng.uniform(1.5, 3)), "SIGSTOP past the lease")
        if w.faulty is not None:
            if not w.faulty.member:
                self.sim.add_node(w.faulty.name, lambda now: (Stranger(), []))
            w.faulty.start(derive_rng(w.seed, "faulty start").uniform(2, 6))
        phases: list[str] = [k for k in ("partition", "one_way", "leave", "restart") if k in cfg.faults]
        phases += ["leave_all"] if "leave" in cfg.faults else []
        rng.shuffle(phases)
        if phases:
            at(rng.uniform(5, 15), lambda: self._next_phase(phases), "next fault phase")

    def _kill(self, name: SiteId, why: str) -> None:
        w = self.world
        w.note(f"kill {name} ({why})")
        w.disrupted = self.sim.now
        self.sim.crash(name)
        self.sim.schedule(self.sim.now + DETECT_S, lambda: w.tell("member_down", name), f"{name} dead")
        self.sim.schedule(self.sim.now + self.rng.uniform(4, 10), lambda: w.join(name), f"restart {name}")

    def _pause(self, seconds: float) -> None:
        """SIGSTOP of a site that is not the leader for longer than a lease: its messages wait, its
        leases are reclaimed meanwhile, membership declares it dead, then alive again on SIGCONT."""
        w = self.world
        leader = w.leader()
        others = [n for n in w.up() if n != leader]
        if len(w.up()) <= len(w.names) // 2 + 1 or not others or w.phase is not None:
            self.sim.schedule(self.sim.now + 1.0, lambda: self._pause(seconds), "SIGSTOP (retry)")
            return
        name = self.rng.choice(others)
        w.note(f"pause {name} for {seconds:.1f}s")
        w.disrupted = self.sim.now
        self.sim.pause(name)
        self.sim.schedule(self.sim.now + DETECT_S, lambda: w.tell("member_down", name), f"{name} dead")
        self.sim.schedule(self.sim.now + seconds, lambda: self._resume(name), f"resume {name}")

    def _resume(self, name: SiteId) -> None:
        w = self.world
        if self.sim.state(name) is not NodeState.PAUSED:
            return  # killed while stopped: its restart (if any) told membership; a late "alive" would undo a leave
        w.disrupted = self.sim.now
        self.sim.resume(name)

        def alive() -> None:
            w.tell("member_alive", name)
            # Verdicts given while it was stopped did not reach it; its gossip catches up now.
            for n in w.names:
                if n != name:
                    method = "member_alive" if n in w.live else "member_left" if n in w.gone else "member_down"
                    w.tell_some(method, n, [name] if self.sim.state(name) is NodeState.UP else [], world=False)

        self.sim.schedule(self.sim.now + DETECT_S, alive, f"{name} alive")

    def _kill_contributor(self, tries: int) -> None:
        """kill -9 of a site that is training or waiting for its claims (after `tries` tries at finding
        one, of any site but the leader)."""
        w = self.world
        leader = w.leader()
        busy = [n for n in w.up() if n != leader and (node := self.sim.node(n)) is not None
                and isinstance(node, PeerNode) and node.core.site.busy is not None]
        others = [n for n in w.up() if n != leader]
        if (len(w.up()) <= len(w.names) // 2 + 1 or not others or (not busy and tries > 0)
                or w.phase is not None):
            self.sim.schedule(self.sim.now + 0.3, lambda: self._kill_contributor(tries - 1), "kill a contributor")
            return
        self._kill(self.rng.choice(busy or others), "contributor mid-round" if busy else "a site")

    def _kill_mid_exchange(self, rng: random.Random, tries: int) -> None:
        """kill -9 of a contributor while the leader fetches its pseudo-gradient (its report admitted,
        the round not yet proposed): the fetch fails and the leader decides without it."""
        w = self.world
        leader = w.leader()
        node = self.sim.node(leader) if leader else None
        fetching = node.core.decision.fetching if isinstance(node, PeerNode) else None
        victims = sorted(c.site for c in fetching.admitted if c.site != leader) if fetching else []
        if not victims or len(w.up()) <= len(w.names) // 2 + 1 or w.phase is not None:
            if tries > 0:
                self.sim.schedule(self.sim.now + 0.05, lambda: self._kill_mid_exchange(rng, tries - 1),
                                  "kill a contributor mid-exchange (retry)")
            return
        self._kill(SiteId(rng.choice(victims)), "a contributor, mid-exchange")

    def _bounce(self, rng: random.Random, tries: int) -> None:
        """kill -9 of a site as the leader is about to open a round (it applies the last one), restarted before membership declares it dead: the open reaches no process, the site
        stays on the leader's live list, and only the news of its new process (UP_S after the restart)
        can tell the leader to send the open again."""
        w = self.world
        leader = w.leader()
        node = self.sim.node(leader) if leader else None
        soon = (isinstance(node, PeerNode) and node.rounds.leader._open is None
                and not node.core.decision.deciding and not node.core.applier.idle)  # applying: opens next
        victims = sorted(n for n in w.up() if n != leader and n in w.live)
        if not soon or not victims or len(w.up()) <= len(w.names) // 2 + 1 or w.phase is not None:
            if tries > 0:
                self.sim.schedule(self.sim.now + 0.05, lambda: self._bounce(rng, tries - 1),
                                  "kill and restart a site as a round opens (retry)")
            return
        name = SiteId(rng.choice(victims))
        w.note(f"kill {name} as a round opens; it restarts before membership declares it dead")
        w.disrupted = self.sim.now
        self.sim.crash(name)
        w.bouncing.add(name)

        def back() -> None:
            w.bouncing.discard(name)
            w.disrupted = self.sim.now
            if self.sim.state(name) is NodeState.DOWN and name not in w.gone:
                w.note(f"start {name} (fast restart)")
                self.sim.restart(name)
                self.sim.schedule(self.sim.now + UP_S, lambda: w.tell("member_alive", name), f"{name} is back")
                w.bounced_until = self.sim.now + UP_S + w.rounds.deadline_s

        self.sim.schedule(self.sim.now + rng.uniform(0.3, 1.0), back, f"restart {name}")

    def _kill_leader(self) -> None:
        w = self.world
        leader = w.leader()
        node = self.sim.node(leader) if leader else None
        in_round = isinstance(node, PeerNode) and (node.rounds.leader._open is not None or node.core.decision.deciding)
        if leader is None or not in_round or len(w.up()) <= len(w.names) // 2 + 1 or w.phase is not None:
            self.sim.schedule(self.sim.now + 0.5, self._kill_leader, "kill the leader (retry)")
            return
        self._kill(leader, "the leader, mid-round")

    # ----- the fault phases: one at a time, each at a quiet moment -------------------------------
    def _quiet(self) -> bool:
        """Every site that has not left is up (not killed, paused or yet to join), and nothing is cut."""
        w = self.world
        if (w.phase is not None or w.cut is not None or w.leaving is not None or w.bouncing
                or self.sim.now < w.bounced_until):
            return False
        here = {n for n in w.names if n not in w.gone}
        leader = w.leader()
        return (all(self.sim.state(n) is NodeState.UP for n in here) and w.live == here
                and leader is not None and set(w.voters(leader)) == here)

    def _next_phase(self, phases: list[str]) -> None:
        w = self.world
        if not phases:
            return
        if not self._quiet():
            self.sim.schedule(self.sim.now + 0.5, lambda: self._next_phase(phases), "next fault phase (wait)")
            return
        kind = phases.pop(0)
        w.phase = kind

        def done() -> None:
            w.phase = None
            w.phases_done.append(kind)
            self.sim.schedule(self.sim.now + self.rng.uniform(1, 4), lambda: self._next_phase(phases),
                              "next fault phase")

        run: dict[str, Callable[[Callable[[], None]], None]] = {
            "partition": self._partition, "one_way": partial(self._partition, one_way=True),
            "leave": self._leave_down, "leave_all": self._leave_all, "restart": self._stop_all}
        run[kind](done)

    def _partition(self, done: Callable[[], None], one_way: bool = False) -> None:
        """Cut a minority (one or two sites, the leader among them half the time) off for longer than a
        lease, then heal. Each side's membership declares the other side dead, and alive after the heal.
        `one_way`: only one direction is cut, chosen per seed (the minority hears the majority but is
        not heard, or the reverse): pings go unanswered either way, so membership's verdicts are those
        of a partition, while consensus and round messages still flow the other way."""
        w = self.world
        rng, now = self.rng, self.sim.now
        up, leader = w.up(), w.leader()
        k = rng.choice([1, 2]) if len(up) >= 5 else 1
        pool = [n for n in up if n != leader]
        if leader is not None and rng.random() < 0.5:
            minority = [leader, *rng.sample(pool, k - 1)]
        else:
            minority = rng.sample(pool, k)
        cut = frozenset(minority)
        majority = [n for n in w.names if n not in cut]
        deaf = one_way and rng.random() < 0.5  # the minority cannot hear (else: cannot be heard)
        if not one_way:
            self.sim.network.partition([sorted(cut), majority])
        elif deaf:
            self.sim.network.one_way(majority, sorted(cut))
        else:
            self.sim.network.one_way(sorted(cut), majority)
        w.cut = (cut, now)
        w.disrupted = now
        how = "|" if not one_way else ("<- (hears nothing from)" if deaf else "-> (is not heard by)")
        w.note(f"{'one-way cut' if one_way else 'partition'} {','.join(sorted(cut))} {how} {','.join(majority)}"
                   + (f" (leader {leader} cut off)" if leader in cut else ""))

        def verdicts(method: str) -> None:
            inside = [n for n in w.up() if n in cut]
            outside = [n for n in w.up() if n not in cut]
            for n in sorted(cut):
                w.tell_some(method, n, outside)
            for n in outside:
                w.tell_some(method, n, inside, world=method == "member_alive")

        def heal() -> None:
            self.sim.network.heal()
            w.cut = None
            w.disrupted = self.sim.now
            w.note("heal the one-way cut" if one_way else "heal the partition")
            def alive_again() -> None:
                verdicts("member_alive")
                done()

            self.sim.schedule(self.sim.now + DETECT_S, alive_again, "alive again")

        self.sim.schedule(now + DETECT_S, lambda: verdicts("member_down"), "dead across the cut")
        self.sim.schedule(now + rng.uniform(6, 15), heal, "heal")

    def _leave_down(self, done: Callable[[], None]) -> None:
        """`ops leave` site after site until one is left; it commits rounds alone; then they join again."""
        w = self.world
        up = w.up()
        survivor = self.rng.choice(up)
        order: list[str] = [n for n in up if n != survivor]
        self.rng.shuffle(order)
        w.note(f"ops leave {', '.join(order)} in turn ({survivor} stays)")
        self._leave_step(order, survivor, done)

    def _leave_step(self, order: list[str], survivor: SiteId, done: Callable[[], None]) -> None:
        w = self.world
        if (w.leaving is not None or any(n in w.gone for n in w.voters(survivor))
                or not w.caught_up()):
            # The operator waits for the last leave to finish and its voter removal to commit (leaving
            # faster can take the live voters below a majority of the voter set), and for every site
            # left to hold θ of the newest round (else it may exist only on sites that left: see
            # docs/decisions/site-round-core.md, "stranded θ").
            self.sim.schedule(self.sim.now + 0.5, lambda: self._leave_step(order, survivor, done), "ops leave (wait)")
            return
        if not order:
            w.note(f"{survivor} runs alone")
            self._alone(survivor, len(w.order), self.sim.now + LIVENESS_S, done)
            return
        name = order.pop(0)
        w.leaving = name
        w.disrupted = self.sim.now
        w.note(f"ops leave {name}")
        self.sim.act(name, lambda node, now: node.leave(now))
        self.sim.schedule(self.sim.now + self.rng.uniform(0.5, 2), lambda: self._leave_step(order, survivor, done),
                          "ops leave (next)")

    def _alone(self, survivor: SiteId, rounds: int, until: float, done: Callable[[], None]) -> None:
        """Wait for the lone site to commit two rounds (or the data to end), then every leaver joins again."""
        w = self.world
        if len(w.order) < rounds + 2 and w.epochs_done < w.cfg.epochs and self.sim.now < until:
            self.sim.schedule(self.sim.now + 0.5, lambda: self._alone(survivor, rounds, until, done), "alone")
            return
        back = sorted(w.gone)
        self.rng.shuffle(back)
        last = self.sim.now
        for name in back:
            last += self.rng.uniform(0.5, 3)
            self.sim.schedule(last, partial(self._rejoin, SiteId(name)), f"rejoin {name}")
        self.sim.schedule(last + DETECT_S, done, "every leaver is back")

    def _leave_all(self, done: Callable[[], None]) -> None:
        """SIGTERM to every site at once (`ops/local_mesh.py stop`): each leaves gracefully, no leader
        that stays opens a round after, and each must stop anyway, well within its leave wait, with θ
        of the last committed round on some disk (the run pauses, not lost). Then all start again."""
        w = self.world
        up, t0 = w.up(), self.sim.now
        w.note(f"SIGTERM every site ({', '.join(up)}): ops leave of all at once")
        w.disrupted = t0
        for n in up:  # one signal after the other, as a shell loop sends them, some before the others' gossip
            self.sim.schedule(t0 + self.rng.uniform(0, 2 * LEFT_S), partial(self.sim.act, n, lambda node, now: node.leave(
                now, LEAVE_ALL_WAIT_S)), f"SIGTERM {n}")

        def stopped() -> None:
            took = self.sim.now - t0
            running = [n for n in up if self.sim.state(n) is not NodeState.DOWN]
            if running and took <= LEAVE_ALL_S:
                self.sim.schedule(self.sim.now + 0.25, stopped, "every site stopped (wait)")
                return
            if running:
                w.violations.append(f"every site was told to leave at t={t0:.2f}; {', '.join(running)} still "
                                       f"running {took:.1f} s later (> {LEAVE_ALL_S:g} s): a leave waits for a "
                                       "round nobody will open (liveness)")
                return
            w.leave_all_s.append(took)
            w.note(f"every site left in {took:.1f}s")
            # A commit without contributors needs nobody's Δ: θ of it follows from the disk before it.
            newest = max(w.disks[n].round for n in w.names)
            needed = [rnd for rnd in w.order if rnd > newest and w.commits[rnd].contributors]
            if needed:
                w.violations.append(f"every site left and none holds θ of committed round {needed[-1]} (newest "
                                       f"on a disk: {newest}), which needs the pseudo-gradients of sites that left: "
                                       "lost, not paused")
            self._alone(SiteId(up[0]), 0, self.sim.now, done)  # every leaver starts again

        self.sim.schedule(t0 + 0.25, stopped, "every site stopped")

    def _rejoin(self, name: SiteId) -> None:
        w = self.world
        w.gone.discard(name)
        w.join(name)

    def _stop_all(self, done: Callable[[], None]) -> None:
        """kill -9 of every site at once; each restarts from its disk a few seconds later."""
        w = self.world
        up = w.up()
        w.note("kill -9 every site")
        w.disrupted = self.sim.now
        for n in up:
            self.sim.crash(n)
        w.live.clear()
        back = self.sim.now + self.rng.uniform(2, 6)
        for n in up:
            self.sim.schedule(back + self.rng.uniform(0, 1), partial(w.join, n), f"restart {n}")
        self.sim.schedule(back + 1 + DETECT_S, done, "every site is back")
