#!/usr/bin/python3
"""A small safetensors reader and writer built on torch alone (no `safetensors` package needed).

File layout (https://github.com/huggingface/safetensors, "Format"):
  * 8 bytes: little-endian unsigned 64-bit length n of the header;
  * n bytes: UTF-8 JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...} plus an
    optional "__metadata__": {str: str}; offsets are relative to the start of the data section;
  * the data section: each tensor's bytes, little-endian, C order.

Supported dtypes: F64, F32, F16, BF16, I64, I32. Writing goes to a temporary file in the target's
directory, then renames it over the target, so a crash never leaves a half-written file.
"""

import json
import os
import struct
import sys
import tempfile

import torch

# safetensors dtype name -> (torch dtype, bytes per element, integer dtype of the same width used
# to reinterpret raw bytes for dtypes torch.frombuffer cannot read directly).
_DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
}
_NAMES = {dtype: name for name, (dtype, _) in _DTYPES.items()}

if sys.byteorder != "little":
    raise RuntimeError("[safetensors_lite] only little-endian hosts are supported")


class SafetensorsError(ValueError):
    """A malformed file or an unsupported tensor."""


def _tensor_from_bytes(raw, dtype_name, shape, name):
    dtype, width = _DTYPES[dtype_name]
    count = 1
    for extent in shape:
        count *= extent
    if len(raw) != count * width:
        raise SafetensorsError(
            f"[safetensors_lite] tensor {name!r} must hold {count * width} bytes for shape {shape} "
            f"{dtype_name}, got {len(raw)}")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    buffer = bytearray(raw)  # writable, so frombuffer gives a tensor that owns no read-only memory
    if dtype == torch.bfloat16:
        # torch.frombuffer has no bfloat16 path in every release: read the 16-bit words, then
        # reinterpret them.
        flat = torch.frombuffer(buffer, dtype=torch.int16).view(torch.bfloat16)
    else:
        flat = torch.frombuffer(buffer, dtype=dtype)
    return flat.reshape(shape).clone()


def load_file(path):
    """Reads every tensor of a safetensors file.

    Returns (tensors, metadata): a dict name -> CPU tensor (owned copies) and the "__metadata__"
    dict ({} when absent). Raises SafetensorsError naming the problem for a malformed file.
    """
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < 8:
        raise SafetensorsError(f"[safetensors_lite] {path}: file must be at least 8 bytes, got {len(data)}")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise SafetensorsError(
            f"[safetensors_lite] {path}: header length must be <= {len(data) - 8} (file size - 8), "
            f"got {header_len}")
    try:
        header = json.loads(data[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsError(f"[safetensors_lite] {path}: header is not valid JSON: {error}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"[safetensors_lite] {path}: header must be a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    payload = memoryview(data)[8 + header_len:]
    tensors = {}
    for name, entry in header.items():
        dtype_name = entry.get("dtype")
        if dtype_name not in _DTYPES:
            raise SafetensorsError(
                f"[safetensors_lite] {path}: tensor {name!r} dtype must be one of "
                f"{sorted(_DTYPES)}, got {dtype_name!r}")
        shape = [int(extent) for extent in entry.get("shape", [])]
        begin, end = (int(offset) for offset in entry.get("data_offsets", [0, -1]))
        if not 0 <= begin <= end <= len(payload):
            raise SafetensorsError(
                f"[safetensors_lite] {path}: tensor {name!r} data_offsets must lie in [0, {len(payload)}], "
                f"got [{begin}, {end}]")
        tensors[name] = _tensor_from_bytes(payload[begin:end], dtype_name, shape, name)
    return tensors, metadata


def _tensor_bytes(tensor):
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().tobytes() if tensor.numel() else b""


def save_file(tensors, path, metadata=None):
    """Writes `tensors` (dict name -> tensor of a supported dtype) to `path`, names sorted, with
    optional string metadata. Atomic: temporary file in the same directory, then rename."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(key): str(value) for key, value in metadata.items()}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.dtype not in _NAMES:
            raise SafetensorsError(
                f"[safetensors_lite] tensor {name!r} dtype must be one of "
                f"{sorted(str(d) for d in _NAMES)}, got {tensor.dtype}")
        raw = _tensor_bytes(tensor)
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # keeps the data section 8-byte aligned
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".safetensors-", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(struct.pack("<Q", len(encoded)))
            out.write(encoded)
            for raw in chunks:
                out.write(raw)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
