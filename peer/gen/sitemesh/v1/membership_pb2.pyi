from peer.gen.sitemesh.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemberState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_STATE_UNSPECIFIED: _ClassVar[MemberState]
    MEMBER_STATE_ALIVE: _ClassVar[MemberState]
    MEMBER_STATE_SUSPECT: _ClassVar[MemberState]
    MEMBER_STATE_DEAD: _ClassVar[MemberState]
    MEMBER_STATE_LEFT: _ClassVar[MemberState]
MEMBER_STATE_UNSPECIFIED: MemberState
MEMBER_STATE_ALIVE: MemberState
MEMBER_STATE_SUSPECT: MemberState
MEMBER_STATE_DEAD: MemberState
MEMBER_STATE_LEFT: MemberState

class MemberUpdate(_message.Message):
    __slots__ = ("site", "state", "incarnation", "meta", "from_site")
    SITE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    site: str
    state: MemberState
    incarnation: int
    meta: _common_pb2.MemberMeta
    from_site: str
    def __init__(self, site: _Optional[str] = ..., state: _Optional[_Union[MemberState, str]] = ..., incarnation: _Optional[int] = ..., meta: _Optional[_Union[_common_pb2.MemberMeta, _Mapping]] = ..., from_site: _Optional[str] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("seq", "from_site", "from_address", "target_site", "updates")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    FROM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TARGET_SITE_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    from_site: str
    from_address: str
    target_site: str
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, seq: _Optional[int] = ..., from_site: _Optional[str] = ..., from_address: _Optional[str] = ..., target_site: _Optional[str] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "from_site", "updates")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    from_site: str
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, seq: _Optional[int] = ..., from_site: _Optional[str] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class PingReq(_message.Message):
    __slots__ = ("seq", "from_site", "from_address", "target_site", "target_address", "updates")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    FROM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TARGET_SITE_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    from_site: str
    from_address: str
    target_site: str
    target_address: str
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, seq: _Optional[int] = ..., from_site: _Optional[str] = ..., from_address: _Optional[str] = ..., target_site: _Optional[str] = ..., target_address: _Optional[str] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("seq", "from_site")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    from_site: str
    def __init__(self, seq: _Optional[int] = ..., from_site: _Optional[str] = ...) -> None: ...

class PushPull(_message.Message):
    __slots__ = ("from_site", "from_address", "members", "join", "reply")
    FROM_SITE_FIELD_NUMBER: _ClassVar[int]
    FROM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    from_site: str
    from_address: str
    members: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    join: bool
    reply: bool
    def __init__(self, from_site: _Optional[str] = ..., from_address: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ..., join: _Optional[bool] = ..., reply: _Optional[bool] = ...) -> None: ...
