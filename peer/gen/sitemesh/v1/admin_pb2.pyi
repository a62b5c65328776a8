from peer.gen.sitemesh.v1 import common_pb2 as _common_pb2
from peer.gen.sitemesh.v1 import membership_pb2 as _membership_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberStatus(_message.Message):
    __slots__ = ("site", "address", "state", "incarnation", "last_heard_s", "meta")
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARD_S_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    site: str
    address: str
    state: _membership_pb2.MemberState
    incarnation: int
    last_heard_s: float
    meta: _common_pb2.MemberMeta
    def __init__(self, site: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[_membership_pb2.MemberState, str]] = ..., incarnation: _Optional[int] = ..., last_heard_s: _Optional[float] = ..., meta: _Optional[_Union[_common_pb2.MemberMeta, _Mapping]] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("self", "members", "uptime_s", "version", "consensus", "training")
    SELF_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONSENSUS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    self: str
    members: _containers.RepeatedCompositeFieldContainer[MemberStatus]
    uptime_s: float
    version: str
    consensus: ConsensusStatus
    training: TrainingStatus
    def __init__(self_, self: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberStatus, _Mapping]]] = ..., uptime_s: _Optional[float] = ..., version: _Optional[str] = ..., consensus: _Optional[_Union[ConsensusStatus, _Mapping]] = ..., training: _Optional[_Union[TrainingStatus, _Mapping]] = ...) -> None: ...

class TrainingStatus(_message.Message):
    __slots__ = ("applied_round", "weights_hash", "samples_committed", "samples_total", "last_loss", "epoch_complete", "diverged", "data_epoch", "leases_held")
    APPLIED_ROUND_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_HASH_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_LOSS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    DIVERGED_FIELD_NUMBER: _ClassVar[int]
    DATA_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASES_HELD_FIELD_NUMBER: _ClassVar[int]
    applied_round: int
    weights_hash: str
    samples_committed: int
    samples_total: int
    last_loss: float
    epoch_complete: bool
    diverged: str
    data_epoch: int
    leases_held: int
    def __init__(self, applied_round: _Optional[int] = ..., weights_hash: _Optional[str] = ..., samples_committed: _Optional[int] = ..., samples_total: _Optional[int] = ..., last_loss: _Optional[float] = ..., epoch_complete: _Optional[bool] = ..., diverged: _Optional[str] = ..., data_epoch: _Optional[int] = ..., leases_held: _Optional[int] = ...) -> None: ...

class ConsensusStatus(_message.Message):
    __slots__ = ("role", "epoch", "leader", "lease_remaining_s", "committed_round", "commit_index", "applied_index", "voters")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_ROUND_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    role: str
    epoch: int
    leader: str
    lease_remaining_s: float
    committed_round: int
    commit_index: int
    applied_index: int
    voters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, role: _Optional[str] = ..., epoch: _Optional[int] = ..., leader: _Optional[str] = ..., lease_remaining_s: _Optional[float] = ..., committed_round: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., voters: _Optional[_Iterable[str]] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ("notified",)
    NOTIFIED_FIELD_NUMBER: _ClassVar[int]
    notified: int
    def __init__(self, notified: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("seeds",)
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    seeds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, seeds: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: int
    def __init__(self, members: _Optional[int] = ...) -> None: ...
