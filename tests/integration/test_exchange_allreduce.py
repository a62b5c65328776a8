"""Three peers on loopback compute the token-weighted mean with both schemes, with and without faults.

The expected mean is computed here independently (whole tensors, sorted site order, multiply then
add); every peer must hold exactly it (all-to-all) or exactly its rounding to the wire dtype
(reduce-scatter), bit-identical across peers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import torch

from peer.exchange import codec
from peer.exchange.buffers import ExchangeMemory
from peer.exchange.bulk import BulkServer
from peer.exchange.allreduce import (
    REDUCE_BLOCK,
    MeanReport,
    all_to_all_mean,
    reduce_scatter_mean,
    reduce_shard,
    shard_chunks,
)
from peer.exchange.client import ExchangeClient, FetchPolicy
from peer.exchange.sources import FetchError, FetchStats
from peer.exchange.store import ExchangeStore
from tests.support.exchange import decoded, random_model, rehashed, serving, serving_bulk
from tests.support.faultproxy import Fault, FaultProxy

SIZES = {"emb": (64, 500), "layer.0.w": (123, 11), "layer.0.b": (7,), "norm": (1,)}  # ~68 kB in bf16
TOKENS = {"alpha": 100, "bravo": 300, "charlie": 600}
CHUNK = 4096
ROUND = 5
Scheme = Callable[..., Awaitable[MeanReport]]


def _expected(encoded: dict[str, codec.Encoded]) -> dict[str, torch.Tensor]:
    total = sum(e.manifest.tokens for e in encoded.values())
    acc: dict[str, torch.Tensor] = {}
    for site in sorted(encoded):
        w = encoded[site].manifest.tokens / total
        for name, t in decoded(encoded[site]).items():
            t.mul_(w)
            acc[name] = t if name not in acc else acc[name].add_(t)
    return acc


def _encode(
    models: dict[str, dict[str, torch.Tensor]], wire: codec.WireDtype = codec.WireDtype.BF16, chunk: int = CHUNK
) -> dict[str, codec.Encoded]:
    return {s: codec.encode(m, round=ROUND, site=s, tokens=TOKENS[s], chunk_size=chunk, wire=wire)
            for s, m in models.items()}


async def _mesh(
    scheme: Scheme, faults: dict[tuple[str, str], list[Fault]], encoded: dict[str, codec.Encoded],
    plane: str = "bulk",
    dest_dtype: torch.dtype = torch.float32,
    known: bool = False,
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, MeanReport]]:
    """Runs `scheme` on every peer at once; faults[(receiver, sender)] go on that one path (its
    gRPC connection for plane "grpc", its bulk connections for "bulk"). `dest_dtype`: of every
    peer's mean (the node's is the wire dtype, received in place). `known`: every peer is handed
    the contributors' manifests, as a node that checked their roots is."""
    models = encoded
    stores = {s: ExchangeStore() for s in models}
    async with contextlib.AsyncExitStack() as stack:
        served = {s: await stack.enter_async_context(serving_bulk(stores[s], bulk=BulkServer(stores[s])))
                  for s in models}
        clients: dict[str, dict[str, ExchangeClient | None]] = {}
        for me in models:
            clients[me] = {me: None}
            for other in models:
                if other == me:
                    continue
                address, bulk = served[other]
                assert bulk is not None
                proxied = None
                if (me, other) in faults:
                    host, port = address.rsplit(":", 1)
                    proxy = FaultProxy((host, bulk.port if plane == "bulk" else int(port)), faults[(me, other)])
                    proxied = (await stack.enter_async_context(proxy)).address
                if plane == "bulk":
                    client = ExchangeClient(address, plane="bulk", bulk_address=proxied)
                else:
                    client = ExchangeClient(proxied or address, plane="grpc")
                stack.push_async_callback(client.close)
                clients[me][other] = client
        dests = {s: {e.name: torch.full(e.shape, float("nan"), dtype=dest_dtype)
                     for e in encoded[s].manifest.layout.tensors} for s in models}

        async def peer(me: str) -> MeanReport:
            await stores[me].publish(encoded[me])
            kwargs: dict[str, Any] = {"policy": FetchPolicy.local_test(), "manifest_wait_s": 10.0}
            if known:
                kwargs["manifests"] = {s: e.manifest for s, e in encoded.items()}
            if scheme is reduce_scatter_mean:
                kwargs["me"] = me
            return await scheme(ROUND, sites=clients[me], store=stores[me], dest=dests[me], **kwargs)

        reports = await asyncio.wait_for(asyncio.gather(*(peer(s) for s in models)), 30)
    return dests, dict(zip(models, reports))


