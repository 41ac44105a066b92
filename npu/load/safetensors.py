"""load_weights: the tensors of a model directory's safetensors files, as float32 numpy.

Reads the safetensors format directly (8-byte header length, JSON header, raw data) from a
memory map, so it handles fp32, fp16 and bf16 (read as uint16 and shifted into float32;
numpy has no bfloat16), single files and sharded ones with their index.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from npu.errors import ModelError
from npu.load.progress import Progress

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise ModelError(f"{index}: not a safetensors index ({exc})") from None
        files = sorted({folder / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise ModelError(f"{index} names shard(s) that are missing: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder}: no *.safetensors weights found")
    return files


def _header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ModelError(f"{path}: too short to be a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > 100_000_000:
            raise ModelError(f"{path}: not a safetensors file (header of {size} bytes)")
        try:
            header = json.loads(f.read(size))
        except ValueError:
            raise ModelError(f"{path}: corrupt safetensors header") from None
    header.pop("__metadata__", None)
    return header, 8 + size


def iter_tensors(folder: Path) -> Iterator[tuple[str, np.ndarray, str]]:
    """Yield (name, float32 array, stored dtype) for every tensor, one at a time (converted
    copies)."""
    for path in safetensors_files(folder):
        header, offset = _header(path)
        data = np.memmap(path, dtype=np.uint8, mode="r")
        for name, info in header.items():
            dtype = _DTYPES.get(info["dtype"])
            if dtype is None:
                raise ModelError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
            start, end = info["data_offsets"]
            raw = data[offset + start : offset + end].view(dtype).reshape(info["shape"])
            if info["dtype"] == "BF16":
                arr = (np.array(raw, dtype=np.uint32) << 16).view(np.float32)
            else:
                arr = np.array(raw, dtype=np.float32)
            yield name, arr, info["dtype"]
        del data


def load_weights(folder: Path, *, keep: Callable[[str, np.ndarray, str], Any] | None = None,
                 progress: bool = True) -> dict[str, Any]:
    """All tensors as float32; `keep(name, array, stored dtype)` may transform each as it
    arrives (into a block format: one tensor is float32 at a time).

    Progress is shown on stderr when loading takes longer than a second (npu.load.progress).
    """
    files = safetensors_files(folder)
    total = sum(f.stat().st_size for f in files)
    bar = Progress(folder.name, total) if progress else None
    out: dict[str, np.ndarray] = {}
    for name, arr, dtype in iter_tensors(folder):
        out[name] = keep(name, arr, dtype) if keep else arr
        if bar:
            bar.add(arr.size * 2)  # about the bytes read (bf16/fp16 checkpoints dominate)
    if bar:
        bar.end()
    return out
