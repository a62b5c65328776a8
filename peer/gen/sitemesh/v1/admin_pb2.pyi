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
    __slots__ = ("site", "address", "state", "incarnation", "last_heard_s", "meta", "rtt_s", "path")
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARD_S_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    RTT_S_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    site: str
    address: str
    state: _membership_pb2.MemberState
    incarnation: int
    last_heard_s: float
    meta: _common_pb2.MemberMeta
    rtt_s: float
    path: str
    def __init__(self, site: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[_membership_pb2.MemberState, str]] = ..., incarnation: _Optional[int] = ..., last_heard_s: _Optional[float] = ..., meta: _Optional[_Union[_common_pb2.MemberMeta, _Mapping]] = ..., rtt_s: _Optional[float] = ..., path: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("applied_round", "weights_hash", "samples_committed", "samples_total", "last_loss", "epoch_complete", "diverged", "data_epoch", "leases_held", "last_round", "last_decision", "job")
    APPLIED_ROUND_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_HASH_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_LOSS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    DIVERGED_FIELD_NUMBER: _ClassVar[int]
    DATA_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASES_HELD_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    LAST_DECISION_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    applied_round: int
    weights_hash: str
    samples_committed: int
    samples_total: int
    last_loss: float
    epoch_complete: bool
    diverged: str
    data_epoch: int
    leases_held: int
    last_round: RoundTimeline
    last_decision: str
    job: JobStatus
    def __init__(self, applied_round: _Optional[int] = ..., weights_hash: _Optional[str] = ..., samples_committed: _Optional[int] = ..., samples_total: _Optional[int] = ..., last_loss: _Optional[float] = ..., epoch_complete: _Optional[bool] = ..., diverged: _Optional[str] = ..., data_epoch: _Optional[int] = ..., leases_held: _Optional[int] = ..., last_round: _Optional[_Union[RoundTimeline, _Mapping]] = ..., last_decision: _Optional[str] = ..., job: _Optional[_Union[JobStatus, _Mapping]] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job", "member", "nodes", "allocated_s", "joining_s", "training_s", "goodput", "ends_in_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_S_FIELD_NUMBER: _ClassVar[int]
    JOINING_S_FIELD_NUMBER: _ClassVar[int]
    TRAINING_S_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    ENDS_IN_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    member: str
    nodes: int
    allocated_s: float
    joining_s: float
    training_s: float
    goodput: float
    ends_in_s: float
    def __init__(self, job: _Optional[str] = ..., member: _Optional[str] = ..., nodes: _Optional[int] = ..., allocated_s: _Optional[float] = ..., joining_s: _Optional[float] = ..., training_s: _Optional[float] = ..., goodput: _Optional[float] = ..., ends_in_s: _Optional[float] = ...) -> None: ...

class RoundTimeline(_message.Message):
    __slots__ = ("round", "gather_s", "compute_s", "publish_s", "exchange_s", "commit_wait_s", "outer_s", "persist_s", "idle_s", "wall_s", "overhead_share", "tokens", "tokens_per_s", "inner_steps")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    GATHER_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_S_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_S_FIELD_NUMBER: _ClassVar[int]
    COMMIT_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    OUTER_S_FIELD_NUMBER: _ClassVar[int]
    PERSIST_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_SHARE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    INNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    round: int
    gather_s: float
    compute_s: float
    publish_s: float
    exchange_s: float
    commit_wait_s: float
    outer_s: float
    persist_s: float
    idle_s: float
    wall_s: float
    overhead_share: float
    tokens: int
    tokens_per_s: float
    inner_steps: int
    def __init__(self, round: _Optional[int] = ..., gather_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., publish_s: _Optional[float] = ..., exchange_s: _Optional[float] = ..., commit_wait_s: _Optional[float] = ..., outer_s: _Optional[float] = ..., persist_s: _Optional[float] = ..., idle_s: _Optional[float] = ..., wall_s: _Optional[float] = ..., overhead_share: _Optional[float] = ..., tokens: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., inner_steps: _Optional[int] = ...) -> None: ...

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

class DialBackRequest(_message.Message):
    __slots__ = ("from_site", "address")
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    from_site: str
    address: str
    def __init__(self, from_site: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class DialBackReply(_message.Message):
    __slots__ = ("reached", "error", "rtt_s", "from_site")
    REACHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RTT_S_FIELD_NUMBER: _ClassVar[int]
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    reached: bool
    error: str
    rtt_s: float
    from_site: str
    def __init__(self, reached: _Optional[bool] = ..., error: _Optional[str] = ..., rtt_s: _Optional[float] = ..., from_site: _Optional[str] = ...) -> None: ...
