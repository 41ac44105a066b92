"""The kernels a v2 kernel directory describes, as simulator callables, and a writer of such
directories for tests and benchmarks.

Each kernel emulates what a real one does to numbers: activations arrive as bf16, weights are
decoded by the manifest's layout (q4g32 dequantised and rounded to bf16), products accumulate
in f32, the output is rounded to the declared dtype in the declared mode (after every K tile
when declared). And to shapes: a launch's shape is its instruction stream (a stream that is
not one of the op's, or buffers of another shape's sizes, fail); K padding must be zero; rows
of the activations the host did not sync this launch are undefined, and their outputs NaN.
Each returns the bytes it read, for the timing model.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from npu.config import ModelConfig
from npu.xrt import iron_pack, layer_pack, packing, scratchpad
from npu.xrt.layer_pack import LayerDims
from npu.xrt.manifest import ARGS, LAYER_OPS, SCALARS, Op, Shape, load_manifest
from npu.xrt.shapes import layer_dims, layer_support, linear_shapes
from npu.xrt.sim import Simulator, SimulatorError, write_xclbin

KERNEL_NAMES = {"gemv": "GEMV", "gemm": "GEMM", "attn": "ATTN", "mlp": "MLP", "layer": "LAYER"}


def _rows_synced(bo: Any, row_bytes: int, rows: int) -> np.ndarray:
    ok = np.zeros(rows, dtype=bool)
    for start, end in bo.synced:
        first = -(-start // row_bytes)
        last = min(rows, end // row_bytes)
        ok[first:last] = True
    return ok


def _shape_of(op: Op, streams: dict[bytes, Shape], instr: Any, n_instr: int
              ) -> tuple[Shape, dict[str, int]]:
    """The shape whose stream the launch runs, and the scalars set in it (op scalars
    "insts": its scalar words, which the stream's other words must match around)."""
    count = n_instr if op.instr_length == "words" else n_instr // 4
    words = np.frombuffer(bytes(instr.dev[: 4 * count]), dtype=np.uint32)
    exact = streams.get(words.tobytes())
    if exact is not None and not exact.scalar_words:
        return exact, {}
    for key, s in streams.items():
        if s.scalar_words and len(key) == words.nbytes:
            masked = words.copy()
            masked[list(s.scalar_words)] = 0
            if masked.tobytes() == key:
                return s, {k: int(words[i]) for k, i in zip(SCALARS, s.scalar_words)}
    raise SimulatorError("the instruction stream is not one this kernel was built for")


def _want(bo: Any, nbytes: int, what: str, shape: Shape) -> None:
    if bo.size() != nbytes:
        raise SimulatorError(f"{what} buffer holds {bo.size()} bytes; the instruction stream is "
                             f"for shape {_label(shape)}, which needs {nbytes}")


def _label(shape: Shape) -> str:
    return " ".join(f"{k}={v}" for k, v in msgspec.structs.asdict(shape).items()
                    if k not in ("insts", "sequence") and v)


class Decoded:
    """Weights decoded from device buffers, kept until their buffer is synced again (the
    simulator's speed: a kernel decodes its weights every launch, the simulator once)."""

    def __init__(self) -> None:
        self._cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self, bo: Any, offset: int, t: packing.Tiling, rounding: str) -> np.ndarray:
        version, table = self._cache.get(bo, (None, None))
        if version != bo.version:
            table = {}
            self._cache[bo] = (bo.version, table)
        key = (offset, t, rounding)
        if key not in table:
            table[key] = packing.unpack(bo.dev[offset : offset + t.nbytes], t, rounding)
        return table[key]

    def bfp16(self, bo: Any, t: packing.Tiling, rounding: str) -> np.ndarray:
        """A bf16 weight as the bfp16-emulated matmul sees it (blocks of 8 along K)."""
        version, table = self._cache.get(bo, (None, None))
        key = ("bfp16", t, rounding)
        if version != bo.version or key not in table:
            w = iron_pack.quantize_bfp16(self.get(bo, 0, t, rounding), rounding)
            self._cache[bo][1][key] = w
        return self._cache[bo][1][key]


