"""Conversion between protocol-core dataclasses and their protobuf messages, in one place.

The cores (peer/core/membership.py, ...) define frozen dataclasses whose field names are the proto
field names, so conversion is structural: a nested dataclass is a sub-message, a tuple of
dataclasses a repeated message, an Enum the proto enum value `<ENUM_NAME_IN_SNAKE_CAPS>_<MEMBER>`,
a `tuple[tuple[str, str], ...]` a proto map (or, for a repeated message, one message per tuple
with its fields in declaration order), and a field typed as a union of dataclasses a `oneof` of
the same name whose member is chosen by message type name. Anything that does not fit raises `WireError`,
which servicers turn into INVALID_ARGUMENT: a malformed message is refused, never half-applied.

Decoding is also where hostile values stop (docs/decisions/security-bounds.md), so the cores never
see them: a counter beyond `MAX_COUNTER` (an epoch, incarnation, round, index or sequence number no
honest peer reaches, and one that could not be incremented without overflowing uint64; identifiers
such as block ids use all 64 bits and are not bounded), a non-finite float,
a string longer than `MAX_STRING`, a signature or certificate longer than `MAX_BYTES` says, or
more than `MAX_MEMBERS` members, rumours or voters in one message.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import re
import types
import typing
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

T = TypeVar("T")

MAX_COUNTER = 2**62
"""Largest integer accepted from the wire. Honest counters grow by one per event (a year of one
election a second is 2^25); refusing the top of uint64 keeps `+ 1` in range everywhere."""
MAX_STRING = 1024
"""Longest string accepted: site names (63), host:port addresses, reasons."""
MAX_MEMBERS = 256
"""Most members, rumours or voters one message may list: far above any real run's site count."""
MAX_BYTES = {"signature": 256, "certificate": 4096}
"""Longest bytes field of these names accepted (a voucher's ECDSA P-256 signature is at most 72
bytes in DER, a site certificate of `ops certs` about 600): a hostile peer cannot make the leader
parse megabytes per voucher."""
_MEMBER_LISTS = frozenset({"members", "updates", "voters"})
_COUNTERS = frozenset({"epoch", "incarnation", "round", "index", "seq"})


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
        value = getattr(obj, f.name)
        if value is None:
            continue
        fd = fields_by_name.get(f.name) or _oneof_member(out, f.name, type(value).__name__)
        if _is_map(fd):
            getattr(out, f.name).update(dict(value))
        elif fd.is_repeated:
            target = getattr(out, f.name)
            for item in value:
                if fd.type == FieldDescriptor.TYPE_MESSAGE and isinstance(item, tuple):
                    _fill_positional(target.add(), item)
                elif fd.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(target.add(), item)
                else:
                    target.append(_scalar_out(item, fd))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            _fill(getattr(out, fd.name), value)
        else:
            setattr(out, f.name, _scalar_out(value, fd))


def _oneof_member(out: ProtoMessage, name: str, type_name: str) -> FieldDescriptor:
    oneof = out.DESCRIPTOR.oneofs_by_name.get(name)
    if oneof is None:
        raise WireError(f"{out.DESCRIPTOR.full_name} has no field {name}")
    for fd in oneof.fields:
        if fd.message_type is not None and fd.message_type.name == type_name:
            return fd
    raise WireError(f"{out.DESCRIPTOR.full_name}.{name} has no member of type {type_name}")


def _fill_positional(out: ProtoMessage, values: tuple[Any, ...]) -> None:
    fds = out.DESCRIPTOR.fields
    if len(values) != len(fds):
        raise WireError(f"{out.DESCRIPTOR.full_name} needs {len(fds)} values, got {len(values)}")
    for fd, value in zip(fds, values):
        setattr(out, fd.name, _scalar_out(value, fd))


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
            kwargs[f.name] = _oneof_in(msg, f.name, hints[f.name])
            continue
        tp, optional = _strip_optional(hints[f.name])
        value = getattr(msg, f.name)
        if _is_map(fd):
            if len(value) > MAX_MEMBERS:
                raise WireError(f"{fd.full_name}: {len(value)} entries, at most {MAX_MEMBERS} accepted")
            entry = fd.message_type.fields_by_name
            kwargs[f.name] = tuple(sorted((_bounded(k, entry["key"]), _bounded(v, entry["value"]))
                                          for k, v in value.items()))
        elif fd.is_repeated:
            if f.name in _MEMBER_LISTS and len(value) > MAX_MEMBERS:
                raise WireError(f"{fd.full_name}: {len(value)} items, at most {MAX_MEMBERS} accepted")
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


def _oneof_in(msg: ProtoMessage, name: str, tp: Any) -> Any:
    if name not in msg.DESCRIPTOR.oneofs_by_name:
        raise WireError(f"{msg.DESCRIPTOR.full_name} has no field {name}")
    which = msg.WhichOneof(name)
    if which is None:
        raise WireError(f"{msg.DESCRIPTOR.full_name}.{name} is not set")
    value = getattr(msg, which)
    for cls in typing.get_args(tp):
        if cls.__name__ == value.DESCRIPTOR.name:
            return from_proto(value, cls)
    raise WireError(f"{msg.DESCRIPTOR.full_name}.{name}: {value.DESCRIPTOR.name} is not expected here")


def _value_in(value: Any, tp: Any, fd: FieldDescriptor) -> Any:
    if fd.type == FieldDescriptor.TYPE_MESSAGE and typing.get_origin(tp) is tuple:
        return tuple(_bounded(getattr(value, item.name), item) for item in value.DESCRIPTOR.fields)
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return from_proto(value, tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        name = fd.enum_type.values_by_number.get(value)
        prefix = _enum_prefix(fd.enum_type.name) + "_"
        member = name.name[len(prefix):] if name is not None else None
        if member is None or member not in tp.__members__:
            raise WireError(f"{fd.full_name}: enum value {value} is not one of {', '.join(tp.__members__)}")
        return tp[member]
    return _bounded(value, fd)


def _is_counter(name: str) -> bool:
    """Fields that count events (epochs, incarnations, rounds, log indexes, sequence numbers), as
    opposed to identifiers such as 64-bit block ids, which use the whole range."""
    return name in _COUNTERS or name.endswith(("_epoch", "_round", "_index"))


def _bounded(value: Any, fd: FieldDescriptor) -> Any:
    """`value` if it is within the bounds any honest peer stays in, else WireError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and _is_counter(fd.name) and not -MAX_COUNTER <= value <= MAX_COUNTER:
        raise WireError(f"{fd.full_name} = {value} is beyond 2^62: no honest peer counts that far")
    if isinstance(value, float) and not math.isfinite(value):
        raise WireError(f"{fd.full_name} = {value} is not a finite number")
    if isinstance(value, str | bytes) and len(value) > MAX_STRING and fd.type == FieldDescriptor.TYPE_STRING:
        raise WireError(f"{fd.full_name} is {len(value)} characters long, at most {MAX_STRING} accepted")
    if isinstance(value, bytes) and len(value) > MAX_BYTES.get(fd.name, len(value)):
        raise WireError(f"{fd.full_name} is {len(value)} bytes long, at most {MAX_BYTES[fd.name]} accepted")
    return value
