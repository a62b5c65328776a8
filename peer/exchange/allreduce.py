"""The token-weighted mean of all contributors' pseudo-gradients, computed by every peer from pulls.

Two schemes over the same transfer service (see docs/decisions/exchange-mean-schemes.md):

* `all_to_all_mean`: every peer pulls every contributor's whole pseudo-gradient and averages it
  itself. Each peer sends (N-1) x the model per round; the mean is exact fp32 arithmetic on the
  verified wire values, and trusts nobody's arithmetic.
* `reduce_scatter_mean`: the layout is cut into N chunk-aligned shards, one per contributor. Each
  peer pulls its shard of every pseudo-gradient, averages it, encodes the mean shard in the wire
  dtype and publishes it (OBJECT_KIND_MEAN_SHARD); then it pulls the other shards' means from their
  owners. Each peer sends 2(N-1)/N x the model, as ring all-reduce does; the mean is rounded once to
  the wire dtype (everybody decodes the same bytes, so all peers still agree bit for bit).

In both, chunk i is summed over sites in sorted site order with separate multiply and add kernels
(never a fused multiply-add, whose rounding differs between CPUs), so every peer computes the same
bits (invariant I7). The reduction runs in the streams' own threads, one chunk per remote site in
hand (Reducer): beyond the destination tensors and the peer's own encoded object it holds one
chunk per stream, and a stream that runs ahead waits (its socket buffers, then TCP or gRPC flow
control, pause its sender).

    .venv/bin/python -m pytest tests/integration/test_exchange_allreduce.py -q
    scripts/bench_exchange --sizes-mb 64
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from peer.exchange import codec, decoding, finite, kernels
from peer.exchange.buffers import ExchangeMemory
from peer.exchange.client import (
    ExchangeClient,
    FetchPolicy,
    fetch_chunks,
    fetch_manifest,
    into_destination,
)
from peer.exchange.sources import FetchError, FetchStats, InThread
from peer.exchange.store import ExchangeStore, MeanInputs

log = logging.getLogger("sitemesh.exchange")

# Elements of a chunk reduced at a time: 64 Ki fp32 (256 KiB) keeps the sum and one site's term in
# cache through every site's pass; a whole 1 MiB chunk at once was 26 % slower (exchange-buffer-reuse.md).
REDUCE_BLOCK = 1 << 16

# A contributor is fetched through its client, or held in the local store (None: our own).
Sites = Mapping[str, ExchangeClient | None]
# Receives the fp32 mean of layout chunk i (a scratch buffer: copy it out before returning).
Emit = Callable[[int, torch.Tensor], None]


@dataclass(frozen=True)
class WireSink:
    """Where a reduction puts each chunk's mean rounded to the wire dtype, as an owner publishes its
    mean shard (rounding there is part of the reduction: for bf16, one compiled pass, kernels.py)."""

    into: Callable[[int], torch.Tensor]
    """The uint8 buffer chunk `index`'s wire bytes go into (wire_bytes of its elements)."""
    done: Callable[[int, torch.Tensor, bytes, int], None]
    """Called with (index, that buffer, its blake3, its fp16 scale exponent) once it holds the mean."""


@dataclass
class MeanReport:
    """What an exchange did: the weights it used and the faults it survived, per remote site."""

    round: int
    sites: tuple[str, ...]
    tokens: dict[str, int]
    stats: dict[str, FetchStats] = field(default_factory=dict)
    phase_done: dict[str, float] = field(default_factory=dict)
    """time.monotonic() at the end of each phase ("manifests", "reduce", "gather"), for profiling."""
    reduced_here: list[str] = field(default_factory=list)
    """Reduce-scatter: owners whose mean shard this peer reduced itself (they did not serve it)."""

    @property
    def bytes_received(self) -> int:
        return sum(s.bytes for s in self.stats.values())


