"""The host side of a v2 kernel directory's ops on one NPU: `OpKernel` (an op's kernel, an
instruction buffer per shape, launches) and `LinearOps` (the linear layers on `gemv` /
`gemm`: weights packed once at load, activations as bf16 through reused buffers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from npu.engine.quant import QT
from npu.xrt import packing
from npu.xrt.adapter import XRT, XRTError
from npu.xrt.manifest import SCALARS, Op, Shape


# columns of a whole array per generation directory: a stream for more cannot be this NPU's
COLUMNS = {"npu1": 4, "npu2": 8}


def check_header(words: np.ndarray, generation: str, where: str) -> None:
    """An instruction stream's 4-word header against its file and generation, as
    FastFlowLM's npu_sequence reads it (and mlir-aie's AIETargetNPU writes it): word 0 holds
    the version, a device-generation code and the rows, word 1 the columns (bits 0-7) and
    memory-tile rows, word 2 the command count, word 3 the stream's size in bytes. The
    generation code is not checked: mlir-aie writes 3 for every device, FastFlowLM 1 / 4."""
    if words.size < 4:
        raise XRTError(f"{where}: {words.size * 4} bytes is shorter than a stream's header")
    if int(words[3]) != words.nbytes:
        raise XRTError(f"{where}: its header gives {int(words[3])} bytes, the file holds "
                       f"{words.nbytes} (a truncated or mis-built stream)")
    columns = int(words[1]) & 0xFF
    if not 0 < columns <= COLUMNS.get(generation, 8):
        raise XRTError(f"{where}: built for {columns} columns; {generation} has "
                       f"{COLUMNS.get(generation, 8)}")


class OpKernel:
    """One op of a manifest, opened on a device: its hardware context and kernel(s), buffers
    by argument. `bin`: one kernel, each shape's instruction stream uploaded once; `elf`: one
    kernel (instruction sequence) per shape, buffers from argument 0."""

    def __init__(self, xrt: XRT, index: int, folder: Path, name: str, op: Op) -> None:
        self.xrt, self.index, self.name, self.op = xrt, index, name, op
        self.elf = op.instr_format == "elf"
        self._instr: dict[Shape, tuple[Any, int]] = {}
        self._words: dict[Shape, np.ndarray] = {}
        self._kernels: dict[Shape, Any] = {}
        if self.elf:
            self.ctx = xrt.elf_context(index, folder / op.elf)
            for s in op.shapes:
                self._kernels[s] = xrt.elf_kernel(self.ctx, s.sequence)
            self.kernel = next(iter(self._kernels.values()))
            self.groups = {arg: self.kernel.group_id(i) for i, arg in enumerate(op.args)}
            return
        self.ctx, xb = xrt.hw_context(index, folder / op.xclbin)
        self.kernel = xrt.kernel(self.ctx, xb, op.kernel, buffers=len(op.args))
        self.groups = {arg: self.kernel.group_id(3 + i) for i, arg in enumerate(op.args)}
        for s in op.shapes:
            try:
                words = np.fromfile(folder / s.insts, dtype=np.uint32)
            except OSError as exc:
                raise XRTError(f"{folder}: op {name}: cannot read {s.insts}: {exc}") from None
            check_header(words, Path(folder).name, f"{folder}: op {name}: {s.insts}")
            bo = xrt.bo(index, words.nbytes, xrt.x.bo.cacheable, self.kernel.group_id(1))
            xrt.to_device(bo, words)
            self._words[s] = words
            if any(not 0 <= i < words.size for i in s.scalar_words):
                raise XRTError(f"{folder}: op {name}: scalar_words {s.scalar_words} fall "
                               f"outside {s.insts} ({words.size} words)")
            count = words.size if op.instr_length == "words" else words.nbytes
            self._instr[s] = (bo, count)

    def find(self, **dims: Any) -> Shape | None:
        for s in self.op.shapes:
            if all(getattr(s, k) == v for k, v in dims.items()):
                return s
        return None

    def set_scalars(self, shape: Shape, **values: int) -> None:
        """Write this launch's scalars into the shape's instruction stream (op scalars
        "insts"): its words at `scalar_words`, the stream synced again."""
        words = self._words[shape].copy()
        for key, value in values.items():
            words[shape.scalar_words[SCALARS.index(key)]] = value
        self.xrt.to_device(self._instr[shape][0], words)

    def bo(self, arg: str, nbytes: int) -> Any:
        return self.xrt.bo(self.index, nbytes, self.xrt.x.bo.host_only, self.groups[arg])

    def call(self, shape: Shape, bufs: dict[str, Any]) -> tuple[Any, tuple]:
        """(kernel, its arguments) for a launch of `shape` on `bufs`."""
        buffers = tuple(bufs[a] for a in self.op.args)
        if self.elf:
            return self._kernels[shape], buffers
        bo, count = self._instr[shape]
        return self.kernel, (3, bo, count, *buffers)

    def launch(self, shape: Shape, bufs: dict[str, Any]) -> None:
        kernel, args = self.call(shape, bufs)
        if self.elf:
            self.xrt.run_built(kernel, *args)
        else:
            self.xrt.run(kernel, *args)


class DeviceWeight(msgspec.Struct):
    bo: Any
    tiling: packing.Tiling


def pack_weight(linear: Any, t: packing.Tiling) -> tuple[np.ndarray, bool]:
    """A linear layer's weight packed for a kernel; True when it was re-quantised (its
    format is not the kernel's: only Q4_1 -> q4g32 carries over exactly, codes and all)."""
    matrix = linear.blocks() if hasattr(linear, "blocks") else None
    if matrix is not None and matrix.qtype == QT.Q4_1 and t.layout == "q4g32.v1":
        return packing.from_q4_1(matrix.data, matrix.shape, t), False
    w = linear.dequantize() if hasattr(linear, "dequantize") else np.asarray(linear)
    return packing.pack(w, t), True


