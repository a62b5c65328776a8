"""Conversion between protocol-core dataclasses and their protobuf messages, in one place.

The cores (peer/membership.py, ...) define frozen dataclasses whose field names are the proto
field names, so conversion is structural: a nested dataclass is a sub-message, a tuple of
dataclasses a repeated message, an Enum the proto enum value `<ENUM_NAME_IN_SNAKE_CAPS>_<MEMBER>`,
and a `tuple[tuple[str, str], ...]` a proto map. Anything that does not fit raises `WireError`,
which servicers turn into INVALID_ARGUMENT: a malformed message is refused, never half-applied.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import types
import typing
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

T = TypeVar("T")


class WireError(ValueError):
    """An incoming message does not describe a valid core message."""


def _enum_prefix(enum_name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum_name).upper()


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); anything else -> (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def to_proto(obj: Any, proto_cls: type[ProtoMessage]) -> ProtoMessage:
    """Builds `proto_cls` from the dataclass instance `obj`."""
    out = proto_cls()
    _fill(out, obj)
    return out


def _fill(out: ProtoMessage, obj: Any) -> None:
    fields_by_name = out.DESCRIPTOR.fields_by_name
    for f in dataclasses.fields(obj):
        if f.name not in fields_by_name:
            raise WireError(f"{type(obj).__name__}.{f.name} has no field in {out.DESCRIPTOR.full_name}")
        value = getattr(obj, f.name)
        fd = fields_by_name[f.name]
        if value is None:
            continue
        if _is_map(fd):
            getattr(out, f.name).update(dict(value))
        elif fd.is_repeated:
            target = getattr(out, f.name)
            for item in value:
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(target.add(), item)
                else:
                    target.append(_scalar_out(item, fd))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            _fill(getattr(out, f.name), value)
        else:
            setattr(out, f.name, _scalar_out(value, fd))


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry


def _scalar_out(value: Any, fd: FieldDescriptor) -> Any:
    if isinstance(value, enum.Enum):
        full = f"{_enum_prefix(fd.enum_type.name)}_{value.name}"
        return fd.enum_type.values_by_name[full].number
    return value


def from_proto(msg: ProtoMessage, cls: type[T]) -> T:
    """Builds the dataclass `cls` from `msg`; raises WireError when a value is not acceptable."""
    hints = _hints(cls)
    fields_by_name = msg.DESCRIPTOR.fields_by_name
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        fd = fields_by_name.get(f.name)
        if fd is None:
            raise WireError(f"{msg.DESCRIPTOR.full_name} has no field {f.name}")
        tp, optional = _strip_optional(hints[f.name])
        value = getattr(msg, f.name)
        if _is_map(fd):
            kwargs[f.name] = tuple(sorted(value.items()))
        elif fd.is_repeated:
            (item_tp, _ellipsis) = typing.get_args(tp)
            kwargs[f.name] = tuple(_value_in(v, item_tp, fd) for v in value)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            if optional and not msg.HasField(f.name):
                kwargs[f.name] = None
            else:
                kwargs[f.name] = from_proto(value, tp)
        else:
            kwargs[f.name] = _value_in(value, tp, fd)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise WireError(f"invalid {msg.DESCRIPTOR.full_name}: {err}") from err


def _value_in(value: Any, tp: Any, fd: FieldDescriptor) -> Any:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return from_proto(value, tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        name = fd.enum_type.values_by_number.get(value)
        prefix = _enum_prefix(fd.enum_type.name) + "_"
        member = name.name[len(prefix):] if name is not None else None
        if member is None or member not in tp.__members__:
            raise WireError(f"{fd.full_name}: enum value {value} is not one of {', '.join(tp.__members__)}")
        return tp[member]
    return value
