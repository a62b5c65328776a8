"""The trainer's pseudo-gradient file, mapped by the node and encoded where it lies.

The worker writes Δ in the wire dtype for bf16/fp32 (config.HANDOFF_DTYPES); safetensors packs the
tensors sorted by name, which is the wire layout, so `map_state` hands the node views into one
mapping and `codec.encode` hashes and checks them in place instead of copying them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from peer.exchange import codec, decoding
from peer.trainer.tensor_files import map_state, write_state

SHAPES = {"model.layers.1.w": (300, 7), "model.embed.weight": (1000, 3), "b": (5,), "a.norm": (0,), "z": (2, 2, 2)}
CHUNK = 4096


class _Copies(TorchDispatchMode):
    """Counts the element copies torch runs (aten.copy_), to prove an encode made none."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten.copy_.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _delta(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def _encode(tensors: dict[str, torch.Tensor], out: torch.Tensor | None,
            wire: codec.WireDtype = codec.WireDtype.BF16) -> codec.Encoded:
    return codec.encode(tensors, round=4, site="s", tokens=9, chunk_size=CHUNK, out=out, wire=wire,
                        param_dtypes={n: torch.float32 for n in SHAPES})


@pytest.mark.parametrize("wire", [codec.WireDtype.BF16, codec.WireDtype.FP32])
def test_a_handed_over_pseudo_gradient_is_encoded_where_it_lies_without_a_copy(tmp_path: Path,
                                                                               wire: codec.WireDtype) -> None:
    delta = _delta()
    path = write_state(tmp_path / "pg.safetensors", {n: t.to(wire.torch_dtype) for n, t in delta.items()})
    tensors, data = map_state(path)
    for entry in codec.Layout.of(tensors, wire).tensors:  # safetensors' order and packing are the wire's
        assert entry.numel == 0 or tensors[entry.name].data_ptr() == data.data_ptr() + entry.offset
    assert codec.laid_out_in(tensors, data, wire)  # what the node asks before encoding in place
    copies = _Copies()
    with copies:
        in_place = _encode(tensors, data, wire)
    assert copies.count == 0
    assert in_place.data.data_ptr() == data.data_ptr()
    # The same object as converting the fp32 Δ into a buffer of its own, down to the root hash; the
    # layout names the parameters' dtype, not the handed-over one.
    with copies:
        converted = codec.encode(delta, round=4, site="s", tokens=9, chunk_size=CHUNK, wire=wire)
    assert copies.count > 0  # the counter sees copies where there are some
    assert in_place.manifest == converted.manifest
    assert {e.dtype for e in in_place.manifest.layout.tensors} == {"float32"}
    dest = {n: torch.empty(s) for n, s in SHAPES.items()}
    decoding.decode(in_place, dest)
    assert all(torch.equal(dest[n], delta[n].to(wire.torch_dtype).float()) for n in SHAPES)
    assert path.read_bytes().endswith(bytes(data.numpy()))  # the file itself is untouched


def test_a_source_inside_the_buffer_but_off_its_place_is_refused_before_anything_is_written() -> None:
    delta = {n: t.bfloat16() for n, t in _delta().items()}
    layout = codec.Layout.of(delta, codec.WireDtype.BF16)
    buffer = torch.zeros(layout.total_bytes + 2, dtype=torch.uint8)
    shifted = {}
    for e in layout.tensors:  # every tensor one element later than the layout puts it
        view = buffer[e.offset + 2 : e.offset + 2 + e.numel * 2].view(torch.bfloat16).view(e.shape)
        view.copy_(delta[e.name])
        shifted[e.name] = view
    before = buffer.clone()
    assert not codec.laid_out_in(shifted, buffer, codec.WireDtype.BF16)
    with pytest.raises(codec.LayoutMismatch, match="inside the encode buffer"):
        _encode(shifted, buffer)
    assert torch.equal(buffer, before)