async def publish_pseudo_gradient(
    store: ExchangeStore,
    tensors: Mapping[str, torch.Tensor],
    *,
    round: int,
    site: str,
    tokens: int,
    wire: codec.WireDtype = codec.WireDtype.BF16,
    chunk_size: int = codec.DEFAULT_CHUNK_BYTES,
    out: torch.Tensor | None = None,
    param_dtypes: Mapping[str, torch.dtype] | None = None,
    keep: int = 0,
) -> codec.Encoded:
    """Encodes (in a worker thread: the event loop keeps serving heartbeats) and publishes.
    `out`, `param_dtypes`, `keep`: see codec.encode; `out` must not be reused while this round may
    still be fetched."""
    encoded = await asyncio.to_thread(
        codec.encode, tensors, round=round, site=site, tokens=tokens, wire=wire, chunk_size=chunk_size, out=out,
        param_dtypes=param_dtypes, keep=keep,
    )
    await store.publish(encoded)
    return encoded


class ReductionStopped(RuntimeError):
    """The reduction was stopped (it failed in another stream's thread, another contributor's fetch
    failed, or the exchange was cancelled): a stream waiting to hand over its chunk ends with this
    instead of waiting for ever. Not retried."""


class Reducer:
    """Sums chunks [first, end) over all sites in sorted order, in the threads that receive them.

    Each remote site's stream hands over its chunks in order (`put`, a blocking call) and waits
    until that chunk is reduced; the stream whose chunk completes the set reduces it right there.
    So the remote streams move in lockstep, one chunk each in hand (what the kernel's socket buffers
    and gRPC's flow-control windows hold keeps their senders going meanwhile), exactly one chunk is
    reduced at a time, and no chunk is handed to the event loop or another thread: the hand-offs of
    each chunk (a receiving thread to the loop, the loop to a worker and back) cost more CPU than
    they saved on this 2-core machine (docs/decisions/exchange-reduce-in-receiving-threads.md)."""

    def __init__(
        self,
        manifests: Mapping[str, codec.Manifest],
        local: Mapping[str, codec.Encoded],
        first: int,
        end: int,
        emit: Emit | WireSink,
    ) -> None:
        """`emit`: an Emit receives each chunk's fp32 mean; a WireSink its mean in the wire dtype."""
        total = sum(m.tokens for m in manifests.values())
        if total <= 0:
            raise ValueError("contributors trained zero tokens: there is no mean")
        self._order = sorted(manifests)
        self._manifests, self._local = manifests, local
        self._weights = {s: m.tokens / total for s, m in manifests.items()}
        self._remote = len(manifests) - len(local)
        self._next, self._end, self._emit = first, end, emit
        self._held: dict[str, memoryview] = {}  # the remote sites' chunk `_next`, as handed over
        self._stopped = self._reducing = False
        self.failure: BaseException | None = None
        """What a reduction raised, in whichever stream's thread it ran (the others raise ReductionStopped)."""
        self._changed = threading.Condition()
        any_manifest = next(iter(manifests.values()))
        self._wire = any_manifest.layout.wire
        self._keep = any_manifest.layout.keep
        elements = any_manifest.chunk_size // any_manifest.layout.wire.itemsize
        # Scratch buffers, reused: one chunk is reduced at a time.
        self._acc, self._term = torch.empty(elements), torch.empty(min(elements, REDUCE_BLOCK))

    def put(self, site: str, index: int, data: memoryview) -> None:
        """Hands over `site`'s verified chunk `index` (the next one due: streams deliver in order) and
        returns once it is reduced; `data` is read until then, never after. Raises what the
        reduction raised, or ReductionStopped once `stop` was called."""
        with self._changed:
            if self._stopped:
                raise ReductionStopped("the reduction was stopped")
            if index != self._next or site in self._held:  # a stream's order, or this class, is broken
                raise RuntimeError(f"{site} handed over chunk {index} while chunk {self._next} is reduced")
            self._held[site] = data
            if len(self._held) < self._remote:
                # Stopped, a stream still leaves only once no reduction reads its chunk any more.
                self._changed.wait_for(lambda: self._next > index or (self._stopped and not self._reducing))
                if self._next > index:
                    return
                raise ReductionStopped("the reduction was stopped")
            held, self._held, self._reducing = self._held, {}, True
        reduced = False
        try:
            self._reduce(index, held)  # torch and blake3 release the GIL: other streams go on
            reduced = True
        except BaseException as err:
            self.failure = err
            raise
        finally:
            with self._changed:
                self._reducing = False
                if reduced:
                    self._next = index + 1
                else:
                    self._stopped = True
                self._changed.notify_all()

    def stop(self) -> None:
        """Wakes every stream waiting in `put` (they raise ReductionStopped); for a failed exchange."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def reduce_local(self) -> None:
        """Every chunk, when all contributors are local (no stream hands anything over)."""
        assert self._remote == 0
        for index in range(self._next, self._end):
            self._reduce(index, {})
        self._next = self._end

    def _chunk(self, site: str, index: int, held: Mapping[str, memoryview]) -> torch.Tensor | memoryview:
        """`site`'s chunk `index`: from the local store, or as its stream handed it over."""
        return self._local[site].chunk(index) if site in self._local else held[site]

    def _refused(self, site: str, index: int, err: codec.BadEncoding) -> codec.BadEncoding:
        """`err` (a chunk of `site` that breaks its format) said with the round, chunk and sender."""
        return type(err)(f"round {self._manifests[site].key.round}, chunk {index}: {err} in "
                         f"{site}'s pseudo-gradient; it is refused")

    def _values(self, site: str, index: int, held: Mapping[str, memoryview]) -> tuple[torch.Tensor, float]:
        m = self._manifests[site]
        return decoding.chunk_values(self._chunk(site, index, held), m.layout.wire, m.scale_exps[index],
                                  m.chunk_elements(index), m.layout.keep)

    def _reduce(self, index: int, held: Mapping[str, memoryview]) -> None:
        sink = self._emit
        if isinstance(sink, WireSink) and self._wire is codec.WireDtype.BF16:
            self._reduce_bf16(index, held, sink)
            return
        if self._wire is codec.WireDtype.SPARSE and not isinstance(sink, WireSink):
            self._reduce_sparse(index, held, sink)
            return
        n = self._manifests[self._order[0]].chunk_elements(index)
        terms: list[tuple[torch.Tensor, float]] = []  # (values, weight x fp16 scale) per site, in order
        for site in self._order:
            try:
                values, multiplier = self._values(site, index, held)
            except codec.BadEncoding as err:
                raise self._refused(site, index, err) from None
            # Weight and fp16 scale in one multiply: w * 2^-e is exact, so this equals scaling then
            # weighting.
            terms.append((values, self._weights[site] * multiplier))
        acc = self._acc[:n]
        weighted_sum(terms, acc, self._term)
        if not finite.is_finite(acc):  # one check of the sum; look for the culprit only if it fails
            self._refuse(index, held)
        if isinstance(sink, WireSink):
            out = sink.into(index)
            sink.done(index, out, *codec.encode_chunk([acc], out, self._wire, known_finite=True))
        else:
            sink(index, acc)

    def _reduce_bf16(self, index: int, held: Mapping[str, memoryview], sink: WireSink) -> None:
        """The bf16 wire's reduction and rounding in one compiled pass over the chunks' bytes as they
        lie (kernels.py: no tensor per chunk); the same bits as the torch path above."""
        data = [self._chunk(s, index, held) for s in self._order]
        factors = [self._weights[s] * 2.0 ** -self._manifests[s].scale_exps[index] for s in self._order]
        out = sink.into(index)
        if not kernels.bf16_weighted_sum(data, factors, out):
            self._refuse(index, held)
        sink.done(index, out, codec.chunk_hash(codec.as_memoryview(out)), 0)

    def _reduce_sparse(self, index: int, held: Mapping[str, memoryview], emit: Emit) -> None:
        """Sparse chunks: the sum starts at zero and each site, in sorted order, adds its entries
        times its weight (multiply, then add, as weighted_sum does). A dense chunk of zeros per site
        cost 0.6 s of fresh memory per 128 M elements on this machine; this touches only what was sent."""
        n = self._manifests[self._order[0]].chunk_elements(index)
        acc = self._acc[:n]
        acc.zero_()
        for site in self._order:
            try:
                where, values = decoding.sparse_entries(self._chunk(site, index, held), n, self._keep)
            except codec.BadEncoding as err:
                raise self._refused(site, index, err) from None
            # Indices strictly increasing (checked): the gather, add and put touch each element once.
            acc[where] += values.mul_(self._weights[site])
        if not finite.is_finite(acc):
            self._refuse(index, held)
        emit(index, acc)

    def _refuse(self, index: int, held: Mapping[str, memoryview]) -> None:
        """Raises for chunk `index`, whose mean is not finite: names the sites that sent NaN or Inf."""
        bad = [s for s in self._order if not finite.is_finite(self._values(s, index, held)[0])]
        what = f"NaN or Inf from {bad}; their pseudo-gradients are refused" if bad else "the sum overflows"
        raise codec.NonFiniteError(f"round {self._manifests[self._order[0]].key.round}, chunk {index}: {what}")


