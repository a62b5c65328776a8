"""Waiting on a node's state without polling: whatever may change it (a message handled, a timer,
a send finishing) wakes every waiter, which re-checks its condition."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Changes:
    """The waiters of one event loop's state; `notify` after anything that may have changed it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._waiters: set[asyncio.Future[None]] = set()

    def notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Re-checks `predicate` at every `notify` until it holds (True) or `timeout_s` passed (False)."""
        deadline = self._clock() + timeout_s
        while not predicate():
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            changed = asyncio.get_running_loop().create_future()
            self._waiters.add(changed)
            try:
                await asyncio.wait_for(changed, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiters.discard(changed)
        return True