def test_nan_in_a_handed_over_pseudo_gradient_is_refused(tmp_path: Path) -> None:
    delta = {n: t.bfloat16() for n, t in _delta().items()}
    delta["b"][3] = float("nan")
    tensors, data = map_state(write_state(tmp_path / "pg.safetensors", delta))
    with pytest.raises(codec.NonFiniteError, match=r"NaN or Inf in \['b'\]"):
        _encode(tensors, data)


def test_missing_parameter_dtype_is_a_layout_mismatch(tmp_path: Path) -> None:
    tensors, data = map_state(write_state(tmp_path / "pg.safetensors", {"w": torch.zeros(3).bfloat16()}))
    with pytest.raises(codec.LayoutMismatch, match="no parameter dtype"):
        codec.encode(tensors, round=1, site="s", tokens=1, out=data, param_dtypes={"other": torch.float32})


def _damaged(path: Path, how: str) -> None:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    if how == "truncated":
        path.write_bytes(raw[:-5])
    elif how == "short":
        path.write_bytes(raw[:5])
    elif how == "header length":
        path.write_bytes((len(raw) * 2).to_bytes(8, "little") + raw[8:])
    elif how == "not json":
        path.write_bytes(raw[:8] + b"{" * n + raw[8 + n :])
    elif how == "offsets":
        header["w"]["data_offsets"] = [0, 4]
        text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
        path.write_bytes(raw[:8] + text[:n] + raw[8 + n :])
    elif how in ("array", "nested"):
        text = (b"[]" if how == "array" else b"[" * 100_000).ljust(n)
        path.write_bytes(raw[:8] + text[:n] + raw[8 + n :] if how == "array" else
                         len(text).to_bytes(8, "little") + text + raw[8 + n :])
    elif how == "negative":
        header["w"]["shape"] = [-6, -4]
        text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
        path.write_bytes(raw[:8] + text[:n] + raw[8 + n :])
    elif how == "dtype":
        header["w"]["dtype"] = "Q7"
        text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
        path.write_bytes(raw[:8] + text[:n] + raw[8 + n :])


@pytest.mark.parametrize(("how", "says"), [
    ("truncated", "does not hold"), ("short", "too short"), ("header length", "not a safetensors file"),
    ("not json", "not JSON"), ("offsets", "does not hold"), ("dtype", "bad header entry"),
    ("array", "a JSON list, not an object"), ("nested", "not JSON"), ("negative", "negative dimension"),
])
def test_a_damaged_file_is_refused_with_what_is_wrong(tmp_path: Path, how: str, says: str) -> None:
    path = write_state(tmp_path / "pg.safetensors", {"w": torch.ones(6, 4).bfloat16(), "v": torch.ones(3)})
    _damaged(path, how)
    with pytest.raises(ValueError, match=says):
        map_state(path)


def test_a_file_not_in_the_wire_dtype_is_not_encoded_in_place(tmp_path: Path) -> None:
    # fp32 Δ for a bf16 wire (a worker that does not hand over in the wire dtype), or any Δ for int4:
    # the node converts into a buffer of its own instead.
    tensors, data = map_state(write_state(tmp_path / "pg.safetensors", _delta()))
    assert codec.laid_out_in(tensors, data, codec.WireDtype.FP32)
    assert not codec.laid_out_in(tensors, data, codec.WireDtype.BF16)
    assert not codec.laid_out_in(tensors, data, codec.WireDtype.INT4)
    assert not codec.laid_out_in(tensors, torch.empty_like(data), codec.WireDtype.FP32)


def test_a_tensor_at_its_place_in_another_dtype_is_not_in_place(tmp_path: Path) -> None:
    # One fp32 tensor lies at the bf16 layout's offset 0 too: only its dtype tells it apart.
    tensors, data = map_state(write_state(tmp_path / "pg.safetensors", {"w": torch.randn(64)}))
    assert not codec.laid_out_in(tensors, data, codec.WireDtype.BF16)
    before = data.clone()
    with pytest.raises(codec.LayoutMismatch, match="inside the encode buffer"):
        codec.encode(tensors, round=1, site="s", tokens=1, out=data)
    assert torch.equal(data, before)