def _models(seed: int = 0, sizes: dict[str, tuple[int, ...]] = SIZES) -> dict[str, dict[str, torch.Tensor]]:
    return {s: random_model(seed + i, sizes) for i, s in enumerate(TOKENS)}


def _check(scheme: Scheme, dests: dict[str, dict[str, torch.Tensor]], encoded: dict[str, codec.Encoded]) -> None:
    want = _expected(encoded)
    if scheme is reduce_scatter_mean:  # the shard owner rounds the mean to the wire dtype once
        m = next(iter(encoded.values())).manifest
        want = decoded(codec.encode(want, round=ROUND, site="x", tokens=1, chunk_size=m.chunk_size, wire=m.layout.wire))
    for site, dest in dests.items():
        for name in want:
            assert torch.equal(dest[name].float(), want[name]), (site, name)


@pytest.mark.parametrize("wire", list(codec.WireDtype))
@pytest.mark.parametrize("scheme", [all_to_all_mean, reduce_scatter_mean])
def test_every_peer_holds_the_same_token_weighted_mean(scheme: Scheme, wire: codec.WireDtype) -> None:
    encoded = _encode(_models(), wire)
    if scheme is reduce_scatter_mean and wire is codec.WireDtype.SPARSE:
        # A shard owner would round the dense mean back to sparse, dropping what no feedback keeps.
        with pytest.raises(codec.LayoutMismatch, match="sparse pseudo-gradients are all-gathered"):
            asyncio.run(_mesh(scheme, {}, encoded))
        return
    dests, reports = asyncio.run(_mesh(scheme, {}, encoded))
    _check(scheme, dests, encoded)
    model_bytes = encoded["alpha"].manifest.wire_nbytes
    received = {s: r.bytes_received for s, r in reports.items()}
    if scheme is all_to_all_mean:
        assert all(b == 2 * model_bytes for b in received.values())
    else:  # each peer receives 2(N-1)/N of the model: two shards of each other peer, in two phases
        assert sum(received.values()) == 2 * 2 * model_bytes
    assert all(r.tokens == TOKENS for r in reports.values())


@pytest.mark.parametrize("wire", [codec.WireDtype.BF16, codec.WireDtype.FP16, codec.WireDtype.INT4])
@pytest.mark.parametrize("scheme", [all_to_all_mean, reduce_scatter_mean])
def test_chunks_reduced_in_several_blocks_give_the_exact_mean(scheme: Scheme, wire: codec.WireDtype) -> None:
    """Chunks of 2.5 reduction blocks: the block loop, its partial last block and the chunk's partial
    last chunk all meet the element-by-element reference, bit for bit."""
    chunk = int(2.5 * REDUCE_BLOCK) * wire.itemsize  # layout bytes of 2.5 blocks' elements
    sizes = {"emb": (700, 500), "norm": (1000,)}  # 351,000 elements: ~2.1 chunks
    encoded = _encode(_models(3, sizes), wire, chunk)
    assert max(e.manifest.chunk_elements(0) for e in encoded.values()) > 2 * REDUCE_BLOCK
    dests, _ = asyncio.run(_mesh(scheme, {}, encoded))
    _check(scheme, dests, encoded)


@pytest.mark.parametrize("plane", ["grpc", "bulk"])
@pytest.mark.parametrize("scheme", [all_to_all_mean, reduce_scatter_mean])
def test_mean_is_exact_despite_drops_flips_and_stalls(scheme: Scheme, plane: str) -> None:
    faults = {
        ("alpha", "bravo"): [Fault(drop_after=20_000)],
        # A bulk connection carries one stream (~23 kB for a reduce-scatter shard), gRPC's all of a path's.
        ("bravo", "charlie"): [Fault(flip_at=30_000 if plane == "grpc" else 10_000)],
        ("charlie", "alpha"): [Fault(stall_after=15_000, stall_s=3.0)],
    }
    encoded = _encode(_models(seed=10))
    dests, reports = asyncio.run(_mesh(scheme, faults, encoded, plane))
    _check(scheme, dests, encoded)
    faults_seen = {
        s: sum(st.transport_errors + st.corrupt_chunks + st.stalls + st.truncated_streams + st.misplaced_chunks
               for st in r.stats.values())
        for s, r in reports.items()
    }
    assert all(faults_seen[receiver] >= 1 for receiver, _ in faults), faults_seen


