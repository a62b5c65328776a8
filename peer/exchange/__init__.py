"""Pseudo-gradient exchange: chunked, blake3-verified transfers pulled peer to peer, and the mean.

What the node calls (all asyncio, on its loop):

    store = ExchangeStore()
    add_exchange_service(server, store)                          # before server.start()
    encoded = await publish_pseudo_gradient(store, delta, round=r, site=me, tokens=n)
    sites = {me: None, "b": ExchangeClient("host:port"), ...}    # the round's contributors
    report = await all_to_all_mean(r, sites, store, dest)        # or reduce_scatter_mean(r, me, ...)
    # dest now holds sum(n_s * delta_s) / sum(n_s); report.stats has the faults survived per site
    store.drop_rounds_before(r)                                  # after the round is committed

The node (peer/training.py) uses reduce_scatter_mean with `inputs` (the round's contributors): a
leader's mean-shard requests make the other owners reduce before the commit names the contributors
(store.on_mean_request); an owner that does not serve its shard is reduced around, same bits.
Wire formats: bf16/fp16/fp32 and int8/int4 (a scale per 128 elements; feedback.ErrorFeedback keeps
what a site's rounding dropped for its next round).

Chunk bytes travel over the bulk data plane (bulk: plain TCP, TLS under mutual TLS, a one-time
token from the OpenBulk RPC per connection) where both ends offer it, else over gRPC FetchChunks
(`ExchangeClient(plane=...)`, `peer serve --exchange-plane`).

The package imports nothing itself, so the run file's settings (planes) load without torch or grpc.
Lower level: `client.fetch_manifest` / `client.fetch_into` fetch one object into preallocated
tensors; `codec.encode` / `decoding.decode` work without any network. Modules: codec (layout,
chunks, hashes, encoding), decoding (verified chunks into tensors), quantized and sparse (the lossy
byte formats), finite (NaN/Inf checks), protoconv (manifest <-> proto), chunkwire (Chunk messages
without copies), store, service, bulk, client (the retry loop), sources with grpc_source and
bulk_source (the transports a fetch reads chunks over), planes (which one), allreduce, feedback.
Byte layout: protos/sitemesh/v1/exchange.proto. Benchmark: scripts/bench_exchange.
"""