class LinearOps:
    """y = x @ W.T on the NPU: one row on `gemv`, many on `gemm` (M rows a launch) when the
    directory has it, else row by row. Counts bytes each way and launches."""

    def __init__(self, gemv: OpKernel, gemm: OpKernel | None) -> None:
        if gemm is not None and (gemm.op.layout != gemv.op.layout or any(
                gemm.op.granule[d] != gemv.op.granule[d] for d in ("k", "n"))
                or gemm.op.mmul != gemv.op.mmul):
            raise XRTError("gemm and gemv must share the weight layout and K / N granules "
                           "(each weight is on the device once, for both)")
        self.gemv, self.gemm = gemv, gemm
        self.layout = gemv.op.layout
        self.tk, self.tn = gemv.op.granule["k"], gemv.op.granule["n"]
        self._bufs: dict[tuple, tuple[Any, Any]] = {}
        self.bytes_in = self.bytes_out = self.runs = self.weight_bytes = 0
        self.requantized = 0

    def missing(self, shapes: list[tuple[int, int]]) -> list[str]:
        out = [f"gemv 1x{k}x{n}" for n, k in shapes if self.gemv.find(m=1, k=k, n=n) is None]
        if self.gemm is not None:
            m = self.gemm.op.shapes[0].m
            out += [f"gemm {m}x{k}x{n}" for n, k in shapes
                    if self.gemm.find(m=m, k=k, n=n) is None]
        return out

    def upload(self, linear: Any) -> DeviceWeight:
        n, k = linear.shape
        t = packing.tiling(self.layout, n, k, self.tn, self.tk, mmul=self.gemv.op.mmul)
        data, requantized = pack_weight(linear, t)
        self.requantized += requantized
        xrt = self.gemv.xrt
        bo = xrt.bo(self.gemv.index, t.nbytes, xrt.x.bo.host_only, self.gemv.groups["w"])
        xrt.to_device(bo, data)
        self.weight_bytes += t.nbytes
        return DeviceWeight(bo=bo, tiling=t)

    def _io(self, op: OpKernel, shape: Shape, t: packing.Tiling, mp: int) -> tuple[Any, Any]:
        key = (op.name, shape)
        have = self._bufs.get(key)
        if have is None:
            ysize = 2 if op.op.dtype["y"] == "bf16" else 4
            have = (op.bo("x", mp * t.kp * 2), op.bo("y", mp * t.np_ * ysize))
            self._bufs[key] = have
        return have

    def matmul(self, x: np.ndarray, w: DeviceWeight) -> np.ndarray:
        """x [M, K] float32 -> [M, N] float32."""
        t = w.tiling
        out = np.empty((len(x), t.n), dtype=np.float32)
        if len(x) > 1 and self.gemm is not None:
            op = self.gemm
            shape = op.find(k=t.k, n=t.n)
            step = shape.m
        else:
            op, shape, step = self.gemv, self.gemv.find(m=1, k=t.k, n=t.n), 1
        if shape is None:
            raise XRTError(f"op {op.name} has no shape for K={t.k} N={t.n}")
        mp = -(-shape.m // op.op.granule.get("m", 1)) * op.op.granule.get("m", 1)
        x_bo, y_bo = self._io(op, shape, t, mp)
        y_bf16 = op.op.dtype["y"] == "bf16"
        xrt = op.xrt
        for start in range(0, len(x), step):
            rows = x[start : start + step]
            a = np.zeros((len(rows), t.kp), dtype=np.uint16)
            a[:, : t.k] = packing.to_bf16(rows)
            # only the real rows cross; the kernel's other rows are undefined and dropped
            xrt.to_device(x_bo, a)
            op.launch(shape, {"x": x_bo, "w": w.bo, "y": y_bo})
            nbytes = len(rows) * t.np_ * (2 if y_bf16 else 4)
            raw = xrt.from_device(y_bo, nbytes)
            y = (packing.from_bf16(raw.view(np.uint16)) if y_bf16 else raw.view(np.float32))
            out[start : start + len(rows)] = y.reshape(len(rows), t.np_)[:, : t.n]
            self.bytes_in += a.nbytes
            self.bytes_out += nbytes
            self.runs += 1
        return out