def test_many_streams_over_grpc_do_not_wait_in_the_shared_executor() -> None:
    """The reducer keeps each stream's thread until every stream has handed over its chunk; over
    gRPC each stream must verify and hand over in a thread of its own. Here the loop's shared
    executor has 2 threads for 5 remote streams: streams run in it would wait on each other for ever."""
    tokens = {f"site{i}": 100 * (i + 1) for i in range(6)}
    me = "site0"

    async def run() -> None:
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(2))
        encoded = {s: codec.encode(random_model(i, SIZES), round=ROUND, site=s, tokens=t, chunk_size=CHUNK)
                   for i, (s, t) in enumerate(tokens.items())}
        stores = {s: ExchangeStore() for s in tokens}
        async with contextlib.AsyncExitStack() as stack:
            addresses = {s: await stack.enter_async_context(serving(stores[s], bulk=False)) for s in tokens}
            for s, e in encoded.items():
                await stores[s].publish(e)
            clients: dict[str, ExchangeClient | None] = {s: None if s == me else ExchangeClient(a, plane="grpc")
                                                         for s, a in addresses.items()}
            for c in clients.values():
                if c is not None:
                    stack.push_async_callback(c.close)
            dest = {e.name: torch.full(e.shape, float("nan")) for e in encoded[me].manifest.layout.tensors}
            await asyncio.wait_for(all_to_all_mean(ROUND, clients, stores[me], dest, policy=FetchPolicy.local_test(),
                                                   manifest_wait_s=10.0), 30)
            want = _expected(encoded)
            assert all(torch.equal(dest[n], want[n]) for n in want)

    asyncio.run(run())


def test_a_mean_received_in_place_in_bf16_is_exact_despite_drops_flips_and_stalls() -> None:
    # The node's case: bf16 wire, its mean in bf16, the mean shards received straight into it.
    faults = {
        ("alpha", "bravo"): [Fault(drop_after=20_000)],
        ("bravo", "charlie"): [Fault(flip_at=10_000)],
        ("charlie", "alpha"): [Fault(stall_after=15_000, stall_s=3.0)],
    }
    encoded = _encode(_models(seed=11))
    dests, reports = asyncio.run(_mesh(reduce_scatter_mean, faults, encoded, "bulk", torch.bfloat16))
    _check(reduce_scatter_mean, dests, encoded)
    assert all(t.dtype == torch.bfloat16 for d in dests.values() for t in d.values())
    assert all(sum(st.corrupt_chunks + st.transport_errors + st.stalls + st.truncated_streams
                   for st in reports[receiver].stats.values()) >= 1 for receiver, _ in faults)


def test_all_to_all_refuses_a_destination_in_the_wire_dtype() -> None:
    # Its mean is fp32 arithmetic, not the wire's values: bf16 would round it where nobody asked.
    with pytest.raises(codec.LayoutMismatch, match="dtype bfloat16, layout says float32$"):
        asyncio.run(_mesh(all_to_all_mean, {}, _encode(_models()), "bulk", torch.bfloat16))


@pytest.mark.parametrize("scheme", [all_to_all_mean, reduce_scatter_mean])
def test_tiny_layout_where_some_shards_are_empty(scheme: Scheme) -> None:
    # 3 elements: one chunk, so two of the three reduce-scatter owners own nothing.
    encoded = _encode(_models(sizes={"empty": (0, 4), "odd": (3,)}))
    dests, _ = asyncio.run(_mesh(scheme, {}, encoded))
    _check(scheme, dests, encoded)


@pytest.mark.parametrize("plane", ["grpc", "bulk"])
@pytest.mark.parametrize("scheme", [all_to_all_mean, reduce_scatter_mean])
def test_a_non_finite_contribution_is_refused_and_named(scheme: Scheme, plane: str) -> None:
    encoded = _encode(_models())
    encoded["bravo"].data.view(torch.bfloat16)[-1] = float("nan")  # in the last shard (charlie's)
    encoded["bravo"] = rehashed(encoded["bravo"])
    with pytest.raises(codec.NonFiniteError, match=r"NaN or Inf from \['bravo'\]"):
        asyncio.run(_mesh(scheme, {}, encoded, plane))