def _bin(op: Op, streams: dict[bytes, Shape], compute):
    """An xclbin kernel: (opcode 3, instructions, their length, buffers); the launch's shape
    is the instruction stream's."""

    def run(opcode: int, instr: Any, n_instr: int, *bufs: Any) -> int:
        if opcode != 3:
            raise SimulatorError(f"unexpected opcode {opcode}")
        return compute(*_shape_of(op, streams, instr, n_instr), bufs)

    return run


def _elf(shape: Shape, compute, op: Op, params: dict[str, scratchpad.Param]):
    """One instruction sequence of a full ELF: buffers only, its shape fixed; its scalars
    (op scalars "scratchpad") what its cores read through the control scratchpad."""

    def run(*bufs: Any, ctrl: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        scalars = {}
        if params:
            raw, registers = ctrl
            scalars = {k: scratchpad.read_value(params[op.scalar_symbols.get(k, k)], raw,
                                                registers) for k in SCALARS}
        return compute(shape, scalars, bufs)

    return run


def linear_kernel(op: Op, decoded: Decoded):
    gm, gk, gn = op.granule.get("m", 1), op.granule["k"], op.granule["n"]
    layout, rounding = op.layout, op.rounding
    y_bf16 = op.dtype["y"] == "bf16"

    def run(s: Shape, scalars: dict[str, int], bufs: tuple) -> int:
        args = dict(zip(op.args, bufs))
        t = packing.tiling(layout, s.n, s.k, gn, gk, mmul=op.mmul, rounding=rounding)
        mp = -(-s.m // gm) * gm
        _want(args["w"], t.nbytes, "the weight", s)
        _want(args["x"], mp * t.kp * 2, "the x", s)
        _want(args["y"], mp * t.np_ * (2 if y_bf16 else 4), "the y", s)
        x = packing.from_bf16(args["x"].dev.view(np.uint16).reshape(mp, t.kp))
        defined = _rows_synced(args["x"], t.kp * 2, mp)
        if np.any(x[defined, s.k :] != 0):
            raise SimulatorError(f"the activations' K padding (columns {s.k}..{t.kp}) is "
                                 "not zero")
        w = decoded.get(args["w"], 0, t, rounding)
        if op.bfp16_mmul:  # the AIE2P bf16 matmul multiplies bfp16: both operands converted
            x = iron_pack.quantize_bfp16(x, rounding)
            if packing.DTYPE_OF_LAYOUT[layout] == "bf16":
                w = decoded.bfp16(args["w"], t, rounding)
        if op.round_per_k_tile:
            acc = np.zeros((mp, t.np_), dtype=np.float32)
            for k0 in range(0, t.kp, gk):
                acc = acc + x[:, k0 : k0 + gk] @ w[:, k0 : k0 + gk].T
                acc = packing.round_bf16(acc, rounding) if y_bf16 else acc
        else:
            acc = (x @ w.T).astype(np.float32)
        acc[~defined] = np.nan
        out = packing.to_bf16(acc, rounding) if y_bf16 else acc.astype(np.float32)
        args["y"].dev[: out.nbytes] = out.view(np.uint8).ravel()
        return t.nbytes + int(defined.sum()) * t.kp * 2 + out.nbytes

    return run


def layer_kernel(name: str, op: Op, decoded: Decoded):
    gk, gn = op.granule["k"], op.granule["n"]
    layout, rounding = op.layout, op.rounding
    x_bf16 = op.dtype["x"] == "bf16"

    def run(s: Shape, scalars: dict[str, int], bufs: tuple) -> int:
        d = LayerDims(hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads,
                      head_dim=s.head_dim, ffn=s.ffn, ctx=s.ctx, qk_norm=s.qk_norm, m=s.m)
        args = dict(zip(op.args, bufs))
        attn = layer_pack.attn_bytes(d, layout, gn, gk) if name != "mlp" else 0
        mlp = layer_pack.mlp_bytes(d, layout, gn, gk) if name != "attn" else 0
        _want(args["w"], attn + mlp, "the weight", s)
        _want(args["x"], d.m * d.hidden * (2 if x_bf16 else 4), "the x", s)
        xb = args["x"].dev
        x = (packing.from_bf16(xb.view(np.uint16)) if x_bf16 else xb.view(np.float32).copy())
        x = x.reshape(d.m, d.hidden)
        read = attn + mlp + 2 * xb.size
        if name != "mlp":
            _want(args["kv"], layer_pack.kv_bytes(d), "the kv", s)
            _want(args["kvnew"], layer_pack.kvnew_bytes(d), "the kvnew", s)
            if op.scalars in ("insts", "scratchpad"):  # set for this launch
                pos = scalars["pos"]
                if not pos < scalars["len"] <= pos + d.m:
                    raise SimulatorError(f"the stream's length {scalars['len']} does not "
                                         f"cover the launch's rows from position {pos}")
            else:
                _want(args["rtp"], 16, "the rtp", s)
                pos = int(args["rtp"].dev.view(np.int32)[0])
            if not 0 <= pos <= d.ctx - d.m:
                raise SimulatorError(f"positions {pos}..{pos + d.m - 1} are outside the device "
                                     f"KV cache ({d.ctx} tokens)")
            kv = args["kv"].dev.view(np.uint16).reshape(2, d.kv_heads, d.ctx, d.head_dim)
            kvnew = args["kvnew"].dev.view(np.uint16).reshape(d.m, 2, d.kv_heads, d.head_dim)
            layer_pack.run_attn(d, layout, gn, gk, rounding, args["w"].dev[:attn], x, kv, pos,
                                kvnew, lambda off, t: decoded.get(args["w"], off, t, rounding),
                                math=op.math)
            read += 2 * d.kv_heads * (pos + d.m) * d.head_dim * 2
        if name != "attn":
            layer_pack.run_mlp(d, layout, gn, gk, rounding, args["w"].dev[attn:], x,
                               lambda off, t: decoded.get(args["w"], attn + off, t, rounding),
                               math=op.math)
        out = packing.to_bf16(x, rounding) if x_bf16 else x.astype(np.float32)
        xb[:] = out.view(np.uint8).ravel()
        return read

    return run


def _binaries(op: Op) -> dict[tuple[str, str], list[Shape]]:
    """The op's shapes by (xclbin, kernel): the op's, or a shape's own."""
    out: dict[tuple[str, str], list[Shape]] = {}
    for s in op.shapes:
        out.setdefault((s.xclbin or op.xclbin, s.kernel or op.kernel), []).append(s)
    return out


def _streams(folder: Path, shapes: list[Shape]) -> dict[bytes, Shape]:
    """Each shape's stream, its scalar words (set per launch) zeroed."""
    out = {}
    for s in shapes:
        try:
            words = np.fromfile(folder / s.insts, dtype=np.uint32)
        except OSError:  # missing: the engine's upload names it, as on an NPU
            continue
        if any(not 0 <= i < words.size for i in s.scalar_words):
            continue  # the engine names that too
        words[list(s.scalar_words)] = 0
        out[words.tobytes()] = s
    return out


def _uuid(path: Path) -> str | None:
    """A simulator binary's uuid; None where it cannot be read (a kernel directory missing
    a file: opening it then fails in the engine, with its name, as pyxrt's xclbin would)."""
    try:
        return str(json.loads(path.read_text())["uuid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def simulator_for(kernel_dir: Path, devices: list[str], **kwargs: Any) -> Simulator:
    """A simulator with `devices` whose xclbins (from a kernel directory's generation
    sub-directories) run the kernels their manifests describe."""
    sim = Simulator(devices, **kwargs)
    decoded = Decoded()
    root = Path(kernel_dir)
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not (folder / "manifest.json").exists():
            continue
        manifest = load_manifest(folder)  # what the engine would refuse is refused here too
        for name, op in manifest.ops.items():
            compute = (layer_kernel(name, op, decoded) if name in LAYER_OPS
                       else linear_kernel(op, decoded))
            if op.instr_format == "elf":
                uuid = _uuid(folder / op.elf)
                if uuid is None:
                    continue
                params = (scratchpad.load_params(folder / op.params)
                          if op.scalars == "scratchpad" else {})
                words = max((p.index for p in params.values()), default=-1) + 1
                for s in op.shapes:
                    sim.register_kernel(uuid, s.sequence, len(op.args),
                                        _elf(s, compute, op, params), elf=True, gbps=op.gbps,
                                        scratchpad_words=words)
            else:  # one kernel per xclbin, running the streams of its own shapes
                for (xclbin, kernel), shapes in _binaries(op).items():
                    uuid = _uuid(folder / xclbin)
                    if uuid is None:
                        continue
                    sim.register_kernel(uuid, kernel, 3 + len(op.args),
                                        _bin(op, _streams(folder, shapes), compute),
                                        gbps=op.gbps)
    return sim


def make_kernel_dir(folder: Path, configs: Sequence[ModelConfig], *,
                    generations: Sequence[str] = ("npu2",), weights: str = "q4g32",
                    ops: Sequence[str] = ("gemv", "gemm", "attn", "mlp", "layer"),
                    gemm_m: int = 32, granule_k: int = 64, granule_n: int = 32,
                    ctx: int = 2048, y: str = "f32", rounding: str = "conv_even",
                    round_per_k_tile: bool = False, xclbins: str = "one",
                    instr_format: str = "bin", scalars: str = "rtp",
                    layout: str | None = None, mmul: Sequence[int] = (),
                    args: dict[str, Sequence[str]] | None = None, math: str = "exact",
                    overrides: dict[str, dict[str, Any]] | None = None) -> Path:
    """Write a simulator kernel directory built for the models `configs` (flm-tiny's:
    npu.load.tiny.tiny_config()):
    one sub-directory per generation with manifest.json, the xclbin(s) and one instruction
    stream per shape. `xclbins`: "one" puts every op in one xclbin (one hardware context),
    "per_op" gives each op its own, "gemv_per_k" each op its own and the gemv one per K (as
    IRON's GEMV compiles K in). `instr_format` "elf": full ELFs instead, one instruction
    sequence (kernel) per shape. `scalars` "insts": the attn and layer ops take the position
    and length in words 4 and 5 of their instruction streams instead of an rtp buffer;
    "scratchpad" (elf): in the control scratchpad, symbols `pos` and `len` of `params.txt`.
    `layout` (default: the weights' own) and `mmul`: e.g. "iron.pack_b", [s, t, ct_k];
    `args`: an op's buffer order (default ARGS'); `math`: the layer ops'; `overrides`: an
    op's manifest fields set last (e.g. {"gemm": {"bfp16_mmul": True}})."""
    folder = Path(folder)
    layout = layout or packing.LAYOUT_OF_DTYPE[weights]
    for gen in generations:
        out = folder / gen
        out.mkdir(parents=True, exist_ok=True)
        ext = "elf" if instr_format == "elf" else "xclbin"
        xb_of = {name: (f"flm.{ext}" if xclbins == "one" else f"{name}.{ext}") for name in ops}
        kernels_of: dict[str, list[str]] = {xb: [] for xb in xb_of.values()}
        if scalars == "scratchpad":  # aiecc's --get-scratchpad-parameters: count, then
            (out / "params.txt").write_text("2\npos 0 i32 core\nlen 1 i32 core\n")
        manifest: dict[str, Any] = {"version": 2, "generation": gen, "ops": {}}
        for name in ops:
            shapes = []
            for c in configs:
                if name in LAYER_OPS:
                    if layer_support(c) is None:
                        d = layer_dims(c, min(ctx, c.max_position))
                        shapes += [{**d.__dict__, "m": m} for m in (1, gemm_m)]
                else:
                    m = 1 if name == "gemv" else gemm_m
                    shapes += [{"m": m, "k": k, "n": n} for n, k in linear_shapes(c)]
            unique = {json.dumps(s, sort_keys=True): s for s in shapes}
            if not unique:
                continue
            listed = []
            for key, s in sorted(unique.items()):
                if instr_format == "elf":
                    listed.append({**s, "sequence": f"main:{name}_{len(listed)}"})
                    kernels_of[xb_of[name]].append(listed[-1]["sequence"])
                    continue
                seed = int.from_bytes(hashlib.blake2b(f"{gen}/{name}/{key}".encode(),
                                                      digest_size=8).digest(), "little")
                words = np.random.default_rng(seed).integers(0, 2**32, 32, dtype=np.uint32)
                # the header: 6 rows, mlir-aie's generation code 3, version 1.0; one memory
                # tile row and the generation's columns; a command count; the size in bytes
                words[:4] = [(6 << 24) | (3 << 16) | 1, (1 << 8) | (4 if gen == "npu1" else 8),
                             7, words.nbytes]
                insts = f"{name}_{len(listed)}.bin"
                extra = {}
                if scalars == "insts" and name in ("attn", "layer"):
                    extra = {"scalar_words": [4, 5]}
                    words[[4, 5]] = 0
                words.tofile(out / insts)
                if xclbins == "gemv_per_k" and name == "gemv":
                    extra["xclbin"] = f"gemv_k{s['k']}.xclbin"
                    kernels_of.setdefault(extra["xclbin"], [KERNEL_NAMES[name]])
                listed.append({**s, "insts": insts, **extra})
            if instr_format != "elf" and not (xclbins == "gemv_per_k" and name == "gemv"):
                kernels_of[xb_of[name]].append(KERNEL_NAMES[name])
            binary = {"elf": xb_of[name]} if instr_format == "elf" else {
                "xclbin": "" if xclbins == "gemv_per_k" and name == "gemv" else xb_of[name],
                "kernel": KERNEL_NAMES[name]}
            layered = name in ("attn", "layer")
            manifest["ops"][name] = {
                **binary, "instr_format": instr_format, "instr_length": "words",
                "dtype": {"x": "f32" if name in LAYER_OPS else "bf16", "w": weights, "y": y,
                          "acc": "f32"},
                "layout": layout, "rounding": rounding, "round_per_k_tile": round_per_k_tile,
                "granule": {"m": 1 if name == "gemv" else gemm_m, "k": granule_k,
                            "n": granule_n},
                "args": list((args or {}).get(name) or [
                    a for a in ARGS[name] if a != "rtp" or scalars == "rtp" or not layered]),
                "scalars": scalars if layered else "rtp",
                **({"params": "params.txt"} if scalars == "scratchpad" and layered else {}),
                "mmul": list(mmul),
                "math": math if name in LAYER_OPS else "exact",
                "shapes": listed, **(overrides or {}).get(name, {})}
        for xb, kernels in kernels_of.items():
            if kernels:
                write_xclbin(out / xb, kernels)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return folder


# the buffer order of IRON's designs: each runtime sequence takes (A, B, C)
IRON_ARGS = {"gemv": ["w", "x", "y"], "gemm": ["x", "w", "y"]}


def make_iron_kernel_dir(folder: Path, configs: Sequence[ModelConfig], *,
                         generations: Sequence[str] = ("npu2",), gemv_gbps: float = 27.0,
                         granule_n: int = 512, gemm_m: int = 256) -> Path:
    """A simulator kernel directory shaped as amd/IRON's published GEMV and GEMM operators
    (iron/operators/gemv/op.py, gemm/op.py at 00802545) would be built for `configs`:
    bf16 weights row-major (`iron.rows`: the GEMV's A, the GEMM's B with b_col_maj), the
    GEMV first in its arguments and compiled per K (one xclbin each), rounding to nearest
    even, bf16 out; the GEMM (NPU2) a bfp16-emulated matmul with 64 x 64 x 64 tiles on 4 x 8
    cores (M % 256, K % 64, N % 512), C kept in bf16 between K tiles. `gemv_gbps`: the
    bandwidth its launches model (published GEMV designs reach 20-35 GB/s)."""
    return make_kernel_dir(folder, configs, generations=generations, ops=("gemv", "gemm"),
                           weights="bf16", layout="iron.rows", args=IRON_ARGS,
                           xclbins="gemv_per_k", gemm_m=gemm_m, granule_k=64,
                           granule_n=granule_n, y="bf16",
                           overrides={"gemv": {"gbps": gemv_gbps},
                                      "gemm": {"bfp16_mmul": True, "round_per_k_tile": True}})
