"""The peer process: wires the protocol cores to gRPC, timers and signals.

    peer serve --site a --listen 127.0.0.1:7001
    peer serve --site b --listen 127.0.0.1:7002 --join 127.0.0.1:7001

One asyncio event loop owns every core, so cores need no locks: RPC handlers and the timer task
feed them events in turn and execute the effects they return. Training runs in other processes
(see docs/decisions/node-asyncio.md) so nothing here is starved by a CUDA sync or a GC pause.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tenacity import AsyncRetrying, RetryError, retry_if_result, stop_after_delay, wait_exponential

from peer import __version__
from peer import membership as m
from peer.config import PeerConfig
from peer.gen.sitemesh.v1 import admin_pb2, admin_pb2_grpc
from peer.transport.admin_rpc import AdminServicer
from peer.transport.channels import ChannelPool, bind, new_server
from peer.transport.membership_rpc import MEMBERSHIP
from peer.transport.oneway import OneWaySender

log = logging.getLogger("sitemesh.node")

SERVICE_NAMES = (
    MEMBERSHIP.full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
)


class JoinFailed(RuntimeError):
    """No seed answered within the join timeout."""


class Node:
    """A running peer: gRPC server, membership core, timers."""

    def __init__(
        self,
        config: PeerConfig,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._rng = rng or random.Random()
        self._server = new_server()
        self._pool = ChannelPool()
        self._sender = OneWaySender(MEMBERSHIP, self._pool, timeout_s=max(config.membership.probe_timeout_s * 4, 1.0))
        self._health = health.aio.HealthServicer()
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[object]] = set()
        self._started_at = clock()
        self.address = ""
        self.core: m.Membership | None = None

    # ----- lifecycle -------------------------------------------------------------------------
    async def start(self) -> str:
        """Binds the server and starts the core; returns the address other members dial."""
        host, _ = self.config.listen.rsplit(":", 1)
        port = bind(self._server, self.config.listen)
        self.address = self.config.advertise or f"{host}:{port}"
        meta = m.MemberMeta(
            site=self.config.site,
            address=self.address,
            role="voter",
            accelerator=self.config.accelerator,
            tokens_per_s=self.config.tokens_per_s,
        )
        self.core = m.Membership(meta, self.config.membership, self._rng, self._clock())
        self._server.add_generic_rpc_handlers((MEMBERSHIP.handler(self.deliver),))
        admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(self), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self._server,
        )
        await self._server.start()
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._spawn(self._timer_loop())
        return self.address

    async def join(self, seeds: Iterable[str]) -> int:
        """Joins through any of `seeds`, retrying with exponential backoff until join_timeout_s.

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
            raise JoinFailed(
                f"no seed of {', '.join(seeds)} answered within {self.config.join_timeout_s:.0f} s "
                f"({err.last_attempt.attempt_number} attempts): check the addresses, that a peer "
                "runs there, and that this host can reach it"
            ) from None
        return len(self.members())

    async def _attempt_join(self, seeds: list[str]) -> bool:
        core = self._core()
        await self._execute(core.join(seeds, self._clock()), wait=True)
        return await self._wait_until(lambda: core.joined, self.config.membership.probe_timeout_s * 4)

    async def leave(self) -> int:
        """Graceful leave: tells the members, waits for delivery, then stops. Returns members told."""
        core = self._core()
        effects = core.leave(self._clock())
        told = sum(1 for e in effects if isinstance(e, m.Send))
        await self._execute(effects, wait=True)
        self.stop()
        return told

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

    # ----- events --------------------------------------------------------------------------
    def deliver(self, msg: m.Message) -> None:
        """A message arrived from the network (called on the event loop by the servicer)."""
        if self._stopped.is_set():
            return
        self._spawn(self._execute(self._core().receive(msg, self._clock())))
        self._wake.set()

    def members(self) -> list[m.MemberView]:
        return self._core().members()

    def now(self) -> float:
        return self._clock()

    def uptime_s(self) -> float:
        return self._clock() - self._started_at

    @property
    def version(self) -> str:
        return __version__

    # ----- internals -----------------------------------------------------------------------
    def _core(self) -> m.Membership:
        if self.core is None:
            raise RuntimeError("node not started")
        return self.core

    async def _timer_loop(self) -> None:
        core = self._core()
        while not self._stopped.is_set():
            self._wake.clear()
            await self._execute(core.tick(self._clock()))
            delay = min(max(core.next_deadline() - self._clock(), 0.0), 1.0)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass

    async def _execute(self, effects: list[m.Effect], wait: bool = False) -> None:
        sends = []
        for effect in effects:
            if isinstance(effect, m.Send):
                sends.append(self._sender.send(effect.to, effect.msg))
            elif isinstance(effect, m.StateChanged):
                old = effect.old.name.lower() if effect.old else "unknown"
                log.info(
                    "member %s: %s -> %s (incarnation %d): %s",
                    effect.site, old, effect.new.name.lower(), effect.incarnation, effect.reason,
                )
        if wait:
            await asyncio.gather(*sends)
        else:
            for coro in sends:
                self._spawn(coro)

    async def _wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        deadline = self._clock() + timeout_s
        while not predicate() and self._clock() < deadline:
            await asyncio.sleep(0.02)
        return predicate()

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

