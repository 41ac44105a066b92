"""The host side of a v2 kernel directory's ops on one NPU: `OpKernel` (an op's kernel, an
instruction buffer per shape, launches) and `LinearOps` (the linear layers on `gemv` /
`gemm`: weights packed once at load, activations as bf16 through reused buffers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from npu.engine.quant import QT
from npu.xrt import packing, scratchpad
from npu.xrt.adapter import XRT, Prepare, XRTError
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
        self._contexts: dict[Shape, Any] = {}
        if self.elf:
            self.ctx = xrt.elf_context(index, folder / op.elf)
            for s in op.shapes:
                self._kernels[s] = xrt.elf_kernel(self.ctx, s.sequence)
                self._contexts[s] = self.ctx
            self.kernel = next(iter(self._kernels.values()))
            self.groups = {arg: self.kernel.group_id(i) for i, arg in enumerate(op.args)}
            if op.scalars == "scratchpad":
                self.params = scratchpad.load_params(folder / op.params)
                missing = [sym for sym in self._symbols() if sym not in self.params]
                if missing:
                    raise XRTError(f"{folder}: op {name}: {op.params} has no parameter "
                                   f"{', '.join(missing)} (it has {', '.join(self.params)})")
                for kernel in self._kernels.values():  # each sequence has its scratchpad
                    xrt.scratchpad_run(kernel)
            return
        # one kernel per xclbin: the op's, or a shape's own (a kernel compiled per shape)
        binaries: dict[tuple[str, str], tuple[Any, Any]] = {}
        for s in op.shapes:
            key = (s.xclbin or op.xclbin, s.kernel or op.kernel)
            if key not in binaries:
                ctx, xb = xrt.hw_context(index, folder / key[0])
                binaries[key] = (ctx, xrt.kernel(ctx, xb, key[1], buffers=len(op.args)))
            self._contexts[s], self._kernels[s] = binaries[key]
        self.ctx, self.kernel = next(iter(binaries.values()))
        self.groups = {arg: self.kernel.group_id(3 + i) for i, arg in enumerate(op.args)}
        for s in op.shapes:
            try:
                words = np.fromfile(folder / s.insts, dtype=np.uint32)
            except OSError as exc:
                raise XRTError(f"{folder}: op {name}: cannot read {s.insts}: {exc}") from None
            check_header(words, Path(folder).name, f"{folder}: op {name}: {s.insts}")
            bo = xrt.bo(index, words.nbytes, xrt.x.bo.cacheable,
                        self._kernels[s].group_id(1))
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

    def context(self, shape: Shape) -> Any:
        """The hardware context the shape's kernel runs in."""
        return self._contexts[shape]

    def set_scalars(self, shape: Shape, **values: int) -> None:
        """Write this launch's scalars into the shape's instruction stream (op scalars
        "insts"): its words at `scalar_words`, the stream synced again."""
        words = self._words[shape].copy()
        for key, value in values.items():
            words[shape.scalar_words[SCALARS.index(key)]] = value
        self.xrt.to_device(self._instr[shape][0], words)

    def bo(self, arg: str, nbytes: int) -> Any:
        return self.xrt.bo(self.index, nbytes, self.xrt.x.bo.host_only, self.groups[arg])

    def _symbols(self) -> list[str]:
        return [self.op.scalar_symbols.get(k, k) for k in SCALARS]

    def call(self, shape: Shape, bufs: dict[str, Any], **scalars: int
             ) -> tuple[Any, tuple, Prepare | None]:
        """(kernel, its arguments, what to do to its run before it starts) for a launch of
        `shape` on `bufs`; op scalars "scratchpad": `scalars` written into the run's
        control scratchpad (the others take them elsewhere, or none)."""
        buffers = tuple(bufs[a] for a in self.op.args)
        if self.elf:
            prepare = None
            if self.op.scalars == "scratchpad":
                values = {sym: scalars[k] for k, sym in zip(SCALARS, self._symbols())}
                prepare = self._scratchpad_writer(values)
            return self._kernels[shape], buffers, prepare
        bo, count = self._instr[shape]
        return self._kernels[shape], (3, bo, count, *buffers), None

    def _scratchpad_writer(self, values: dict[str, int]) -> Prepare:
        def prepare(run: Any) -> None:
            pad = scratchpad.Scratchpad(self.params)  # a new run handle's: from zero
            for sym, value in values.items():
                pad.write(sym, value)
            scratchpad.sync(self.xrt, self.xrt.ctrl_scratchpad(run), pad)

        return prepare

    def launch(self, shape: Shape, bufs: dict[str, Any], **scalars: int) -> None:
        kernel, args, prepare = self.call(shape, bufs, **scalars)
        if self.elf:
            self.xrt.run_built(kernel, *args, prepare=prepare)
        else:
            self.xrt.run(kernel, *args)


class DeviceWeight(msgspec.Struct):
    bo: Any  # in the gemv kernel's memory group for its w argument
    tiling: packing.Tiling
    # by memory group: the same bytes in the gemm kernel's group where that differs (a
    # design may take w at another argument: IRON's GEMV as A, its GEMM as B)
    bos: dict[int, Any] = {}


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
                or gemm.op.mmul != gemv.op.mmul or (gemv.op.layout in packing.IRON_B
                                                    and gemm.op.rounding != gemv.op.rounding)):
            raise XRTError("gemm and gemv must share the weight layout, its geometry and "
                           "rounding and the K / N granules (each weight is on the device "
                           "once, for both)")
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
        t = packing.tiling(self.layout, n, k, self.tn, self.tk, mmul=self.gemv.op.mmul,
                           rounding=self.gemv.op.rounding)
        data, requantized = pack_weight(linear, t)
        self.requantized += requantized
        xrt = self.gemv.xrt
        bos = {}
        for op in (self.gemv, self.gemm) if self.gemm is not None else (self.gemv,):
            group = op.groups["w"]
            if group not in bos:
                bos[group] = xrt.bo(self.gemv.index, t.nbytes, xrt.x.bo.host_only, group)
                xrt.to_device(bos[group], data)
                self.weight_bytes += t.nbytes
        return DeviceWeight(bo=bos[self.gemv.groups["w"]], tiling=t, bos=bos)

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
            op.launch(shape, {"x": x_bo, "w": w.bos.get(op.groups["w"], w.bo), "y": y_bo})
            nbytes = len(rows) * t.np_ * (2 if y_bf16 else 4)
            raw = xrt.from_device(y_bo, nbytes)
            y = (packing.from_bf16(raw.view(np.uint16)) if y_bf16 else raw.view(np.float32))
            out[start : start + len(rows)] = y.reshape(len(rows), t.np_)[:, : t.n]
            self.bytes_in += a.nbytes
            self.bytes_out += nbytes
            self.runs += 1
        return out
