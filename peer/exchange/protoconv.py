"""Exchange manifests to and from protobuf: the only place where they cross (exchange.proto).

`manifest_from_proto` validates every rule of the contract (codec.Manifest.validate), so what it
returns can be fetched and decoded as it is; what it refuses raises codec.ManifestError saying which
rule the message breaks.
"""

from __future__ import annotations

from peer.exchange import codec
from peer.gen.sitemesh.v1 import exchange_pb2 as pb


def key_to_proto(key: codec.ObjectKey) -> pb.ObjectKey:
    return pb.ObjectKey(round=key.round, site=key.site, kind=key.kind.value)


def key_from_proto(msg: pb.ObjectKey) -> codec.ObjectKey:
    try:
        kind = codec.ObjectKind(msg.kind)
    except ValueError:
        raise codec.ManifestError(f"unknown object kind {msg.kind}") from None
    if not msg.site:
        raise codec.ManifestError("empty site in object key")
    return codec.ObjectKey(msg.round, msg.site, kind)


def manifest_to_proto(m: codec.Manifest) -> pb.Manifest:
    return pb.Manifest(
        key=key_to_proto(m.key),
        wire_dtype=m.layout.wire.value,
        tensors=[
            pb.TensorLayout(name=e.name, shape=e.shape, offset=e.offset, dtype=e.dtype) for e in m.layout.tensors
        ],
        layout_bytes=m.layout.total_bytes,
        range_start=m.range_start,
        range_end=m.range_end,
        chunk_size=m.chunk_size,
        chunk_hashes=m.chunk_hashes,
        chunk_scale_exp=m.scale_exps if any(m.scale_exps) else [],
        root_hash=m.root_hash,
        tokens=m.tokens,
        contributors=m.contributors,
        contributor_roots=m.contributor_roots,
        sparse_keep=m.layout.keep,
    )


def manifest_from_proto(msg: pb.Manifest) -> codec.Manifest:
    """A validated Manifest; codec.ManifestError says which rule the message breaks."""
    try:
        wire = codec.WireDtype(msg.wire_dtype)
    except ValueError:
        raise codec.ManifestError(f"unsupported wire dtype {msg.wire_dtype}: this peer decodes "
                                  f"{[w.name.lower() for w in codec.WireDtype]}; upgrade it or send one of those"
                                  ) from None
    entries = tuple(codec.TensorEntry(t.name, tuple(t.shape), t.offset, t.dtype) for t in msg.tensors)
    layout = codec.Layout(wire, entries, msg.layout_bytes, msg.sparse_keep)
    hashes = tuple(msg.chunk_hashes)
    exps = tuple(msg.chunk_scale_exp) or (0,) * len(hashes)
    m = codec.Manifest(
        key_from_proto(msg.key), layout, msg.range_start, msg.range_end, msg.chunk_size, hashes, exps,
        msg.root_hash, msg.tokens, tuple(msg.contributors), tuple(msg.contributor_roots),
    )  # fmt: skip
    m.validate()
    return m
