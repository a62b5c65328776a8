from peer.gen.sitemesh.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    LEASE_STATE_FREE: _ClassVar[LeaseState]
    LEASE_STATE_LEASED: _ClassVar[LeaseState]
    LEASE_STATE_STARTED: _ClassVar[LeaseState]
    LEASE_STATE_TRAINED_PENDING: _ClassVar[LeaseState]
    LEASE_STATE_COMMITTED: _ClassVar[LeaseState]
LEASE_STATE_UNSPECIFIED: LeaseState
LEASE_STATE_FREE: LeaseState
LEASE_STATE_LEASED: LeaseState
LEASE_STATE_STARTED: LeaseState
LEASE_STATE_TRAINED_PENDING: LeaseState
LEASE_STATE_COMMITTED: LeaseState

class LeaseHeader(_message.Message):
    __slots__ = ("site", "leader_epoch", "ring_version", "data_epoch", "applied_round", "pace")
    SITE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RING_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_EPOCH_FIELD_NUMBER: _ClassVar[int]
    APPLIED_ROUND_FIELD_NUMBER: _ClassVar[int]
    PACE_FIELD_NUMBER: _ClassVar[int]
    site: str
    leader_epoch: int
    ring_version: int
    data_epoch: int
    applied_round: int
    pace: float
    def __init__(self, site: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., ring_version: _Optional[int] = ..., data_epoch: _Optional[int] = ..., applied_round: _Optional[int] = ..., pace: _Optional[float] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class LeaseRef(_message.Message):
    __slots__ = ("block_id", "generation")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    generation: int
    def __init__(self, block_id: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("block_id", "generation", "spans")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    generation: int
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, block_id: _Optional[int] = ..., generation: _Optional[int] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("block_id", "reason")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    reason: str
    def __init__(self, block_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class GrantRequest(_message.Message):
    __slots__ = ("header", "req", "want", "steal")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REQ_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    STEAL_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    req: int
    want: int
    steal: bool
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., req: _Optional[int] = ..., want: _Optional[int] = ..., steal: _Optional[bool] = ...) -> None: ...

class GrantReply(_message.Message):
    __slots__ = ("header", "req", "grants", "free_blocks", "reason")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REQ_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    req: int
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    free_blocks: int
    reason: str
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., req: _Optional[int] = ..., grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ..., free_blocks: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Renew(_message.Message):
    __slots__ = ("header", "leases", "sent_at")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    sent_at: float
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., sent_at: _Optional[float] = ...) -> None: ...

class RenewReply(_message.Message):
    __slots__ = ("header", "renewed", "lost", "sent_at", "wanted")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    WANTED_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    renewed: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    lost: _containers.RepeatedCompositeFieldContainer[Refusal]
    sent_at: float
    wanted: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., renewed: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., lost: _Optional[_Iterable[_Union[Refusal, _Mapping]]] = ..., sent_at: _Optional[float] = ..., wanted: _Optional[_Iterable[int]] = ...) -> None: ...

class Start(_message.Message):
    __slots__ = ("header", "lease")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    lease: LeaseRef
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., lease: _Optional[_Union[LeaseRef, _Mapping]] = ...) -> None: ...

class StartReply(_message.Message):
    __slots__ = ("header", "lease", "ok", "reason")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    lease: LeaseRef
    ok: bool
    reason: str
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., ok: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class Claim(_message.Message):
    __slots__ = ("lease", "spans", "keep")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    lease: LeaseRef
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    keep: bool
    def __init__(self, lease: _Optional[_Union[LeaseRef, _Mapping]] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., keep: _Optional[bool] = ...) -> None: ...

class Trained(_message.Message):
    __slots__ = ("header", "round", "claims")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    round: int
    claims: _containers.RepeatedCompositeFieldContainer[Claim]
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., round: _Optional[int] = ..., claims: _Optional[_Iterable[_Union[Claim, _Mapping]]] = ...) -> None: ...

class Voucher(_message.Message):
    __slots__ = ("block_id", "generation", "spans", "holder", "round", "ring_version", "owner", "signature", "certificate")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RING_VERSION_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    generation: int
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    holder: str
    round: int
    ring_version: int
    owner: str
    signature: bytes
    certificate: bytes
    def __init__(self, block_id: _Optional[int] = ..., generation: _Optional[int] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., holder: _Optional[str] = ..., round: _Optional[int] = ..., ring_version: _Optional[int] = ..., owner: _Optional[str] = ..., signature: _Optional[bytes] = ..., certificate: _Optional[bytes] = ...) -> None: ...

class TrainedReply(_message.Message):
    __slots__ = ("header", "round", "vouched", "refused")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VOUCHED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    round: int
    vouched: _containers.RepeatedCompositeFieldContainer[Voucher]
    refused: _containers.RepeatedCompositeFieldContainer[Refusal]
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., round: _Optional[int] = ..., vouched: _Optional[_Iterable[_Union[Voucher, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[Refusal, _Mapping]]] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("header", "leases")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ...) -> None: ...

class PendingClaim(_message.Message):
    __slots__ = ("round", "site", "spans")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    round: int
    site: str
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, round: _Optional[int] = ..., site: _Optional[str] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class LeaseRecord(_message.Message):
    __slots__ = ("block_id", "size", "rev", "generation", "holder", "started", "pending", "done", "data_epoch")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REV_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    DATA_EPOCH_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    size: int
    rev: int
    generation: int
    holder: str
    started: bool
    pending: _containers.RepeatedCompositeFieldContainer[PendingClaim]
    done: _containers.RepeatedCompositeFieldContainer[Span]
    data_epoch: int
    def __init__(self, block_id: _Optional[int] = ..., size: _Optional[int] = ..., rev: _Optional[int] = ..., generation: _Optional[int] = ..., holder: _Optional[str] = ..., started: _Optional[bool] = ..., pending: _Optional[_Iterable[_Union[PendingClaim, _Mapping]]] = ..., done: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., data_epoch: _Optional[int] = ...) -> None: ...

class Replicate(_message.Message):
    __slots__ = ("header", "records")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    records: _containers.RepeatedCompositeFieldContainer[LeaseRecord]
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., records: _Optional[_Iterable[_Union[LeaseRecord, _Mapping]]] = ...) -> None: ...

class BlockRev(_message.Message):
    __slots__ = ("block_id", "rev")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    REV_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    rev: int
    def __init__(self, block_id: _Optional[int] = ..., rev: _Optional[int] = ...) -> None: ...

class ReplicateAck(_message.Message):
    __slots__ = ("header", "acked")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    acked: _containers.RepeatedCompositeFieldContainer[BlockRev]
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., acked: _Optional[_Iterable[_Union[BlockRev, _Mapping]]] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("header", "block_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SyncReply(_message.Message):
    __slots__ = ("header", "records", "complete")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    records: _containers.RepeatedCompositeFieldContainer[LeaseRecord]
    complete: bool
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., records: _Optional[_Iterable[_Union[LeaseRecord, _Mapping]]] = ..., complete: _Optional[bool] = ...) -> None: ...

class Rejected(_message.Message):
    __slots__ = ("header", "req", "reason")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REQ_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    header: LeaseHeader
    req: int
    reason: str
    def __init__(self, header: _Optional[_Union[LeaseHeader, _Mapping]] = ..., req: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