@pytest.mark.parametrize("plane", ["grpc", "bulk"])
def test_a_malformed_sparse_contribution_is_refused_and_named(plane: str) -> None:
    """bravo's sparse object repeats an index (its hashes are right): every peer refuses it,
    naming bravo, before any of the round's mean is handed on."""
    encoded = _encode(_models(), codec.WireDtype.SPARSE)
    chunk = encoded["bravo"].chunk(0)
    groups = -(-encoded["bravo"].manifest.chunk_elements(0) // 4096)
    chunk[4 * groups + 3 : 4 * groups + 6].copy_(chunk[4 * groups : 4 * groups + 3])  # pair 1 := pair 0
    encoded["bravo"] = rehashed(encoded["bravo"])
    with pytest.raises(codec.SparseIndexError, match=r"not strictly increasing .* in bravo.s pseudo-gradient; it is refused"):
        asyncio.run(_mesh(all_to_all_mean, {}, encoded, plane))


@pytest.mark.parametrize("plane", ["grpc", "bulk"])
def test_a_source_that_is_lost_for_good_ends_the_exchange_while_another_stream_waits(plane: str) -> None:
    """alpha's stream from charlie dies after a few chunks and never comes back, while its stream
    from bravo holds the next chunk and waits for charlie's (the reducer's lockstep): the exchange
    must end with FetchError, not wait for ever (the reducer is stopped before the fetches it
    cancelled are awaited)."""
    faults = {("alpha", "charlie"): [Fault(drop_after=20_000)] + [Fault(drop_after=100)] * 20}
    with pytest.raises(FetchError, match="gave up"):
        asyncio.run(_mesh(all_to_all_mean, faults, _encode(_models(seed=12)), plane))


@pytest.mark.parametrize("scheme", [all_to_all_mean, reduce_scatter_mean])
def test_manifests_the_caller_fetched_are_not_fetched_again(scheme: Scheme, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node checks every contributor's root against the round before the mean (round_exchange.py)
    and hands the manifests on: the mean is the same, with fewer manifest requests (all-gather:
    none; reduce-scatter: only the shard owners' roots checks and the mean shards')."""
    encoded = _encode(_models())
    asked: list[codec.ObjectKey] = []
    get_manifest = ExchangeClient.get_manifest

    async def counting(self: ExchangeClient, key: codec.ObjectKey, *args: Any, **kwargs: Any) -> Any:
        asked.append(key)
        return await get_manifest(self, key, *args, **kwargs)

    monkeypatch.setattr(ExchangeClient, "get_manifest", counting)
    counts = {}
    for known in (False, True):
        asked.clear()
        dests, _ = asyncio.run(_mesh(scheme, {}, encoded, known=known))
        _check(scheme, dests, encoded)
        counts[known] = sum(1 for k in asked if k.kind is codec.ObjectKind.PSEUDO_GRADIENT)
    assert counts[True] < counts[False]
    if scheme is all_to_all_mean:
        assert counts[True] == 0


def test_a_peer_with_another_layout_is_refused() -> None:
    models = _models()
    models["charlie"]["layer.0.b"] = torch.zeros(8)
    with pytest.raises(codec.LayoutMismatch, match="charlie"):
        asyncio.run(_mesh(all_to_all_mean, {}, _encode(models)))


def test_exchanges_reuse_memory_and_mean_shards_only_once_the_last_one_is_gone() -> None:
    """With an ExchangeMemory (as the node runs), later rounds receive into the buffers of earlier
    ones, and a peer's mean shard is encoded into the memory of an earlier one only after that one
    left the store: while it is still served, its bytes stay intact."""
    async def run() -> None:
        stores = {s: ExchangeStore() for s in TOKENS}
        memories = {s: ExchangeMemory() for s in TOKENS}
        async with contextlib.AsyncExitStack() as stack:
            addresses = {s: await stack.enter_async_context(serving(stores[s])) for s in TOKENS}
            clients = {me: {o: (None if o == me else ExchangeClient(addresses[o])) for o in TOKENS} for me in TOKENS}
            for c in (c for cs in clients.values() for c in cs.values() if c is not None):
                stack.push_async_callback(c.close)

            async def round_(r: int) -> dict[str, tuple[int, bytes]]:
                # Other pseudo-gradients every round: a shard written over would not keep its bytes.
                encoded = {s: codec.encode(m, round=r, site=s, tokens=TOKENS[s], chunk_size=CHUNK)
                           for s, m in _models(seed=r).items()}
                for s, e in encoded.items():
                    await stores[s].publish(e)
                dests = {s: {n: torch.full(shape, float("nan")) for n, shape in SIZES.items()} for s in TOKENS}
                await asyncio.wait_for(asyncio.gather(*(
                    reduce_scatter_mean(r, s, clients[s], stores[s], dests[s], policy=FetchPolicy.local_test(),
                                        manifest_wait_s=10.0, memory=memories[s]) for s in TOKENS)), 30)
                _check(reduce_scatter_mean, dests, encoded)
                shards = {s: stores[s].get(codec.ObjectKey(r, s, codec.ObjectKind.MEAN_SHARD)) for s in TOKENS}
                return {s: (e.data.data_ptr(), bytes(codec.as_memoryview(e.data))) for s, e in shards.items()
                        if e is not None and e.data.numel()}

            first = await round_(ROUND)
            assert sorted(first) == sorted(TOKENS)  # every peer owns a non-empty shard
            kept = await round_(ROUND + 1)  # round ROUND's shards are still in the stores
            for s, (ptr, data) in first.items():
                assert kept[s][0] != ptr and kept[s][1] != data, s
                held = stores[s].get(codec.ObjectKey(ROUND, s, codec.ObjectKind.MEAN_SHARD))
                assert held is not None and bytes(codec.as_memoryview(held.data)) == data, s
                del held
            for store in stores.values():
                store.drop_rounds_before(ROUND + 1)
            reused = await round_(ROUND + 2)
            assert {s: reused[s][0] for s in first} == {s: ptr for s, (ptr, _) in first.items()}
            # Three rounds received ~3 x 11 chunks per peer into buffers of one pool: one per stream
            # of a reduction (each remote site's stream receives every chunk into the same buffer).
            made = {s: m.chunks(CHUNK).made for s, m in memories.items()}
            assert all(0 < n <= len(TOKENS) - 1 for n in made.values()), made

    asyncio.run(run())


def test_shards_cover_every_chunk_once_and_balance() -> None:
    for n in (0, 1, 2, 7, 100):
        shards = shard_chunks(n, ["c", "a", "b"])
        ranges = [shards[s] for s in ("a", "b", "c")]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(ranges[i][1] == ranges[i + 1][0] for i in range(2))
        sizes = [b - a for a, b in ranges]
        assert max(sizes) - min(sizes) <= 1


async def _partial_mesh(encoded: dict[str, codec.Encoded], idle: str, reduce_on_request: bool) -> tuple[
        dict[str, dict[str, torch.Tensor]], dict[str, MeanReport], dict[str, FetchStats]]:
    """Every peer but `idle` runs reduce_scatter_mean; `idle` only serves its pseudo-gradient and,
    if `reduce_on_request`, reduces its shard when a peer's mean-shard request names the round's
    contributors (as the node does for a leader that decides before the commit), booking what it
    pulled per site in the third dict (the node's received-bytes metric)."""
    fetched: dict[str, FetchStats] = {}
    stores = {s: ExchangeStore() for s in encoded}
    async with contextlib.AsyncExitStack() as stack:
        addresses = {s: await stack.enter_async_context(serving(stores[s])) for s in encoded}
        clients = {me: {o: (None if o == me else ExchangeClient(addresses[o])) for o in encoded} for me in encoded}
        for cs in clients.values():
            for c in cs.values():
                if c is not None:
                    stack.push_async_callback(c.close)
        policy = FetchPolicy.local_test()
        started: list[asyncio.Task[codec.Encoded]] = []
        if reduce_on_request:
            def requested(round_: int, inputs: tuple[tuple[str, str, bytes], ...]) -> None:
                started.append(asyncio.ensure_future(reduce_shard(
                    round_, idle, clients[idle], stores[idle], roots={s: r for s, _, r in inputs}, policy=policy,
                    fetched=fetched)))
            stores[idle].on_mean_request = requested
        for s, e in encoded.items():
            await stores[s].publish(e)
        inputs = tuple(sorted((s, addresses[s], e.manifest.root_hash) for s, e in encoded.items()))
        dests = {s: {e.name: torch.full(e.shape, float("nan")) for e in encoded[s].manifest.layout.tensors}
                 for s in encoded if s != idle}
        runs = [reduce_scatter_mean(ROUND, s, clients[s], stores[s], dests[s], inputs=inputs, policy=policy,
                                    manifest_wait_s=3.0) for s in dests]
        reports = await asyncio.wait_for(asyncio.gather(*runs), 30)
        assert bool(started) == reduce_on_request
        await asyncio.gather(*started)
    return dests, dict(zip(dests, reports)), fetched


@pytest.mark.parametrize("reduce_on_request", [True, False])
def test_an_owner_that_does_not_serve_its_shard_is_reduced_around(reduce_on_request: bool) -> None:
    """An owner that learns the round from the request reduces its shard; one that never serves it
    is replaced by a local reduction of its shard, with the same bits either way."""
    encoded = _encode(_models(seed=3))
    dests, reports, fetched = asyncio.run(_partial_mesh(encoded, "charlie", reduce_on_request))
    _check(reduce_scatter_mean, dests, encoded)
    for r in reports.values():
        assert r.reduced_here == ([] if reduce_on_request else ["charlie"])
    # A shard reduced for a peer's request still books what it pulled from each contributor.
    others = sorted(set(encoded) - {"charlie"})
    assert sorted(s for s, st in fetched.items() if st.bytes > 0) == (others if reduce_on_request else [])
