"""A site's side of the pseudo-gradient exchange: what it serves and what it pulls, round by round.

It publishes this site's pseudo-gradient of a round (with the error feedback of the quantized and
sparse wires), serves the applied θ and momentum to peers that fell behind, forms a committed
round's token-weighted mean from the contributors' pseudo-gradients (reduce-scatter, or all-gather
for the sparse wire), reduces this site's mean shard when a peer asks, and fetches a peer's state
for a state transfer. The byte-level exchange is peer/exchange/; this module holds the per-site
clients, buffers and shards that outlive one call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable, Sequence
from pathlib import Path

import torch

from peer.exchange import codec
from peer.exchange.allreduce import all_to_all_mean, publish_pseudo_gradient, reduce_scatter_mean, reduce_shard
from peer.exchange.buffers import EncodeBuffers, ExchangeMemory
from peer.exchange.bulk import BulkConfig, BulkServer
from peer.exchange.client import ExchangeClient, fetch_into, fetch_manifest
from peer.exchange.feedback import ErrorFeedback
from peer.exchange.planes import DEFAULT_PLANE
from peer.exchange.sources import FetchError, FetchStats
from peer.exchange.store import ExchangeStore, MeanInputs
from peer.trainer.config import TrainerConfig
from peer.transport.channels import PLAINTEXT, Credentials
from peer.transport.dialer import Dialer

log = logging.getLogger("sitemesh.training")

RESIDUAL_FILE = "wire-residual.safetensors"
"""int8/int4/sparse error feedback: the part of this site's last pseudo-gradients not sent."""
OWNER_WAIT_S = 120.0
"""How long a peer waits for a shard owner's mean shard before reducing that shard itself: a
stuck owner then costs a round this much and all-to-all bytes for its shard, never the round."""
MANIFEST_TIMEOUT_S = 5.0
"""How long a round's check of a contributor's manifest (a few kilobytes) waits for its answer. A
contributor cut off right after it reported costs the round this before the leader excludes it (it
loses only its contribution: its samples go back on their leases); a follower that cannot reach it
catches up by state transfer. 5 s covers a TLS handshake and a second's pause at either end over a
150 ms link (docs/decisions/exchange-manifest-timeout.md)."""
KEEP_EXCHANGE_ROUNDS = 4
"""Pseudo-gradients stay served this many rounds after their commit, for peers that lag."""


class InvalidContribution(RuntimeError):
    """A contributor's pseudo-gradient does not match what the round says of it (its manifest's root
    hash or tokens, the averaging weight, differ from what it reported / the commit names)."""

    def __init__(self, message: str, site: str) -> None:
        super().__init__(message)
        self.site = site
        """Whose contribution is invalid (a leader deciding a round excludes that site)."""


class Unavailable(RuntimeError):
    """A pseudo-gradient named by a committed round is no longer served by anyone reachable:
    this peer must catch up by state transfer instead of recomputing the round."""

    def __init__(self, message: str, site: str) -> None:
        super().__init__(message)
        self.site = site
        """Whose pseudo-gradient is missing (a leader deciding a round leaves that site out)."""


def check_weights(round_: int, named: dict[str, int], served: dict[str, int]) -> None:
    """The tokens each manifest carries are the weights of the mean; they must be the tokens the
    round names for that site, or a site could weigh itself up after the leader admitted it."""
    for site in sorted(named):
        if served.get(site) != named[site]:
            raise InvalidContribution(
                f"round {round_}: {site}'s pseudo-gradient manifest says {served.get(site)} tokens, the round "
                f"names {named[site]}: its averaging weight does not match its report", site)