def weighted_sum(terms: Sequence[tuple[torch.Tensor, float]], acc: torch.Tensor, scratch: torch.Tensor) -> None:
    """acc (fp32) = sum of values x factor over `terms` (values of acc's length, any float dtype), in
    their order. `scratch`: fp32 of at least min(len(acc), REDUCE_BLOCK) elements.

    Block by block: a block's sum and term stay in cache through all the terms' passes. Each term is
    multiplied, then added: two roundings (never an FMA), the same on every CPU (invariant I7)."""
    n = acc.numel()
    for a in range(0, n, REDUCE_BLOCK):
        b = min(n, a + REDUCE_BLOCK)
        block, term = acc[a:b], scratch[: b - a]
        for k, (values, factor) in enumerate(terms):
            target = term if k else block
            target.copy_(values[a:b])
            target.mul_(factor)
            if k:
                block.add_(term)


async def _manifests(
    round_: int, kind: codec.ObjectKind, sites: Sites, store: ExchangeStore, wait_s: float, policy: FetchPolicy,
    roots: Mapping[str, bytes] | None = None, known: Mapping[str, codec.Manifest] | None = None,
) -> dict[str, codec.Manifest]:
    """Every site's manifest; LayoutMismatch unless all share one layout and chunk size, ManifestError
    unless each has the root hash `roots` names for it (when given). `known`: every site's manifest
    as the caller fetched it already (checking the roots the round names), not fetched again."""
    async def one(site: str, client: ExchangeClient | None) -> codec.Manifest:
        key = codec.ObjectKey(round_, site, kind)
        if client is None:
            held = await store.wait_for(key, wait_s)
            if held is None:
                raise codec.ManifestError(f"{key} is not published locally")
            return held.manifest
        return await fetch_manifest(key, [client], wait_s, policy)

    if known is not None and known.keys() == sites.keys():
        manifests = dict(known)
    else:
        manifests = dict(zip(sites, await asyncio.gather(*(one(s, c) for s, c in sites.items()))))
    reference = min(manifests.items())  # any fixed one: all must agree with it
    for site, m in manifests.items():
        if (m.layout, m.chunk_size) != (reference[1].layout, reference[1].chunk_size):
            raise codec.LayoutMismatch(f"round {round_}: {site}'s layout or chunk size differs from {reference[0]}'s")
        if roots is not None and m.root_hash != roots[site]:
            raise codec.ManifestError(f"{m.key} has root {m.root_hash.hex()[:16]}, the round names "
                                      f"{roots[site].hex()[:16]}")
    return manifests


