from peer.gen.sitemesh.v1 import common_pb2 as _common_pb2
from peer.gen.sitemesh.v1 import consensus_pb2 as _consensus_pb2
from peer.gen.sitemesh.v1 import leases_pb2 as _leases_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RoundOpen(_message.Message):
    __slots__ = ("header", "round", "inner_steps", "deadline_s", "base_weights_hash", "budget_s")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    INNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    BASE_WEIGHTS_HASH_FIELD_NUMBER: _ClassVar[int]
    BUDGET_S_FIELD_NUMBER: _ClassVar[int]
    header: _consensus_pb2.ConsensusHeader
    round: int
    inner_steps: int
    deadline_s: float
    base_weights_hash: bytes
    budget_s: float
    def __init__(self, header: _Optional[_Union[_consensus_pb2.ConsensusHeader, _Mapping]] = ..., round: _Optional[int] = ..., inner_steps: _Optional[int] = ..., deadline_s: _Optional[float] = ..., base_weights_hash: _Optional[bytes] = ..., budget_s: _Optional[float] = ...) -> None: ...

class Contribution(_message.Message):
    __slots__ = ("header", "round", "site", "address", "tokens", "ranges", "pseudo_gradient_root", "vouchers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    PSEUDO_GRADIENT_ROOT_FIELD_NUMBER: _ClassVar[int]
    VOUCHERS_FIELD_NUMBER: _ClassVar[int]
    header: _consensus_pb2.ConsensusHeader
    round: int
    site: str
    address: str
    tokens: int
    ranges: _containers.RepeatedCompositeFieldContainer[_consensus_pb2.SampleRange]
    pseudo_gradient_root: bytes
    vouchers: _containers.RepeatedCompositeFieldContainer[_leases_pb2.Voucher]
    def __init__(self, header: _Optional[_Union[_consensus_pb2.ConsensusHeader, _Mapping]] = ..., round: _Optional[int] = ..., site: _Optional[str] = ..., address: _Optional[str] = ..., tokens: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[_consensus_pb2.SampleRange, _Mapping]]] = ..., pseudo_gradient_root: _Optional[bytes] = ..., vouchers: _Optional[_Iterable[_Union[_leases_pb2.Voucher, _Mapping]]] = ...) -> None: ...

class RunComplete(_message.Message):
    __slots__ = ("header", "round")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    header: _consensus_pb2.ConsensusHeader
    round: int
    def __init__(self, header: _Optional[_Union[_consensus_pb2.ConsensusHeader, _Mapping]] = ..., round: _Optional[int] = ...) -> None: ...
