"""The peer process: wires the protocol cores to gRPC, disk, timers and signals.

    peer serve --site a --listen 127.0.0.1:7001 --data-dir /tmp/a
    peer serve --site b --listen 127.0.0.1:7002 --data-dir /tmp/b --join 127.0.0.1:7001

One asyncio event loop owns every core, so cores need no locks: RPC handlers and one timer task
feed them events in turn and execute the effects they return, in order. Training runs in other
processes (docs/decisions/node-asyncio.md) so nothing here is starved by a CUDA sync or a GC pause.

The node executes the effects of membership (SWIM/Lifeguard, behind member_admission.py's gate)
and of the peer's protocol (peer/core/peer_core.py: consensus, the rounds and a leave's seat,
routed there): consensus's sends, persists and commits here; the rounds' trainer, exchange and
lease work in the coordinator (coordinator.py), to which this executor hands those effects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import tempfile
import time
from collections import deque
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
from peer.core import events as ev
from peer.core.commitlog import Entry, RoundCommit
from peer.config import PeerConfig
from peer.core.election import SiteId
from peer.core.peer_core import Commits, Effect, PeerCore, Proposed, View
from peer.core.membership_types import LIVE
from peer.core.peer_rounds import PeerRounds
from peer.core.member_admission import MemberAdmission
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.logstore import FileStore
from peer.peer_events import PeerEvents
from peer.admin_rpc import AdminServicer
from peer.applied_pointer import Applied, AppliedPointer, state_dir
from peer.join_errors import JoinFailed, JoinRefused
from peer.changes import Changes
from peer.dirlock import lock_dir
from peer.head_start import HeadStart
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
from peer.core.rounds import EmptyRounds, Message as RoundMessage
from peer.core.seat_leave import SayLeft, Stop
from peer.core.lease_types import LeaseEvent, Message as LeaseMessage, Send as LeaseSend
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
        head: HeadStart | None = None,  # the lock and trainer taken before the imports; now the node's
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
        self._changes = Changes(clock)
        """Waiters on the cores' state (a join, a leave's sends): woken whenever anything may change it."""
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[object]] = set()
        self._started_at = clock()
        self.address = ""
        self.failed = False
        """True when the peer stopped because of an internal error (exit status 1)."""
        self.data_dir = config.data_dir or Path(tempfile.mkdtemp(prefix=f"sitemesh-{config.site}-"))
        self.membership: m.Membership | None = None
        self.consensus: c.ConsensusCore | None = None
        self.protocol: PeerCore | None = None
        """Consensus, the rounds and a leave's seat, routed (peer/core/peer_core.py); this executes its effects."""
        self._effects: deque[Effect] = deque()
        self._draining = False
        self._leaving: asyncio.Task[int] | None = None
        self._leave_ready: asyncio.Future[None] | None = None
        """Resolved when a graceful leave's round work is done (LeaveReady)."""
        self._said_left: asyncio.Task[None] | None = None
        self._told = 0
        self._store: FileStore | None = None
        self._lock: IO[str] | None = head.lock if head is not None else None
        self.applied_round = 0
        self.coordinator: Coordinator | None = None
        self.events = PeerEvents()
        """Event counts for the metrics endpoint (peer/metrics.py)."""
        self.metrics_port: int | None = None
        """The bound port of the /metrics endpoint; None when it is off."""
        self.identity: agreement.TrainingIdentity | None = None
        """What this site trains (model, tokenizer, data by content), published in its membership
        labels and checked against every sender's (peer/core/agreement.py); None without a trainer."""
        self._applied = AppliedPointer(state_dir(self.data_dir))  # a trainer-less peer's; a θ store keeps its own
        # Who is let into membership at all: no duplicate site, no table overflow, no other run.
        self._admission = MemberAdmission(config.site, MAX_MEMBERS, config.membership.probe_interval_s)
        if (trains := config.training()) is not None:
            training = SiteTraining(config.site, self.data_dir, trains[0], config.outer, self.creds,
                                    config.exchange_plane, config.trainer_threads, self.reach.dialer,
                                    head.trainer if head else None)
            rounds = dataclasses.replace(trains[1], overlap=config.overlap)
            self.coordinator = Coordinator(self, training, rounds, config.leases)

    # ----- lifecycle -------------------------------------------------------------------------
    async def start(self) -> str:
        """Binds the server, loads durable state and starts the cores; returns the dial address."""
        host, _ = self.config.listen.rsplit(":", 1)
        self._lock = self._lock or lock_dir(self.data_dir)
        if self.coordinator is not None:
            self.coordinator.job.started()  # first: a job whose peer fails to start still cost its allocation
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
        election = self.config.election.election_timeout_max_s
        # The leader waits for its removal to commit; a follower for an election first (the leader
        # may be the site that left just before) and then its removal.
        self.protocol = PeerCore(self.consensus, trains=self.coordinator is not None,
                                 empty=None if self.coordinator else EmptyRounds(self.config.round_interval_s),
                                 leader_wait_s=election * 2, follower_wait_s=election * 4)
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
        trainerless = frozenset() if self.coordinator is not None else frozenset({SiteId(self.config.site)})
        durable = self._store.load_or_init(c.DurableState.fresh(founders, trainerless), keep_through=applied[0])
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
        Returns the number of members known afterwards; raises JoinFailed naming the seeds."""
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
        return await self._changes.wait_until(lambda: core.joined or bool(self._members_heard()),
                                      self.config.membership.probe_timeout_s * 4)

    async def leave(self) -> int:
        """Graceful leave (I8): the rounds' work first, then the voter seat back through the log,
        tell the members, stop. Returns the number of members told. Asked twice (SIGTERM and
        `ops leave`), both wait for the one leave."""
        if self._leaving is None:
            self._leaving = asyncio.ensure_future(self._leave())
        return await asyncio.shield(self._leaving)

    async def _leave(self) -> int:
        me = self._membership().member(self.config.site)
        if me is not None and me.meta is not None and m.LEAVING not in me.meta.labels:
            # Tell the others at once (gossip) that this site will not stay: when every site leaves
            # together, each ends its wait for a round nobody would open (SiteRound._leave).
            meta = dataclasses.replace(me.meta, labels=(*me.meta.labels, m.LEAVING))
            await self._execute(self._membership().set_meta(meta, self._clock()))
            self.wake()
        self._leave_ready = asyncio.get_running_loop().create_future()
        wait_s = self.coordinator.config.deadline_s if self.coordinator is not None else 0.0
        self._run(self._protocol().handle(ev.LeaveRequested(wait_s), self._clock(), self._view()))
        await self._leave_ready  # rounds and leases first, while the others still answer this site (I8)
        if self.coordinator is not None:
            await asyncio.sleep(0)  # let the Release sends start before counting what is in flight
            await self._changes.wait_until(lambda: self._leases.in_flight == 0, self.config.membership.probe_timeout_s * 4)
        self._run(self._protocol().give_up_seat(self._clock(), self._view()))
        await self._stopped.wait()  # when to say LEFT and when to stop is the seat's (SeatLeave)
        return self._told

    def _say_left(self) -> None:
        effects = self._membership().leave(self._clock())
        self._told = sum(1 for e in effects if isinstance(e, m.Send))
        self._said_left = asyncio.ensure_future(self._execute(effects, wait=True))

    async def _stop_after_left(self, reason: str) -> None:
        if self._said_left is not None:
            await self._said_left
        log.info("left: %s", reason)
        self.stop()

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
        self._run(self._protocol().consensus_message(msg, self._clock(), self._view()))

    def deliver_round(self, msg: RoundMessage) -> None:
        """A round message (open, contribution) arrived."""
        if self._stopped.is_set():
            return
        self._run(self._protocol().round_message(msg, self._clock(), self._view()))

    def deliver_lease(self, msg: LeaseMessage) -> None:
        """A data-lease message (grant, renewal, start, claim, replication...) arrived."""
        if self._stopped.is_set():
            return
        self._run(self._protocol().lease_message(msg, self._clock(), self._view()))

    def send_round_message(self, address: str, msg: RoundMessage) -> None:
        self.spawn(self._rounds.send(address, msg))

    def send_lease_message(self, address: str, msg: LeaseMessage) -> None:
        self.spawn(self._leases.send(address, msg))

    def attach(self, rounds: PeerRounds, first: ev.Event | None) -> None:
        """The coordinator's trainer started: its round protocol joins (PeerCore.attach)."""
        self._run(self._protocol().attach(rounds, self._clock(), self._view(), first))

    def feed(self, event: ev.Event) -> None:
        """A completion of the coordinator's work (trained, fetched, applied ...) for the rounds."""
        self._run(self._protocol().handle(event, self._clock(), self._view()))

    def last_round_entry(self, upto: int | None = None) -> tuple[int, int, bytes]:
        return self._protocol().last_round_entry(upto)

    def consensus_core(self) -> c.ConsensusCore:
        return self._protocol().consensus

    def members(self) -> list[m.MemberView]:
        return self._membership().members()

    def member(self, site: str) -> m.MemberView | None:
        return self._membership().member(site)

    def consensus_status(self) -> ce.Status:
        return self._protocol().consensus.status()

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

    def _protocol(self) -> PeerCore:
        if self.protocol is None:
            raise RuntimeError("node not started")
        return self.protocol

    def _view(self) -> View:
        """What membership and the disk say now, for the protocol."""
        members = [v for v in self._membership().members() if v.state in LIVE]
        live = frozenset(v.site for v in members)
        leaving = frozenset(v.site for v in members if v.meta is not None and m.LEAVING in v.meta.labels)
        trainerless = frozenset(v.site for v in members if v.meta is not None and not agreement.trains(v.meta.labels))
        if self.coordinator is not None:
            training = self.coordinator.training
            return View(live, leaving, training.applied_round, training.weights_hash, trainerless)
        return View(live, leaving, self.applied_round, trainerless=trainerless)

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
        membership, protocol = self._membership(), self._protocol()
        while not self._stopped.is_set():
            now = self._clock()
            await self._execute(membership.tick(now))
            self._run(protocol.tick(now, self._view()))
            self._changes.notify()
            # Cleared only now: the ticks above never yield to the loop, so every wake() so far came
            # from them and the deadlines below account for it. Clearing it first made each tick's
            # own wake() (a Tick fed to the round core) run the next tick at once: a busy loop that
            # kept one core at 100% for the whole run.
            self._wake.clear()
            deadline = min(membership.next_deadline(), protocol.next_deadline(self._view()))
            delay = deadline - self._clock()
            if delay <= 0:
                await asyncio.sleep(0)  # due now: let the messages and completions waiting run first
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=None if delay == float("inf") else delay)
            except asyncio.TimeoutError:
                pass

    async def _execute(self, effects: Sequence[m.Effect], wait: bool = False) -> None:
        sends = []
        for effect in effects:
            if isinstance(effect, m.Send):
                sends.append(self._gossip.send(effect.to, effect.msg))
            elif isinstance(effect, m.StateChanged):
                old = effect.old.name.lower() if effect.old else "unknown"
                log.info("member %s: %s -> %s (incarnation %d): %s",
                         effect.site, old, effect.new.name.lower(), effect.incarnation, effect.reason)
                view = self._membership().member(effect.site)
                self._run(self._protocol().member_changed(effect.site, effect.new, view.address if view else "",
                                                          self._clock(), self._view()))
                self.events.member_changed(effect.old, effect.new)
            elif isinstance(effect, m.Rejected):
                self.events.refused_message("membership", effect.from_site, f"{effect.what} ({effect.kind.value})",
                                  effect.reason)
        if wait:
            await asyncio.gather(*sends)
        else:
            for coro in sends:
                self.spawn(coro)

    def _run(self, effects: Sequence[Effect]) -> None:
        """Runs the protocol's effects strictly in order (a Persist* is fsynced before any later
        send; the commit index before anything acts on the entries). Effects that running one
        makes (none today: every effect's completion comes back as an event) queue behind."""
        self._effects.extend(effects)
        if self._draining:
            return
        self._draining = True
        try:
            while self._effects:
                self._run_one(self._effects.popleft())
        finally:
            self._draining = False
        self.wake()  # the protocol's next deadline may have moved, `_wait_until` re-checks

    def _run_one(self, effect: Effect) -> None:
        store = self._store
        assert store is not None
        if isinstance(effect, ce.PersistHardState | ce.PersistLog | ce.PersistSnapshot):
            store.persist(effect)
        elif isinstance(effect, ce.Send):
            self.spawn(self._consensus_sender.send(effect.address, effect.msg))
        elif isinstance(effect, Commits):
            # Durable before anything acts on it: `ops audit` trusts entries up to this index only.
            store.save_commit_index(effect.entries[-1].index)
            self._committed(effect.entries)
        elif isinstance(effect, ce.SnapshotInstalled):
            store.save_commit_index(effect.snapshot.last_index)
            if self.coordinator is None:  # a training peer's pointer moves with its θ (catch_up)
                self._applied.save(Applied(effect.snapshot.last_index, effect.snapshot.last_round))
        elif isinstance(effect, ce.LeaderChanged):
            log.info("leader of epoch %d: %s", effect.epoch, effect.leader or "none")
        elif isinstance(effect, ce.Rejected):
            if effect.kind is c.RefusalKind.IMPLAUSIBLE:
                self.events.refused_message("consensus", effect.from_site, effect.what, effect.reason)
            elif effect.from_site == self.config.site and effect.what in ("leadership", "hand-over"):
                log.info("%s: %s", effect.what, effect.reason)  # why this peer stopped leading
            else:  # fencing a stale epoch is an event operators want to see; log repair is routine
                log.log(logging.INFO if effect.kind is c.RefusalKind.STALE else logging.DEBUG,
                        "consensus refused %s from %s: %s", effect.what, effect.from_site, effect.reason)
        elif isinstance(effect, Proposed):
            if effect.accepted:
                self.events.proposed(effect.commit.round, self._clock())
            else:
                log.warning("round %d not proposed: %s", effect.commit.round, effect.reason)
        elif isinstance(effect, ev.LeaveReady):
            if self._leave_ready is not None and not self._leave_ready.done():
                self._leave_ready.set_result(None)
        elif isinstance(effect, SayLeft):
            self._say_left()
        elif isinstance(effect, Stop):
            self.spawn(self._stop_after_left(effect.reason))
        elif isinstance(effect, LeaseSend | LeaseEvent):
            # A run of lease effects at once: the ledger file is appended once per run.
            batch: list[LeaseSend | LeaseEvent] = [effect]
            while self._effects and isinstance(nxt := self._effects[0], LeaseSend | LeaseEvent):
                batch.append(nxt)
                self._effects.popleft()
            assert self.coordinator is not None
            self.coordinator.run_leases(batch)
        elif isinstance(effect, ev.Note):
            log.log(logging.WARNING if effect.warning else logging.INFO, "%s", effect.text)
        else:
            assert self.coordinator is not None, f"{type(effect).__name__} on a peer without rounds"
            self.coordinator.run(effect)

    def _committed(self, entries: Sequence[Entry]) -> None:
        """Committed entries of one batch, in log order."""
        for entry in entries:
            if isinstance(entry.body, RoundCommit):
                self.applied_round = entry.body.round
                self.events.committed(entry.body.round, self._clock())
                log.info("round %d committed (epoch %d, %d contributors)",
                         entry.body.round, entry.epoch, len(entry.body.contributors))
            else:
                log.info("log entry %d applied: %s", entry.index, entry.body)
        if self.coordinator is not None:
            self.coordinator.committed(entries)  # the θ store records what it applied, once θ_r is durable
        else:
            self._applied.save(Applied(entries[-1].index, self.applied_round))

    def wake(self) -> None:
        """Something changed: the timer loop recomputes its deadline, `_changes` waiters re-check."""
        self._wake.set()
        self._changes.notify()

    def spawn(self, coro: object) -> None:
        """Runs `coro` on the loop; the node keeps it alive and cancels it at stop."""
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        self._changes.notify()  # a send finished (in-flight counts), a join's reply was handled ...