def _not_sparse(layout: codec.Layout) -> None:
    """Sparse contributions are all-gathered (all_to_all_mean): their mean is dense, and rounding it
    back to sparse at a shard owner would drop what no error feedback keeps."""
    if layout.wire is codec.WireDtype.SPARSE:
        raise codec.LayoutMismatch("sparse pseudo-gradients are all-gathered (all_to_all_mean), not reduce-scattered")


async def _all(tasks: Sequence[Awaitable[object]], stop: Callable[[], None] | None = None) -> None:
    """Runs coroutines together; the first failure cancels the rest and is raised. `stop` is called
    before waiting for the cancelled ones: it wakes their threads where those wait on each other."""
    futures = [asyncio.ensure_future(t) for t in tasks]
    try:
        await asyncio.gather(*futures)
    except BaseException:
        for f in futures:
            f.cancel()
        if stop is not None:
            stop()
        await asyncio.gather(*futures, return_exceptions=True)
        raise


async def _reduce_range(
    manifests: Mapping[str, codec.Manifest],
    sites: Sites,
    store: ExchangeStore,
    first: int,
    end: int,
    emit: Emit | WireSink,
    report: MeanReport,
    policy: FetchPolicy,
    memory: ExchangeMemory | None = None,
) -> None:
    local = {}
    for site, m in manifests.items():
        if sites[site] is None:
            encoded = store.get(m.key)
            if encoded is None:  # _manifests saw it: only a concurrent drop_rounds_before gets here
                raise codec.ManifestError(f"{m.key} was dropped from the local store during the exchange")
            local[site] = encoded
    reducer = Reducer(manifests, local, first, end, emit)
    if len(local) == len(manifests):
        await asyncio.to_thread(reducer.reduce_local)
        return
    # Each stream receives into one buffer of its own, from the peer's pool when it has one.
    ref = next(iter(manifests.values()))
    buffers = memory.chunks(ref.layout.wire_bytes(ref.chunk_size)) if memory is not None else None

    def fetch(site: str, client: ExchangeClient) -> Awaitable[FetchStats]:
        def put(index: int, data: memoryview) -> None:
            reducer.put(site, index, data)

        stats = report.stats.setdefault(site, FetchStats())
        return fetch_chunks(manifests[site], [client], InThread(put), first=first, end=end, policy=policy,
                            stats=stats, buffers=buffers)

    try:
        await _all([fetch(s, c) for s, c in sites.items() if c is not None], stop=reducer.stop)
    except ReductionStopped:
        # A stream woken by a failed reduction can finish before the one that ran it: raise the cause.
        if reducer.failure is not None:
            raise reducer.failure from None
        raise


