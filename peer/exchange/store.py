"""What a peer holds and serves in the exchange: encoded objects per (round, site, kind).

The node publishes its own pseudo-gradient here (and, in the reduce-scatter exchange, the mean
shard it owns); the servicer serves from it; manifests announced by other peers are recorded so the
node can start fetching without polling. Objects never change once published: a second publish of
the same key with different content is refused (the commit log names objects by root hash).

    .venv/bin/python -m pytest tests/unit/test_exchange_store.py -q
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from peer.exchange.codec import Encoded, Manifest, ObjectKey, ObjectKind

# A round's contributors as a mean-shard request names them: (site, address, root hash), by site.
MeanInputs = tuple[tuple[str, str, bytes], ...]


def reduced_over(manifest: Manifest, inputs: MeanInputs) -> bool:
    """Whether a mean shard averages exactly these contributors' objects (sites and roots)."""
    return manifest.contributors == tuple(s for s, _, _ in inputs) and manifest.contributor_roots == tuple(
        r for _, _, r in inputs
    )


MAX_ANNOUNCED_PER_SITE = 32
"""Announced manifests held per producing site. An honest site announces a few objects per round and
rounds are dropped once committed; without a bound a site could announce round after future round
(each manifest up to the 8 MB message limit) and nothing would ever drop them."""
MAX_ANNOUNCED = 1024
"""Announced manifests held in all (plaintext peers do not verify who a producer is)."""


class AnnouncementRefused(ValueError):
    """An announcement over the bounds above; the reason says which."""


class ExchangeStore:
    """Objects this peer serves and manifests other peers announced. Single event loop only, but
    for `get`, which the bulk plane's serving threads call too (see there)."""

    def __init__(self) -> None:
        self._objects: dict[ObjectKey, Encoded] = {}
        self._announced: dict[ObjectKey, Manifest] = {}
        # Woken on every publish/announce; waiters re-check their key (few waiters, rare events).
        self._changed = asyncio.Condition()
        self.on_mean_request: Callable[[int, MeanInputs], None] | None = None
        """Called (on the loop; it must not block) when a peer asks for this peer's mean shard of a
        round over contributors it holds no shard for: the node starts reducing that shard."""
        self.sent_bytes: dict[str, int] = {}
        """Chunk bytes this peer's exchange service streamed, by the kind of object (for metrics)."""

    async def publish(self, encoded: Encoded, replace: bool = False) -> None:
        """Makes `encoded` fetchable. ValueError if the key already holds different content, unless
        `replace` (a mean shard reduced again over another set of contributors)."""
        key = encoded.manifest.key
        held = self._objects.get(key)
        if not replace and held is not None and held.manifest.root_hash != encoded.manifest.root_hash:
            raise ValueError(f"{key} is already published with another root hash")
        self._objects[key] = encoded
        async with self._changed:
            self._changed.notify_all()

    async def record_announcement(self, manifest: Manifest) -> None:
        """Holds `manifest` until its round is dropped; AnnouncementRefused over the bounds."""
        key = manifest.key
        if key not in self._announced:
            of_site = sum(1 for k in self._announced if k.site == key.site)
            if of_site >= MAX_ANNOUNCED_PER_SITE:
                raise AnnouncementRefused(f"{key.site} has {of_site} announcements held here, the most one site "
                                          "may have: they are dropped when their rounds commit")
            if len(self._announced) >= MAX_ANNOUNCED:
                raise AnnouncementRefused(f"{len(self._announced)} announcements are held here, the most in all")
        self._announced[key] = manifest
        async with self._changed:
            self._changed.notify_all()

    def get(self, key: ObjectKey) -> Encoded | None:
        """The object held for `key`. Safe from any thread (the bulk server's call it): one dict
        lookup is atomic under the GIL and an Encoded is never changed once published."""
        return self._objects.get(key)

    def superseded_by(self, key: ObjectKey) -> int | None:
        """For a global state: the newer round whose state of the same site this peer serves in its
        place, if any. Only the newest is kept (RoundExchange.publish_state), so an older one will
        never be published here again, and a wait for it is no use."""
        if key.kind is not ObjectKind.GLOBAL_STATE:
            return None
        newer = [k.round for k in self._objects if k.kind is key.kind and k.site == key.site and k.round > key.round]
        return max(newer) if newer else None

    def announced(self, key: ObjectKey) -> Manifest | None:
        return self._announced.get(key)

    async def wait_for(
        self, key: ObjectKey, timeout_s: float, accept: Callable[[Encoded], bool] | None = None
    ) -> Encoded | None:
        """The object for `key` (one that `accept`s, if given), waiting up to `timeout_s` for it to be
        published; None if there is none."""

        def found() -> Encoded | None:
            held = self._objects.get(key)
            return held if held is not None and (accept is None or accept(held)) else None

        await self._wait(lambda: found() is not None, timeout_s)
        return found()

    async def wait_announced(self, key: ObjectKey, timeout_s: float) -> Manifest | None:
        await self._wait(lambda: key in self._announced, timeout_s)
        return self._announced.get(key)

    async def _wait(self, ready: Callable[[], bool], timeout_s: float) -> None:
        if ready():  # asyncio.wait_for(..., 0) would time out without looking
            return
        async with self._changed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)

    def drop(self, key: ObjectKey) -> None:
        """Forgets one object (e.g. a global state superseded by a newer one)."""
        self._objects.pop(key, None)
        self._announced.pop(key, None)

    def drop_states_before(self, site: str, round_: int) -> None:
        """Forgets `site`'s global states of rounds < round_: a peer serves its newest state only (a
        state transfer that skipped rounds leaves its start-up state far behind)."""
        for key in [k for k in self._objects if k.kind is ObjectKind.GLOBAL_STATE and k.site == site
                    and k.round < round_]:
            self.drop(key)

    def drop_rounds_before(self, round_: int) -> int:
        """Forgets objects and announcements of rounds < round_ (after a commit); returns how many."""
        stale = [k for k in (*self._objects, *self._announced) if k.round < round_]
        for k in stale:
            self._objects.pop(k, None)
            self._announced.pop(k, None)
        return len(stale)
