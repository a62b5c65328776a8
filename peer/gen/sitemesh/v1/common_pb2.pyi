from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Accepted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MemberMeta(_message.Message):
    __slots__ = ("site", "address", "role", "accelerator", "tokens_per_s", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    site: str
    address: str
    role: str
    accelerator: str
    tokens_per_s: float
    labels: _containers.ScalarMap[str, str]
    def __init__(self, site: _Optional[str] = ..., address: _Optional[str] = ..., role: _Optional[str] = ..., accelerator: _Optional[str] = ..., tokens_per_s: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...