async def all_to_all_mean(
    round_: int,
    sites: Sites,
    store: ExchangeStore,
    dest: Mapping[str, torch.Tensor],
    *,
    policy: FetchPolicy = FetchPolicy(),
    manifest_wait_s: float = 600.0,
    roots: Mapping[str, bytes] | None = None,
    manifests: Mapping[str, codec.Manifest] | None = None,
) -> MeanReport:
    """Writes the token-weighted mean of the pseudo-gradients of `sites` for `round_` into `dest`.

    `sites` maps every contributor to its client, or to None for one published in `store` (our own).
    `roots`: the root hash each contributor's object must have (else ManifestError). `manifests`:
    every contributor's, fetched by the caller already (else fetched here).
    `dest` is only meaningful when this returns.
    """
    manifests = await _manifests(round_, codec.ObjectKind.PSEUDO_GRADIENT, sites, store, manifest_wait_s, policy,
                                 roots, manifests)
    any_manifest = next(iter(manifests.values()))
    layout = any_manifest.layout
    decoding.check_destination(layout, dest, wire_dtype=False)  # the fp32 mean goes into it: not the wire's values
    report = MeanReport(round_, tuple(sorted(sites)), {s: m.tokens for s, m in manifests.items()})
    report.phase_done["manifests"] = time.monotonic()

    def emit(index: int, mean: torch.Tensor) -> None:
        decoding.scatter_values(layout, any_manifest.chunk_bounds(index)[0], mean, dest)

    await _reduce_range(manifests, sites, store, 0, any_manifest.num_chunks, emit, report, policy)
    report.phase_done["reduce"] = time.monotonic()
    return report


