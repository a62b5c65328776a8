"""The peer process: wires the protocol cores to gRPC, disk, timers and signals.

    peer serve --site a --listen 127.0.0.1:7001 --data-dir /tmp/a
    peer serve --site b --listen 127.0.0.1:7002 --data-dir /tmp/b --join 127.0.0.1:7001

One asyncio event loop owns every core, so cores need no locks: RPC handlers and one timer task
feed them events in turn and execute the effects they return, in order. Training runs in other
processes (docs/decisions/node-asyncio.md) so nothing here is starved by a CUDA sync or a GC pause.

The node executes the effects of membership (SWIM/Lifeguard, behind member_admission.py's gate)
and consensus (election + round-commit log), feeding membership's state changes to consensus as
alive/left/dead, and hands the round and lease cores to the coordinator (coordinator.py), which
runs their effects through the node's sends and proposals (runtime_view.Runtime).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tenacity import AsyncRetrying, RetryError, retry_if_result, stop_after_delay, wait_exponential

from peer import __version__
from peer.core import consensus as c
from peer.core import consensus_effects as ce
from peer.core import agreement
from peer.core import membership as m
from peer.core.commitlog import Entry, RoundCommit
from peer.config import PeerConfig
from peer.core.election import Role, SiteId
from peer.core.member_admission import MemberAdmission
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.logstore import FileStore
from peer.peer_events import PeerEvents
from peer.admin_rpc import AdminServicer
from peer.applied_pointer import Applied, AppliedPointer
from peer.join_errors import JoinFailed, JoinRefused
from peer.dirlock import lock_dir
from peer.reach import Reach
from peer.transport.channels import ChannelPool, bind, new_server
from peer.transport.guard import site_security
from peer.transport.consensus_rpc import CONSENSUS
from peer.transport.membership_rpc import MEMBERSHIP
from peer.transport.oneway import OneWaySender, Refused
from peer.transport.wire import MAX_MEMBERS
from peer.transport.leases_rpc import LEASES
from peer.transport.rounds_rpc import ROUNDS
from peer.coordinator import Coordinator
from peer.exchange.service import add_exchange_service
from peer.gen.sitemesh.v1 import exchange_pb2
from peer.core.rounds import EmptyRounds
from peer.core.seat_leave import SayLeft, SeatLeave
from peer.core.rounds import Message as RoundMessage
from peer.core.lease_types import Message as LeaseMessage
from peer.trainer.identity import training_identity
from peer.trainer.process import TrainerError
from peer.training import SiteTraining

log = logging.getLogger("sitemesh.node")

SERVICE_NAMES = (
    MEMBERSHIP.full_name,
    CONSENSUS.full_name,
    ROUNDS.full_name,
    LEASES.full_name,
    exchange_pb2.DESCRIPTOR.services_by_name["Exchange"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
)


class Node:
    """A running peer: gRPC server, membership and consensus cores, timers, durable state."""

    def __init__(
        self,
        config: PeerConfig,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._rng = rng or random.Random()
        # Certificates are read here, so a missing or wrong one stops the peer before it binds.
        self.creds, self.guard = site_security(config.certs, config.site, config.run_name)
        self._server = new_server((self.guard,))
        self.reach = Reach(config, self.creds)
        self._pool = ChannelPool(self.creds, self.reach.dialer)
        delivery_timeout = max(config.membership.probe_timeout_s * 4, 1.0)
        self._gossip = OneWaySender(MEMBERSHIP, self._pool, delivery_timeout)
        self._consensus_sender = OneWaySender(CONSENSUS, self._pool, delivery_timeout)
        self._rounds = OneWaySender(ROUNDS, self._pool, delivery_timeout)
        self._leases = OneWaySender(LEASES, self._pool, delivery_timeout)
        self._health = health.aio.HealthServicer()
        self._wake = asyncio.Event()
        self._changed: set[asyncio.Future[None]] = set()
        """Waiters of `_wait_until`: woken whenever anything may have changed a core's state."""
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[object]] = set()
        self._started_at = clock()
        self._empty_rounds = EmptyRounds(config.round_interval_s)
        self.address = ""
        self.failed = False
        """True when the peer stopped because of an internal error (exit status 1)."""
        self.data_dir = config.data_dir or Path(tempfile.mkdtemp(prefix=f"sitemesh-{config.site}-"))
        self.membership: m.Membership | None = None
        self.consensus: c.ConsensusCore | None = None
        self._store: FileStore | None = None
        self._lock: IO[str] | None = None
        self.applied_round = 0
        self.coordinator: Coordinator | None = None
        self.events = PeerEvents()
        """Event counts for the metrics endpoint (peer/metrics.py)."""
        self.refused: collections.Counter[tuple[str, str, str]] = collections.Counter()
        """(layer, sender, message) -> membership and consensus messages refused as no honest peer
        sends them (forged or buggy; peer/core/membership_guard.py, consensus_checks.py)."""
        self.metrics_port: int | None = None
        """The bound port of the /metrics endpoint; None when it is off."""
        self.identity: agreement.TrainingIdentity | None = None
        """What this site trains (model, tokenizer, data by content), published in its membership
        labels and checked against every sender's (peer/core/agreement.py); None without a trainer."""
        self._applied = AppliedPointer(self.data_dir / "state")
        """What a peer without a trainer applied (a training peer's θ store keeps its own)."""
        self._admission = MemberAdmission(config.site, MAX_MEMBERS, config.membership.probe_interval_s)
        """Who is let into membership at all: no duplicate site, no table overflow, no other run."""
        if config.trainer is not None and config.rounds is not None:
            training = SiteTraining(config.site, self.data_dir, config.trainer, config.outer, self.creds,
                                    config.exchange_plane, config.trainer_threads, self.reach.dialer)
            rounds = dataclasses.replace(config.rounds, overlap=config.overlap)
            self.coordinator = Coordinator(self, training, rounds, config.leases)

    # ----- lifecycle -------------------------------------------------------------------------
    async def start(self) -> str:
        """Binds the server, loads durable state and starts the cores; returns the dial address."""
        host, _ = self.config.listen.rsplit(":", 1)
        self._lock = lock_dir(self.data_dir)
        port = bind(self._server, self.config.listen, self.creds)
        self.address = self.config.dial_address(f"{host}:{port}")
        if self.coordinator is not None:
            self.identity = await self._training_identity()
        now = self._clock()
        meta = m.MemberMeta(
            site=self.config.site,
            address=self.address,
            role="voter",
            accelerator=self.config.accelerator,
            tokens_per_s=self.config.tokens_per_s,
            labels=self.identity.labels() if self.identity is not None else (),
        )
        self.membership = m.Membership(meta, self.config.membership, self._rng, now)
        self.consensus = self._start_consensus(now)
        self._server.add_generic_rpc_handlers((
            MEMBERSHIP.handler(self.deliver),
            CONSENSUS.handler(self.deliver_consensus),
            ROUNDS.handler(self.deliver_round),
            LEASES.handler(self.deliver_lease),
        ))
        bulk_plane = None
        if self.coordinator is not None:
            training = self.coordinator.training
            bulk_plane = training.exchange.serve_bulk(host)
            add_exchange_service(self._server, training.exchange.store, bulk_plane)
        admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(self), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self._server,
        )
        try:
            await self._server.start()
        except BaseException:
            if bulk_plane is not None:
                bulk_plane.close()  # its listener would outlive the node that failed to start
            raise
        if self.config.metrics_listen:
            from peer import metrics

            self.metrics_port = metrics.serve(self, self.config.metrics_listen)
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self.reach.start(port, bulk_plane.port if bulk_plane is not None else None, self.config.join_timeout_s)
        self.spawn(self._timer_loop())
        if self.coordinator is not None:
            # Builds the trainer (tokenizing on first use); meanwhile the site is a live member.
            await self.coordinator.start()
        return self.address

    async def _training_identity(self) -> agreement.TrainingIdentity:
        """What this site trains, computed before it joins anything (content hashes are cached: a
        restart costs a stat per shard and a tokenizer load)."""
        assert self.config.trainer is not None
        t0 = self._clock()
        try:
            identity = await asyncio.to_thread(training_identity, self.config.trainer)
        except (OSError, ValueError) as err:
            raise TrainerError(f"what this site trains cannot be identified: {err}", fatal=True) from err
        log.info("trains %s (model, tokenizer, data by content; %.2f s to identify)", identity.fingerprint,
                 self._clock() - t0)
        return identity

    def _start_consensus(self, now: float) -> c.ConsensusCore:
        """Loads (or founds) the commit log. A peer with no seeds and no state founds a new run
        with itself as the only voter; a joining peer starts empty and receives the log."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._store = FileStore(self.data_dir / "consensus")
        founders = None if self.config.join else {SiteId(self.config.site): self.address}
        # What this peer applied is fsynced apart from the log: the log must still reach it.
        applied = self.coordinator.training.pointer() if self.coordinator is not None else self._applied.pointer()
        durable = self._store.load_or_init(c.DurableState.fresh(founders), keep_through=applied[0])
        if self._store.recovered:
            log.warning("commit log repaired at start-up: %s", self._store.recovered)
        log.info("state in %s: log up to index %d, applied %d (round %d)",
                 self.data_dir, len(durable.entries) + durable.snapshot.last_index, applied[0], applied[1])
        self.applied_round = applied[1]
        return c.ConsensusCore.start(SiteId(self.config.site), self.address, self.config.election, durable, now,
                                     self._rng, applied_index=applied[0])

    async def join(self, seeds: Iterable[str]) -> int:
        """Joins through any of `seeds`, retrying with exponential backoff until join_timeout_s.

        A peer the mesh reached another way (a member's push-pull: an operator's `ops join`, a
        member dialling this site's address) has joined too, whether or not a seed answered.
        Returns the number of members known afterwards; raises JoinFailed naming the seeds.
        """
        seeds = [s for s in seeds if s != self.address]
        if not seeds:
            return len(self.members())
        retrying = AsyncRetrying(
            stop=stop_after_delay(self.config.join_timeout_s),
            wait=wait_exponential(multiplier=0.2, max=5.0),
            retry=retry_if_result(lambda joined: not joined),
        )
        try:
            await retrying(self._attempt_join, seeds)
        except RetryError as err:
            if self._members_heard():
                return self._joined_elsewhere(seeds)
            raise JoinFailed(
                f"no seed of {', '.join(seeds)} answered within {self.config.join_timeout_s:.0f} s "
                f"({err.last_attempt.attempt_number} attempts): check the addresses, that a peer "
                "runs there, that it serves this run, with certificates of the same run CA, and that this "
                f"host can reach it; last error: {self._gossip.last_error or 'none'}"
            ) from None
        if not self._membership().joined:
            return self._joined_elsewhere(seeds)
        return len(self.members())

    def _members_heard(self) -> list[str]:
        """Live members other than this peer: each was heard of in a message from the mesh."""
        return [v.site for v in self.members() if v.site != self.config.site and v.state is m.MemberState.ALIVE]

    def _joined_elsewhere(self, seeds: list[str]) -> int:
        # The membership core keeps sending its join to the seeds; one answering later merges as usual.
        log.info("joined through another member (%s knows of %s); no seed of %s has answered yet",
                 self.config.site, ", ".join(self._members_heard()), ", ".join(seeds))
        return len(self.members())

    async def _attempt_join(self, seeds: list[str]) -> bool:
        core = self._membership()
        await self._execute(core.join(seeds, self._clock()), wait=True)
        for seed in seeds:
            if seed in self._gossip.refused:
                raise JoinRefused(f"the run refused this site (seed {seed}): {self._gossip.refused[seed]}")
        return await self._wait_until(lambda: core.joined or bool(self._members_heard()),
                                      self.config.membership.probe_timeout_s * 4)

    async def leave(self) -> int:
        """Graceful leave (I8): hand the voter seat back through the log, tell the members, stop.

        Returns the number of members told. When to say LEFT and when to stop is the seat's
        protocol (peer/core/seat_leave.py), which the whole-peer simulator runs too.
        """
        consensus = self._consensus()
        me = self._membership().member(self.config.site)
        if me is not None and me.meta is not None and m.LEAVING not in me.meta.labels:
            # Tell the others at once (gossip) that this site will not stay: when every site leaves
            # together, each ends its wait for a round nobody would open (SiteRound._leave).
            meta = dataclasses.replace(me.meta, labels=(*me.meta.labels, m.LEAVING))
            await self._execute(self._membership().set_meta(meta, self._clock()))
            self.wake()
        if self.coordinator is not None:
            # Rounds and leases first, while this site is still a member the others answer (I8).
            await self.coordinator.prepare_leave(self.coordinator.config.deadline_s)
            await asyncio.sleep(0)  # let the Release sends start before counting what is in flight
            await self._wait_until(lambda: self._leases.in_flight == 0, self.config.membership.probe_timeout_s * 4)
        voter = consensus.is_voter()
        decision = consensus.leave(self._clock())
        log.info("leaving: %s", decision.reason)
        self._execute_consensus(decision.effects)
        election = self.config.election.election_timeout_max_s
        # The leader waits for its removal to commit; a follower for an election first (the leader
        # may be the site that left just before) and then its removal.
        seat = SeatLeave(decision.accepted, voter, consensus.role is Role.LEADER, self._clock(), election * 2, election * 4)
        told = 0
        while True:
            for effect in seat.update(self._clock(), consensus.removed()):
                if isinstance(effect, SayLeft):
                    effects = self._membership().leave(self._clock())
                    told = sum(1 for e in effects if isinstance(e, m.Send))
                    await self._execute(effects, wait=True)
                else:
                    log.info("left: %s", effect.reason)
                    self.stop()
                    return told
            await self._wait_until(consensus.removed, seat.next_deadline() - self._clock())

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        # Grace lets an in-flight Admin.Leave call return its reply before the server goes.
        await self._server.stop(grace=0.5)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._pool.close()
        await self.reach.close()
        try:  # the bulk listener closes in coordinator.close(): a successor may take the lock after
            if self.coordinator is not None:
                await self.coordinator.close()
        finally:
            if self._lock is not None:
                self._lock.close()

    # ----- events --------------------------------------------------------------------------
    def deliver(self, msg: m.Message) -> str | Refused | None:
        """A membership message arrived (called on the event loop by the servicer); returns why it
        is refused, if it is."""
        if self._stopped.is_set():
            return None
        refused = self._admission.check(msg, self.address, self._membership().members(), self._clock(), self.identity)
        if refused is not None and not refused.final:
            return refused.reason
        if refused is not None:
            if refused.first:
                log.warning("refused %s: %s", msg.from_site, refused.reason)
            return Refused(refused.reason)
        self.spawn(self._execute(self._membership().receive(msg, self._clock())))
        self.wake()
        return None

    def deliver_consensus(self, msg: c.Message) -> None:
        """A consensus message arrived; its effects run in order (persist before send)."""
        if self._stopped.is_set():
            return
        # Synchronously: the effects of one message must all run before the next message's.
        self._execute_consensus(self._consensus().receive(msg, self._clock()))
        self.wake()

    def deliver_round(self, msg: RoundMessage) -> None:
        """A round message (open, contribution) arrived."""
        if self._stopped.is_set() or self.coordinator is None:
            return
        self.coordinator.receive(msg)
        self.wake()

    def deliver_lease(self, msg: LeaseMessage) -> None:
        """A data-lease message (grant, renewal, start, claim, replication...) arrived."""
        if self._stopped.is_set() or self.coordinator is None:
            return
        self.coordinator.receive_lease(msg)
        self.wake()

    def send_round_message(self, address: str, msg: RoundMessage) -> None:
        self.spawn(self._rounds.send(address, msg))

    def send_lease_message(self, address: str, msg: LeaseMessage) -> None:
        self.spawn(self._leases.send(address, msg))

    def propose(self, commit: RoundCommit) -> bool:
        """Leader: append the round's decision to the log; False (with the reason logged) if refused."""
        decision = self._consensus().propose_round(commit, self._clock())
        if not decision.accepted:
            log.warning("round %d not proposed: %s", commit.round, decision.reason)
            return False
        self.events.proposed(commit.round, self._clock())
        self._execute_consensus(decision.effects)
        return True

    def consensus_core(self) -> c.ConsensusCore:
        return self._consensus()

    def members(self) -> list[m.MemberView]:
        return self._membership().members()

    def member(self, site: str) -> m.MemberView | None:
        return self._membership().member(site)

    def consensus_status(self) -> ce.Status:
        return self._consensus().status()

    def now(self) -> float:
        return self._clock()

    def uptime_s(self) -> float:
        return self._clock() - self._started_at

    @property
    def version(self) -> str:
        return __version__

    # ----- internals -----------------------------------------------------------------------
    def _membership(self) -> m.Membership:
        if self.membership is None:
            raise RuntimeError("node not started")
        return self.membership

    def _consensus(self) -> c.ConsensusCore:
        if self.consensus is None:
            raise RuntimeError("node not started")
        return self.consensus

    async def _timer_loop(self) -> None:
        try:
            await self._timers()
        except Exception:
            # A bug here would leave a peer that answers RPCs but never probes or votes: a zombie.
            # Exiting (non-zero) is what lets Slurm and the other sites see the truth.
            log.exception("timer loop failed; stopping this peer")
            self.failed = True
            self.stop()

    async def _timers(self) -> None:
        membership, consensus = self._membership(), self._consensus()
        while not self._stopped.is_set():
            now = self._clock()
            await self._execute(membership.tick(now))
            self._execute_consensus(consensus.tick(now))
            if self.coordinator is not None:
                self.coordinator.tick(now)
            else:
                self._maybe_propose_round(now)
            self._notify_changed()
            # Cleared only now: the ticks above never yield to the loop, so every wake() so far came
            # from them and the deadlines below account for it. Clearing it first made each tick's
            # own wake() (a Tick fed to the round core) run the next tick at once: a busy loop that
            # kept one core at 100% for the whole run.
            self._wake.clear()
            deadline = min(membership.next_deadline(), consensus.next_deadline(), self._next_round_deadline())
            delay = deadline - self._clock()
            if delay <= 0:
                await asyncio.sleep(0)  # due now: let the messages and completions waiting run first
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=None if delay == float("inf") else delay)
            except asyncio.TimeoutError:
                pass

    def _next_round_deadline(self) -> float:
        if self.coordinator is not None:
            return self.coordinator.next_deadline()
        return self._empty_rounds.next_deadline(self._consensus().role is Role.LEADER)

    def _maybe_propose_round(self, now: float) -> None:
        consensus = self._consensus()
        leading = consensus.role is Role.LEADER
        if self._empty_rounds.next_deadline(leading) > now:
            return  # not due: spare reading the log
        status = consensus.status()
        _, _, weights = consensus.log.last_round_entry(status.commit_index)
        commit = self._empty_rounds.tick(now, leading, status.committed_round, weights)
        if commit is not None:
            self.propose(commit)

    async def _execute(self, effects: Sequence[m.Effect], wait: bool = False) -> None:
        sends = []
        consensus = self._consensus()
        for effect in effects:
            if isinstance(effect, m.Send):
                sends.append(self._gossip.send(effect.to, effect.msg))
            elif isinstance(effect, m.StateChanged):
                old = effect.old.name.lower() if effect.old else "unknown"
                log.info("member %s: %s -> %s (incarnation %d): %s",
                         effect.site, old, effect.new.name.lower(), effect.incarnation, effect.reason)
                view = self._membership().member(effect.site)
                consensus.member_changed(SiteId(effect.site), effect.new, view.address if view else "")
                if self.coordinator is not None and effect.new in (m.MemberState.DEAD, m.MemberState.LEFT):
                    self.coordinator.member_down(effect.site)
                elif self.coordinator is not None and effect.new is m.MemberState.ALIVE:
                    # Back up, or a new process at a new address: a one-way round open sent meanwhile
                    # may be lost (docs/decisions/rounds-open-resend.md).
                    self.coordinator.member_up(effect.site)
                self.events.member_changed(effect.old, effect.new)
                self.wake()  # the live sites changed: the leader may open, or stop waiting
            elif isinstance(effect, m.Rejected):
                self._log_refusal("membership", effect.from_site, f"{effect.what} ({effect.kind.value})",
                                  effect.reason)
        if wait:
            await asyncio.gather(*sends)
        else:
            for coro in sends:
                self.spawn(coro)

    def _execute_consensus(self, effects: Sequence[ce.Effect]) -> None:
        """Runs consensus effects strictly in order: a Persist* is fsynced before any later Send."""
        store = self._store
        assert store is not None
        committed: list[Entry] = []
        for effect in effects:
            if store.persist(effect):
                continue
            if isinstance(effect, ce.Send):
                self.spawn(self._consensus_sender.send(effect.address, effect.msg))
            elif isinstance(effect, ce.Committed):
                committed.append(effect.entry)
            elif isinstance(effect, ce.SnapshotInstalled):
                store.save_commit_index(effect.snapshot.last_index)
                if self.coordinator is None:  # a training peer's pointer moves with its θ (catch_up)
                    self._applied.save(Applied(effect.snapshot.last_index, effect.snapshot.last_round))
            elif isinstance(effect, ce.LeaderChanged):
                log.info("leader of epoch %d: %s", effect.epoch, effect.leader or "none")
                if self.coordinator is not None:
                    self.coordinator.on_leader_changed(effect.leader, effect.epoch)
            elif isinstance(effect, ce.Rejected):
                if effect.kind is c.RefusalKind.IMPLAUSIBLE:
                    self._log_refusal("consensus", effect.from_site, effect.what, effect.reason)
                else:  # fencing a stale epoch is an event operators want to see; log repair is routine
                    log.log(logging.INFO if effect.kind is c.RefusalKind.STALE else logging.DEBUG,
                            "consensus refused %s from %s: %s", effect.what, effect.from_site, effect.reason)
        if committed:
            # Durable before anything acts on it: `ops audit` trusts entries up to this index only.
            store.save_commit_index(committed[-1].index)
            self._apply(committed)

    def _log_refusal(self, layer: str, sender: str, what: str, reason: str) -> None:
        """A message no honest peer sends (forged, or a bug): a warning once per (layer, sender,
        message), so a hostile site cannot flood the log (the keys are bounded by the run's
        certificates and the message types), and always counted."""
        key = (layer, sender, what)
        if key not in self.refused:
            log.warning("%s refused %s from %s: %s; further refusals of this kind are only counted",
                        layer, what, sender, reason)
        self.refused[key] += 1

    def _apply(self, entries: Sequence[Entry]) -> None:
        """Committed entries of one batch, in log order (the lease cores want a batch at once)."""
        for entry in entries:
            if isinstance(entry.body, RoundCommit):
                self.applied_round = entry.body.round
                self.events.committed(entry.body.round, self._clock())
                log.info("round %d committed (epoch %d, %d contributors)",
                         entry.body.round, entry.epoch, len(entry.body.contributors))
            else:
                log.info("log entry %d applied: %s", entry.index, entry.body)
        if self.coordinator is not None:
            # The training state records what it applied, once θ_r is durable.
            self.coordinator.on_entries(entries)
        else:
            self._applied.save(Applied(entries[-1].index, self.applied_round))

    async def _wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Re-checks `predicate` whenever the node handled something (a message, a timer, a send
        finishing: `_changed` waiters are woken by `wake`), until it holds or `timeout_s` passed."""
        deadline = self._clock() + timeout_s
        while not predicate():
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            changed = asyncio.get_running_loop().create_future()
            self._changed.add(changed)
            try:
                await asyncio.wait_for(changed, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                self._changed.discard(changed)
        return True

    def wake(self) -> None:
        """Something changed: the timer loop recomputes its deadline, `_wait_until` re-checks."""
        self._wake.set()
        self._notify_changed()

    def _notify_changed(self) -> None:
        for waiter in self._changed:
            if not waiter.done():
                waiter.set_result(None)

    def spawn(self, coro: object) -> None:
        """Runs `coro` on the loop; the node keeps it alive and cancels it at stop."""
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        self._notify_changed()  # a send finished (in-flight counts), a join's reply was handled ...
