from peer.gen.sitemesh.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WireDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WIRE_DTYPE_UNSPECIFIED: _ClassVar[WireDtype]
    WIRE_DTYPE_BF16: _ClassVar[WireDtype]
    WIRE_DTYPE_FP16: _ClassVar[WireDtype]
    WIRE_DTYPE_FP32: _ClassVar[WireDtype]
    WIRE_DTYPE_INT8: _ClassVar[WireDtype]
    WIRE_DTYPE_INT4: _ClassVar[WireDtype]
    WIRE_DTYPE_SPARSE: _ClassVar[WireDtype]

class ObjectKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBJECT_KIND_UNSPECIFIED: _ClassVar[ObjectKind]
    OBJECT_KIND_PSEUDO_GRADIENT: _ClassVar[ObjectKind]
    OBJECT_KIND_MEAN_SHARD: _ClassVar[ObjectKind]
    OBJECT_KIND_GLOBAL_STATE: _ClassVar[ObjectKind]
WIRE_DTYPE_UNSPECIFIED: WireDtype
WIRE_DTYPE_BF16: WireDtype
WIRE_DTYPE_FP16: WireDtype
WIRE_DTYPE_FP32: WireDtype
WIRE_DTYPE_INT8: WireDtype
WIRE_DTYPE_INT4: WireDtype
WIRE_DTYPE_SPARSE: WireDtype
OBJECT_KIND_UNSPECIFIED: ObjectKind
OBJECT_KIND_PSEUDO_GRADIENT: ObjectKind
OBJECT_KIND_MEAN_SHARD: ObjectKind
OBJECT_KIND_GLOBAL_STATE: ObjectKind

class ObjectKey(_message.Message):
    __slots__ = ("round", "site", "kind")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    round: int
    site: str
    kind: ObjectKind
    def __init__(self, round: _Optional[int] = ..., site: _Optional[str] = ..., kind: _Optional[_Union[ObjectKind, str]] = ...) -> None: ...

class TensorLayout(_message.Message):
    __slots__ = ("name", "shape", "offset", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    dtype: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., dtype: _Optional[str] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("key", "wire_dtype", "tensors", "layout_bytes", "range_start", "range_end", "chunk_size", "chunk_hashes", "chunk_scale_exp", "root_hash", "tokens", "contributors", "contributor_roots", "sparse_keep")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RANGE_START_FIELD_NUMBER: _ClassVar[int]
    RANGE_END_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_HASHES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SCALE_EXP_FIELD_NUMBER: _ClassVar[int]
    ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTOR_ROOTS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_KEEP_FIELD_NUMBER: _ClassVar[int]
    key: ObjectKey
    wire_dtype: WireDtype
    tensors: _containers.RepeatedCompositeFieldContainer[TensorLayout]
    layout_bytes: int
    range_start: int
    range_end: int
    chunk_size: int
    chunk_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    chunk_scale_exp: _containers.RepeatedScalarFieldContainer[int]
    root_hash: bytes
    tokens: int
    contributors: _containers.RepeatedScalarFieldContainer[str]
    contributor_roots: _containers.RepeatedScalarFieldContainer[bytes]
    sparse_keep: int
    def __init__(self, key: _Optional[_Union[ObjectKey, _Mapping]] = ..., wire_dtype: _Optional[_Union[WireDtype, str]] = ..., tensors: _Optional[_Iterable[_Union[TensorLayout, _Mapping]]] = ..., layout_bytes: _Optional[int] = ..., range_start: _Optional[int] = ..., range_end: _Optional[int] = ..., chunk_size: _Optional[int] = ..., chunk_hashes: _Optional[_Iterable[bytes]] = ..., chunk_scale_exp: _Optional[_Iterable[int]] = ..., root_hash: _Optional[bytes] = ..., tokens: _Optional[int] = ..., contributors: _Optional[_Iterable[str]] = ..., contributor_roots: _Optional[_Iterable[bytes]] = ..., sparse_keep: _Optional[int] = ...) -> None: ...

class MeanInput(_message.Message):
    __slots__ = ("site", "address", "root_hash")
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    site: str
    address: str
    root_hash: bytes
    def __init__(self, site: _Optional[str] = ..., address: _Optional[str] = ..., root_hash: _Optional[bytes] = ...) -> None: ...

class ManifestRequest(_message.Message):
    __slots__ = ("key", "wait_ms", "contributors")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    key: ObjectKey
    wait_ms: int
    contributors: _containers.RepeatedCompositeFieldContainer[MeanInput]
    def __init__(self, key: _Optional[_Union[ObjectKey, _Mapping]] = ..., wait_ms: _Optional[int] = ..., contributors: _Optional[_Iterable[_Union[MeanInput, _Mapping]]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("key", "root_hash", "first_chunk", "end_chunk")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    FIRST_CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_CHUNK_FIELD_NUMBER: _ClassVar[int]
    key: ObjectKey
    root_hash: bytes
    first_chunk: int
    end_chunk: int
    def __init__(self, key: _Optional[_Union[ObjectKey, _Mapping]] = ..., root_hash: _Optional[bytes] = ..., first_chunk: _Optional[int] = ..., end_chunk: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class BulkRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BulkTicket(_message.Message):
    __slots__ = ("port", "token", "ttl_ms", "tls")
    PORT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    port: int
    token: bytes
    ttl_ms: int
    tls: bool
    def __init__(self, port: _Optional[int] = ..., token: _Optional[bytes] = ..., ttl_ms: _Optional[int] = ..., tls: _Optional[bool] = ...) -> None: ...