def shard_chunks(num_chunks: int, owners: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Chunk range [first, end) of the layout that each owner (sorted) reduces; sizes differ by <= 1."""
    ordered = sorted(owners)
    n = len(ordered)
    return {s: (k * num_chunks // n, (k + 1) * num_chunks // n) for k, s in enumerate(ordered)}


def _shard_bytes(ref: codec.Manifest, first: int, end: int) -> tuple[int, int]:
    return first * ref.chunk_size, min(end * ref.chunk_size, ref.layout.total_bytes)


async def reduce_shard(
    round_: int,
    me: str,
    sites: Sites,
    store: ExchangeStore,
    *,
    roots: Mapping[str, bytes] | None = None,
    policy: FetchPolicy = FetchPolicy(),
    manifest_wait_s: float = 600.0,
    report: MeanReport | None = None,
    fetched: dict[str, FetchStats] | None = None,
    memory: ExchangeMemory | None = None,
) -> codec.Encoded:
    """Phase 1 of reduce-scatter: `me`'s shard of every contributor's pseudo-gradient, averaged,
    encoded in the wire dtype and published as `me`'s MEAN_SHARD (replacing one reduced over other
    contributors). `roots`: the root hash each contributor's object must have (else ManifestError).
    `report`, if given, counts the fetches; so does `fetched` (per site, added to), for a caller that
    reduces the shard apart from any mean (a peer's request) and still books what it pulled.
    `memory`: this peer's, reused round after round for receiving and for the encoded mean shard
    (else fresh memory each time)."""
    if me not in sites or sites[me] is not None:
        raise ValueError(f"{me} must be a contributor published in the local store (mapped to None)")
    manifests = await _manifests(round_, codec.ObjectKind.PSEUDO_GRADIENT, sites, store, manifest_wait_s, policy,
                                 roots)
    order = tuple(sorted(sites))
    ref = manifests[me]
    _not_sparse(ref.layout)
    first, end = shard_chunks(ref.num_chunks, order)[me]
    start_byte, end_byte = _shard_bytes(ref, first, end)
    wire = ref.layout.wire
    chunk_wire = ref.layout.wire_bytes(ref.chunk_size)
    last = ref.layout.wire_bytes(end_byte - (end - 1) * ref.chunk_size) if end > first else 0
    nbytes = max(0, end - first - 1) * chunk_wire + last
    buffer = memory.shards.take(nbytes) if memory is not None else torch.empty(nbytes, dtype=torch.uint8)
    mean_data = buffer[:nbytes]
    hashes: list[bytes] = [b""] * (end - first)
    exps = [0] * (end - first)

    def into(index: int) -> torch.Tensor:
        # The mean shard's own chunk k is layout chunk first + k: its wire bytes start at k * chunk_wire.
        a = (index - first) * chunk_wire
        return mean_data[a : a + ref.layout.wire_bytes(ref.chunk_elements(index) * wire.itemsize)]

    def done(index: int, out: torch.Tensor, digest: bytes, exp: int) -> None:
        hashes[index - first], exps[index - first] = digest, exp

    report = report or MeanReport(round_, order, {s: m.tokens for s, m in manifests.items()})
    await _reduce_range(manifests, sites, store, first, end, WireSink(into, done), report, policy, memory)
    if fetched is not None:
        for site, stats in report.stats.items():
            fetched.setdefault(site, FetchStats()).add(stats)
    mine = codec.Encoded(
        codec.build_manifest(
            codec.ObjectKey(round_, me, codec.ObjectKind.MEAN_SHARD), ref.layout, start_byte, end_byte,
            ref.chunk_size, hashes, exps, sum(report.tokens.values()), order,
            [manifests[s].root_hash for s in order],
        ),
        mean_data,
    )  # fmt: skip
    if memory is not None:
        memory.shards.lend(buffer, mine)
    await store.publish(mine, replace=True)
    return mine


async def reduce_scatter_mean(
    round_: int,
    me: str,
    sites: Sites,
    store: ExchangeStore,
    dest: Mapping[str, torch.Tensor],
    *,
    inputs: MeanInputs = (),
    my_shard: Callable[[], Awaitable[codec.Encoded]] | None = None,
    policy: FetchPolicy = FetchPolicy(),
    manifest_wait_s: float = 600.0,
    owner_wait_s: float | None = None,
    memory: ExchangeMemory | None = None,
    manifests: Mapping[str, codec.Manifest] | None = None,
) -> MeanReport:
    """Like all_to_all_mean, but each contributor reduces one shard and serves it; every peer pulls
    the mean shards (its own, if `me` contributes, comes from reduce_shard or `my_shard`).

    The mean is rounded to the wire dtype once (by the shard owner); every peer decodes the same
    bytes. `inputs` (the contributors as (site, address, root)) go with every mean-shard request, so
    an owner that does not know the round's contributors yet starts reducing (see ManifestRequest).
    Where an owner does not serve its shard (gone, or it failed), this peer reduces that shard
    itself from every pseudo-gradient (all-to-all for that shard), rounds it the same way and logs
    so: the bits are the owner's, whichever way they were made. `owner_wait_s` (default
    `manifest_wait_s`) bounds the wait for an owner's shard before reducing it here. `memory`:
    this peer's, reused round after round (see reduce_shard). `manifests`: every contributor's,
    fetched by the caller already (else fetched here).
    """
    if me in sites and sites[me] is not None:
        raise ValueError(f"{me} must be mapped to None: its objects are in the local store")
    manifests = await _manifests(round_, codec.ObjectKind.PSEUDO_GRADIENT, sites, store, manifest_wait_s, policy,
                                 known=manifests)
    order = tuple(sorted(sites))
    ref = manifests[order[0]]
    layout, wire = ref.layout, ref.layout.wire
    _not_sparse(layout)
    decoding.check_destination(layout, dest)
    report = MeanReport(round_, order, {s: m.tokens for s, m in manifests.items()})
    report.phase_done["manifests"] = time.monotonic()
    shards = shard_chunks(ref.num_chunks, order)
    total_tokens = sum(report.tokens.values())
    roots = tuple(manifests[s].root_hash for s in order)
    my_inputs = inputs or tuple((s, "", r) for s, r in zip(order, roots, strict=True))

    def expected(owner: str) -> tuple[object, ...]:
        return (layout, *_shard_bytes(ref, *shards[owner]), order, roots, total_tokens)

    async def reduce_here(owner: str) -> None:
        scratch = torch.empty(ref.layout.wire_bytes(ref.chunk_size), dtype=torch.uint8)

        def into(index: int) -> torch.Tensor:
            return scratch[: ref.layout.wire_bytes(ref.chunk_elements(index) * wire.itemsize)]

        def done(index: int, out: torch.Tensor, digest: bytes, exp: int) -> None:
            # Exactly what the owner does (round to the wire) and then every receiver (decode).
            values, multiplier = decoding.chunk_values(out, wire, exp, ref.chunk_elements(index))
            decoding.scatter_values(layout, ref.chunk_bounds(index)[0], values, dest, multiplier)

        await _reduce_range(manifests, sites, store, *shards[owner], WireSink(into, done), report, policy, memory)

    async def gather(owner: str, client: ExchangeClient | None) -> None:
        if client is None:
            reduced = await (my_shard() if my_shard is not None else reduce_shard(
                round_, me, sites, store, policy=policy, manifest_wait_s=manifest_wait_s, report=report,
                memory=memory))
            if (reduced.manifest.layout, reduced.manifest.range_start, reduced.manifest.range_end,
                    reduced.manifest.contributors, reduced.manifest.contributor_roots,
                    reduced.manifest.tokens) != expected(owner):  # fmt: skip
                raise codec.LayoutMismatch(f"{reduced.manifest.key}: my own shard is not this round's")
            report.phase_done["reduce"] = time.monotonic()
            # Reduced and encoded by this process (reduce_shard): decoded without a second hash.
            await asyncio.to_thread(decoding.decode, reduced, dest, made_here=True)
            return
        key = codec.ObjectKey(round_, owner, codec.ObjectKind.MEAN_SHARD)
        stats = report.stats.setdefault(owner, FetchStats())
        try:
            wait_s = manifest_wait_s if owner_wait_s is None else owner_wait_s
            m = await fetch_manifest(key, [client], wait_s, policy, my_inputs)
            log.debug("round %d: %s's mean shard announced", round_, owner)
            got = (m.layout, m.range_start, m.range_end, m.contributors, m.contributor_roots, m.tokens)
            if got != expected(owner):
                raise codec.LayoutMismatch(f"{key}: its shard, contributors or tokens differ from this peer's view")

            await fetch_chunks(m, [client], into_destination(m, dest), policy=policy, stats=stats)
        except (FetchError, codec.ManifestError, codec.LayoutMismatch) as err:
            log.warning("round %d: shard owner %s does not serve its mean shard (%s); reducing that shard "
                        "here from every pseudo-gradient (all-to-all for this shard)", round_, owner, err)
            report.reduced_here.append(owner)
            await reduce_here(owner)

    await _all([gather(s, c) for s, c in sites.items()])
    report.phase_done["gather"] = time.monotonic()
    return report
