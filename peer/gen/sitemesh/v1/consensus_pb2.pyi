from peer.gen.sitemesh.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConsensusHeader(_message.Message):
    __slots__ = ("from_site", "from_address", "epoch", "round")
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    FROM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    from_site: str
    from_address: str
    epoch: int
    round: int
    def __init__(self, from_site: _Optional[str] = ..., from_address: _Optional[str] = ..., epoch: _Optional[int] = ..., round: _Optional[int] = ...) -> None: ...

class SampleRange(_message.Message):
    __slots__ = ("block_id", "start", "end")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    start: int
    end: int
    def __init__(self, block_id: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Contributor(_message.Message):
    __slots__ = ("site", "tokens", "ranges", "pseudo_gradient_root")
    SITE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    PSEUDO_GRADIENT_ROOT_FIELD_NUMBER: _ClassVar[int]
    site: str
    tokens: int
    ranges: _containers.RepeatedCompositeFieldContainer[SampleRange]
    pseudo_gradient_root: bytes
    def __init__(self, site: _Optional[str] = ..., tokens: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[SampleRange, _Mapping]]] = ..., pseudo_gradient_root: _Optional[bytes] = ...) -> None: ...

class RoundCommit(_message.Message):
    __slots__ = ("round", "contributors", "weights_hash")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_HASH_FIELD_NUMBER: _ClassVar[int]
    round: int
    contributors: _containers.RepeatedCompositeFieldContainer[Contributor]
    weights_hash: bytes
    def __init__(self, round: _Optional[int] = ..., contributors: _Optional[_Iterable[_Union[Contributor, _Mapping]]] = ..., weights_hash: _Optional[bytes] = ...) -> None: ...

class VoterChange(_message.Message):
    __slots__ = ("site", "address", "add", "reason", "trainerless")
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TRAINERLESS_FIELD_NUMBER: _ClassVar[int]
    site: str
    address: str
    add: bool
    reason: str
    trainerless: bool
    def __init__(self, site: _Optional[str] = ..., address: _Optional[str] = ..., add: _Optional[bool] = ..., reason: _Optional[str] = ..., trainerless: _Optional[bool] = ...) -> None: ...

class EpochStart(_message.Message):
    __slots__ = ("leader",)
    LEADER_FIELD_NUMBER: _ClassVar[int]
    leader: str
    def __init__(self, leader: _Optional[str] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("index", "epoch", "round_commit", "voter_change", "epoch_start")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_COMMIT_FIELD_NUMBER: _ClassVar[int]
    VOTER_CHANGE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_START_FIELD_NUMBER: _ClassVar[int]
    index: int
    epoch: int
    round_commit: RoundCommit
    voter_change: VoterChange
    epoch_start: EpochStart
    def __init__(self, index: _Optional[int] = ..., epoch: _Optional[int] = ..., round_commit: _Optional[_Union[RoundCommit, _Mapping]] = ..., voter_change: _Optional[_Union[VoterChange, _Mapping]] = ..., epoch_start: _Optional[_Union[EpochStart, _Mapping]] = ...) -> None: ...

class Voter(_message.Message):
    __slots__ = ("site", "address")
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    site: str
    address: str
    def __init__(self, site: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class RequestVote(_message.Message):
    __slots__ = ("header", "proposed_epoch", "last_index", "last_epoch", "pre_vote")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    header: ConsensusHeader
    proposed_epoch: int
    last_index: int
    last_epoch: int
    pre_vote: bool
    def __init__(self, header: _Optional[_Union[ConsensusHeader, _Mapping]] = ..., proposed_epoch: _Optional[int] = ..., last_index: _Optional[int] = ..., last_epoch: _Optional[int] = ..., pre_vote: _Optional[bool] = ...) -> None: ...

class VoteReply(_message.Message):
    __slots__ = ("header", "proposed_epoch", "granted", "pre_vote", "reason")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    header: ConsensusHeader
    proposed_epoch: int
    granted: bool
    pre_vote: bool
    reason: str
    def __init__(self, header: _Optional[_Union[ConsensusHeader, _Mapping]] = ..., proposed_epoch: _Optional[int] = ..., granted: _Optional[bool] = ..., pre_vote: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class AppendEntries(_message.Message):
    __slots__ = ("header", "prev_index", "prev_epoch", "entries", "commit_index", "seq")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PREV_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREV_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    header: ConsensusHeader
    prev_index: int
    prev_epoch: int
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    commit_index: int
    seq: int
    def __init__(self, header: _Optional[_Union[ConsensusHeader, _Mapping]] = ..., prev_index: _Optional[int] = ..., prev_epoch: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ..., commit_index: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class AppendReply(_message.Message):
    __slots__ = ("header", "success", "match_index", "seq", "reason")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    header: ConsensusHeader
    success: bool
    match_index: int
    seq: int
    reason: str
    def __init__(self, header: _Optional[_Union[ConsensusHeader, _Mapping]] = ..., success: _Optional[bool] = ..., match_index: _Optional[int] = ..., seq: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("last_index", "last_epoch", "last_round", "weights_hash", "voters", "app_state")
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_HASH_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    APP_STATE_FIELD_NUMBER: _ClassVar[int]
    last_index: int
    last_epoch: int
    last_round: int
    weights_hash: bytes
    voters: _containers.RepeatedCompositeFieldContainer[Voter]
    app_state: bytes
    def __init__(self, last_index: _Optional[int] = ..., last_epoch: _Optional[int] = ..., last_round: _Optional[int] = ..., weights_hash: _Optional[bytes] = ..., voters: _Optional[_Iterable[_Union[Voter, _Mapping]]] = ..., app_state: _Optional[bytes] = ...) -> None: ...

class InstallSnapshot(_message.Message):
    __slots__ = ("header", "snapshot", "seq")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    header: ConsensusHeader
    snapshot: Snapshot
    seq: int
    def __init__(self, header: _Optional[_Union[ConsensusHeader, _Mapping]] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class TimeoutNow(_message.Message):
    __slots__ = ("header", "successor")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SUCCESSOR_FIELD_NUMBER: _ClassVar[int]
    header: ConsensusHeader
    successor: str
    def __init__(self, header: _Optional[_Union[ConsensusHeader, _Mapping]] = ..., successor: _Optional[str] = ...) -> None: ...
