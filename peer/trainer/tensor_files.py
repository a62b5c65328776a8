"""Weight dicts handed between the node and its trainer as safetensors files (usually in /dev/shm).

The node (process.py) and the worker (worker.py) both read and write them; `map_state` lets the
exchange encode a pseudo-gradient where it lies (docs/decisions/exchange-pseudo-gradient-handoff.md).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def write_state(path: str | Path, state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> Path:
    """Write a weight dict as safetensors, atomically: a reader sees the old file or the whole new one.
    `dtype`: every tensor cast to it first, where it is (a pseudo-gradient in the wire dtype; the
    trainer computes Δ on the CPU). safetensors packs tensors of one dtype sorted by name, which is
    the exchange's wire layout (map_state).

    No fsync: these files hand tensors between two live processes (usually in /dev/shm, RAM);
    durability across crashes is the checkpoint's job (checkpoint.py).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        save_file({n: t.detach().to(dtype or t.dtype).to("cpu").contiguous() for n, t in state.items()}, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a weight dict written by `write_state` (CPU tensors)."""
    return load_file(Path(path))


# safetensors' dtype names (its header) -> torch dtypes.
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def map_state(path: str | Path) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The tensors of a file `write_state` wrote, as views into one private mapping of it, and that
    mapping's data bytes (uint8): nothing is read until touched, and a pseudo-gradient handed over
    in the wire layout is encoded where it lies (codec.encode's `out`). Writes stay in this process
    (copy on write): the file is unchanged. ValueError says what is wrong with a damaged file."""
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ValueError(f"{path}: {size} bytes, too short for a safetensors file; the trainer writes whole files")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    raw = torch.frombuffer(mapped, dtype=torch.uint8)
    header_bytes = int.from_bytes(mapped[:8], "little")
    if not 2 <= header_bytes <= size - 8:
        raise ValueError(f"{path}: header of {header_bytes} bytes in a {size}-byte file; not a safetensors file")
    try:
        header = json.loads(mapped[8 : 8 + header_bytes])
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"{path}: the safetensors header is not JSON ({err!r})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is a JSON {type(header).__name__}, not an object")
    data = raw[8 + header_bytes :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            start, end = (int(x) for x in entry["data_offsets"])
            if min(shape, default=0) < 0:
                raise ValueError("a negative dimension")
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: tensor {name!r} has a bad header entry {entry!r} ({err!r})") from None
        nbytes = math.prod(shape) * dtype.itemsize
        if not 0 <= start <= end <= data.numel() or end - start != nbytes:
            raise ValueError(f"{path}: tensor {name!r} at bytes [{start}, {end}) of {data.numel()} does not hold "
                             f"{shape} {entry['dtype']}; the file is damaged")
        if (8 + header_bytes + start) % dtype.itemsize:
            raise ValueError(f"{path}: tensor {name!r} is not aligned to its {dtype.itemsize}-byte elements; "
                             "not a file write_state wrote")
        tensors[name] = data[start:end].view(dtype).view(shape)
    return tensors, data