class RoundExchange:
    def __init__(self, site: str, trainer_config: TrainerConfig, creds: Credentials = PLAINTEXT,
                 plane: str = DEFAULT_PLANE, dialer: Dialer | None = None) -> None:
        self._dialer = dialer
        """Opens connections to the other sites' exchange (directly, through a proxy or a relay)."""
        self.site = site
        self._config = trainer_config
        self._wire = codec.WireDtype.named(trainer_config.wire)
        self._creds = creds
        """How this site dials other sites' exchange services (mutual TLS, or plaintext)."""
        self._plane = plane
        """Where chunks travel: "bulk" (the bulk data plane where a peer offers it) or "grpc"."""
        self._bulk: BulkServer | None = None
        self.store = ExchangeStore()
        self.store.on_mean_request = self._mean_requested
        self.applied_round = 0
        """The newest round applied here (the owner keeps it current): older mean requests are stale."""
        self._clients: dict[str, ExchangeClient] = {}
        # The last round's mean destination, written again by the next round: fresh memory for a
        # model-sized mean every round cost more than the exchange itself (exchange-buffer-reuse.md).
        self._spare_mean: dict[str, torch.Tensor] | None = None
        self._encode_buffers = EncodeBuffers()  # likewise for the pseudo-gradients this site encodes
        self._memory = ExchangeMemory()  # and what its mean exchanges receive into and encode mean shards into
        # This site's mean-shard reductions, one per (round, contributors' sites and roots): shared by
        # the mean and by peers' requests (a leader asks before the commit names the contributors).
        self._shards: dict[tuple[int, tuple[tuple[str, bytes], ...]], asyncio.Future[codec.Encoded]] = {}
        self._feedback: ErrorFeedback | None = None
        """int8/int4/sparse: what this site's last pseudo-gradients did not send (site-local, on disk)."""
        # Manifests asked for as the leader got each report (`ask_manifest`), taken by the round's
        # root check: a contributor cut off after reporting is then known by the round's deadline.
        self._asked: dict[tuple[int, str, str, bytes], asyncio.Task[codec.Manifest]] = {}
        self.fetched: dict[str, FetchStats] = {}
        """Pseudo-gradient fetches per remote site since start: bytes and the faults survived."""

    async def load_feedback(self, state_dir: Path, like: dict[str, torch.Tensor]) -> None:
        """The quantized and sparse wires' residual, as this site left it (zeros the first time)."""
        if self._wire.quantized:
            self._feedback = await asyncio.to_thread(ErrorFeedback, state_dir / RESIDUAL_FILE, like,
                                                     self._config.decay)

    async def reset_feedback(self) -> None:
        """After a state transfer: the residual was meant for the rounds this site missed."""
        if self._feedback is not None:
            await asyncio.to_thread(self._feedback.reset)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        if self._bulk is not None:
            self._bulk.close()

    def bulk_refusals(self) -> dict[str, int]:
        """Bulk data-plane connections this peer refused, by status name (none without the plane)."""
        return self._bulk.refusals() if self._bulk is not None else {}

    def serve_bulk(self, host: str) -> BulkServer | None:
        """Starts this site's bulk data plane on `host` (the gRPC listen host), unless the plane is
        "grpc"; the node hands it to add_exchange_service. Call on the event loop."""
        if self._plane == "bulk":
            self._bulk = BulkServer(self.store, BulkConfig(host=host), self._creds)
            log.info("exchange bulk data plane on %s:%d", host, self._bulk.start())
        return self._bulk

    # ----- this site's pseudo-gradient -------------------------------------------------------
    async def publish(self, round_: int, delta: dict[str, torch.Tensor], handed: torch.Tensor, tokens: int,
                      param_dtypes: dict[str, torch.dtype]) -> codec.Encoded:
        """Publishes this site's pseudo-gradient of `round_` (`handed`: the bytes `delta` views)."""
        # A round this site trained in an earlier process (restarted before the round was decided)
        # is trained again; the earlier, never-committed pseudo-gradient of the round is withdrawn.
        self.store.drop(codec.ObjectKey(round_, self.site))
        wire = self._wire
        if self._feedback is not None:  # int8/int4/sparse: what the last rounds did not send is sent now
            await asyncio.to_thread(self._feedback.add_to, delta)
        # bf16/fp32: the trainer handed Δ over in the wire layout (config.HANDOFF_DTYPES), so it is
        # encoded where it lies; otherwise it is converted into a buffer reused round after round.
        in_place = codec.laid_out_in(delta, handed, wire)
        if not in_place and wire in codec.PLACEABLE:  # the worker hands these over in the wire layout
            log.warning("round %d: the trainer's pseudo-gradient is not in the %s wire layout; converting it "
                        "into a buffer instead of encoding it where it lies", round_, wire.name)
        keep = self._config.sparse_keep
        chunk = codec.SPARSE_CHUNK_BYTES if keep else codec.DEFAULT_CHUNK_BYTES
        buffer = handed if in_place else self._encode_buffers.take(codec.encoded_nbytes(delta, wire, chunk, keep))
        encoded = await publish_pseudo_gradient(self.store, delta, round=round_, site=self.site, tokens=tokens,
                                                wire=wire, out=buffer, keep=keep, chunk_size=chunk,
                                                param_dtypes=param_dtypes)
        if not in_place:
            self._encode_buffers.lend(buffer, encoded)
        if self._feedback is not None:
            await asyncio.to_thread(self._feedback.keep, delta, encoded)
        return encoded

    # ----- a committed round's mean ----------------------------------------------------------
    async def mean(self, round_: int, contributors: Sequence[tuple[str, str, bytes, int]],
                   like: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
        """The token-weighted mean of the (site, address, root, tokens) contributors' pseudo-gradients,
        shaped `like` θ, and its total tokens; roots checked against the manifests, and the
        manifests' tokens (the averaging weights) against what the commit names."""
        sites = self._sources((s, a) for s, a, _, _ in contributors)
        manifests = await self._check_roots(round_, [(s, a, root) for s, a, root, _ in contributors])
        mean = self._take_mean(like)
        inputs: MeanInputs = tuple(sorted((s, a, root) for s, a, root, _ in contributors))
        try:
            if self._wire is codec.WireDtype.SPARSE:  # all-gathered: every peer sums them itself
                report = await all_to_all_mean(round_, sites, self.store, mean,
                                               roots={s: root for s, _, root in inputs}, manifests=manifests)
            else:
                report = await reduce_scatter_mean(round_, self.site, sites, self.store, mean, inputs=inputs,
                                                   my_shard=lambda: self._mean_shard(round_, inputs),
                                                   owner_wait_s=OWNER_WAIT_S, memory=self._memory,
                                                   manifests=manifests)
        except FetchError as err:
            # A contributor's own pseudo-gradient could not be had (it died after its manifest was
            # read): it alone is left out, as at the root check, not the whole round.
            key = err.key
            if key is not None and key.kind is codec.ObjectKind.PSEUDO_GRADIENT and key.site in sites:
                raise Unavailable(f"round {round_}: {key.site}'s pseudo-gradient: {err}", key.site) from err
            raise
        if report.reduced_here:
            log.warning("round %d: reduced the shards of %s here (all-to-all for them)", round_, report.reduced_here)
        check_weights(round_, {site: tokens for site, _, _, tokens in contributors}, report.tokens)
        for site, stats in report.stats.items():
            self.fetched.setdefault(site, FetchStats()).add(stats)
        return mean, sum(report.tokens.values())

    def give_back(self, mean: dict[str, torch.Tensor]) -> None:
        """The outer step has read the mean and kept none of it: the next round writes it again."""
        self._spare_mean = mean

    def applied(self, round_: int) -> None:
        """`round_` is applied here: older pseudo-gradients and shards need no serving."""
        self.applied_round = round_
        self.store.drop_rounds_before(round_ - KEEP_EXCHANGE_ROUNDS)
        self._shards = {k: f for k, f in self._shards.items() if k[0] > round_}
        for key in [k for k in self._asked if k[0] <= round_]:  # a report its round went without
            self._asked.pop(key).cancel()

    def ask_manifest(self, round_: int, site: str, address: str, root: bytes) -> None:
        """A leader got `site`'s report of `round_`: asks for its manifest now, in the background,
        for `_check_roots` to take when the round is decided (rounds.Reported)."""
        key = (round_, site, address, root)
        if site != self.site and key not in self._asked:
            task = asyncio.ensure_future(self._manifest(round_, site, address, root))
            # Read here, so that one the round never takes is not reported as never retrieved.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._asked[key] = task

    def _take_mean(self, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A destination for a round's mean: the spare one if it still fits θ (a mean formed at the
        same time allocates its own), else fresh memory."""
        spare, self._spare_mean = self._spare_mean, None
        # In the parameters' dtype, not the wire's (which the bulk plane could receive into in place):
        # a bf16 mean measured worse (docs/decisions/exchange-mean-in-place.md).
        if spare is not None and spare.keys() == like.keys() and all(
            (spare[n].shape, spare[n].dtype, spare[n].device) == (t.shape, t.dtype, t.device)
            for n, t in like.items()
        ):
            return spare
        return {n: torch.empty_like(t) for n, t in like.items()}

    def _sources(self, pairs: Iterable[tuple[str, str]]) -> dict[str, ExchangeClient | None]:
        """(site, address) -> the client to pull from; None for this site (its objects are in the store)."""
        return {site: None if site == self.site else self._client(address) for site, address in pairs}

    def _client(self, address: str) -> ExchangeClient:
        if address not in self._clients:
            self._clients[address] = ExchangeClient(address, self._creds, self._plane, dialer=self._dialer)
        return self._clients[address]

    def _mean_shard(self, round_: int, inputs: MeanInputs) -> asyncio.Future[codec.Encoded]:
        """This site's mean shard of `round_` over `inputs`: reduced once, however many ask."""
        key = (round_, tuple((s, r) for s, _, r in inputs))
        held = self._shards.get(key)
        if held is None or (held.done() and (held.cancelled() or held.exception() is not None)):
            sites = self._sources((s, a) for s, a, _ in inputs)
            # What it pulls from the other contributors counts as received from them (the metrics),
            # whether the reduction was started by this peer's own mean or by a peer's request.
            held = asyncio.ensure_future(reduce_shard(round_, self.site, sites, self.store,
                                                      roots={s: r for s, _, r in inputs}, fetched=self.fetched,
                                                      memory=self._memory))
            self._shards[key] = held
        return asyncio.shield(held)

    def _mean_requested(self, round_: int, inputs: MeanInputs) -> None:
        """A peer (the deciding leader, or one that applies the commit before us) asks for our shard."""
        if round_ <= self.applied_round or self.site not in {s for s, _, _ in inputs}:
            return  # an old round (answered from the store or not at all), or not one of ours

        def done(f: asyncio.Future[codec.Encoded]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.warning("round %d: reducing our mean shard for a peer failed: %s", round_, f.exception())

        log.info("round %d: reducing our mean shard over %s for a peer's request", round_, [s for s, _, _ in inputs])
        self._mean_shard(round_, inputs).add_done_callback(done)

    async def _check_roots(self, round_: int,
                           contributors: Sequence[tuple[str, str, bytes]]) -> dict[str, codec.Manifest]:
        """Each contributor's manifest, its root checked against the one the round names: a site to
        blame (InvalidContribution, Unavailable) before any chunk moves. All are asked at once, so
        unreachable contributors cost the round one MANIFEST_TIMEOUT_S, not one each; the first
        contributor in order with a fault is the one blamed."""
        got = await asyncio.gather(*(self._asked_or_ask(round_, site, address, root)
                                     for site, address, root in contributors), return_exceptions=True)
        for result in got:
            if isinstance(result, BaseException):
                raise result
        return {site: m for (site, _, _), m in zip(contributors, got) if isinstance(m, codec.Manifest)}

    def _asked_or_ask(self, round_: int, site: str, address: str, root: bytes) -> Awaitable[codec.Manifest]:
        asked = self._asked.pop((round_, site, address, root), None)
        return asked if asked is not None else self._manifest(round_, site, address, root)

    async def _manifest(self, round_: int, site: str, address: str, root: bytes) -> codec.Manifest:
        key = codec.ObjectKey(round_, site)
        manifest: codec.Manifest | None = None
        if site == self.site:
            held = self.store.get(key)
            manifest = held.manifest if held is not None else None
        elif address:
            client = self._client(address)
            client.prefetch_ticket()  # its chunks follow (as fetch_manifest does)
            try:  # no wait: a contributor publishes its pseudo-gradient before it reports it
                manifest = await client.get_manifest(key, answer_s=MANIFEST_TIMEOUT_S)
            except Exception as err:
                raise Unavailable(f"round {round_}: {site}'s pseudo-gradient: {err}", site) from err
        if manifest is None:
            raise Unavailable(f"round {round_}: nobody serves {site}'s pseudo-gradient any more", site)
        if manifest.root_hash != root:
            # The contributor's own word is wrong (a bug or a forgery): a leader excludes it alone
            # instead of committing the round empty; a follower applying the commit re-syncs.
            raise InvalidContribution(f"round {round_}: {site} serves a pseudo-gradient with root "
                                      f"{manifest.root_hash.hex()[:16]}, the round names {root.hex()[:16]}", site)
        return manifest

    # ----- applied states, for peers that fell behind ----------------------------------------
    async def publish_state(self, round_: int, state: dict[str, torch.Tensor]) -> None:
        """Serves the applied `state` of `round_` (θ and m, exact fp32); only the newest is kept."""
        encoded = await asyncio.to_thread(codec.encode, state, round=round_, site=self.site, tokens=0,
                                          wire=codec.WireDtype.FP32, kind=codec.ObjectKind.GLOBAL_STATE)
        await self.store.publish(encoded)
        self.store.drop_states_before(self.site, round_)

    def withdraw_state(self, round_: int) -> None:
        """Stops serving this site's state of `round_`: a θ on disk that diverged was served as it at
        start, and the store refuses a second object under one key with another root."""
        self.store.drop(codec.ObjectKey(round_, self.site, codec.ObjectKind.GLOBAL_STATE))

    async def fetch_state(self, round_: int, site: str, address: str,
                          like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`site`'s served state of `round_`, shaped `like`; raises what the fetch met."""
        client = self._client(address)
        key = codec.ObjectKey(round_, site, codec.ObjectKind.GLOBAL_STATE)
        manifest = await fetch_manifest(key, [client], wait_s=2.0)
        dest = {n: torch.empty_like(t) for n, t in like.items()}
        await fetch_into(manifest, [client], dest)
        return dest
