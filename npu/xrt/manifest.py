"""Kernel manifests, version 2: what a kernel directory offers, per NPU generation.

A kernel directory holds one sub-directory per generation (`npu1`: 4-column Phoenix / Hawk
Point; `npu2`: 8-column Strix / Krackan / Gorgon Point), each with a `manifest.json`:

    {"version": 2, "generation": "npu2",
     "ops": {"gemv": {...}, "gemm": {...}, "attn": {...}, "mlp": {...}, "layer": {...}}}

and per op: its binary and the instruction format, either `bin` (an xclbin with the
kernel's name, and per shape an instruction stream file; called `kernel(3, instr_bo,
n_instr, *buffers)`, the instruction-length unit `bytes` (the default) | `words`; the
streams are binary little-endian 32-bit words, never mlir-aie's `.txt` hex listings) or
`elf` (a full ELF holding every shape's instruction sequence, and per shape the sequence's
kernel name, e.g. `main:gemv_0`; called with the buffers from argument 0), the dtypes (`x`
bf16; `w` bf16 | bfp16ebs8 | q4g32; `y` bf16 | f32; `acc`), the weight layout (a packer in
`npu.xrt.packing`), the rounding (`floor`: toward minus infinity | `conv_even`) and
whether the output is rounded after every K tile, the padding granules, the buffer arguments
in order (at most 5: the order the design's runtime sequence takes them, e.g. IRON's GEMV
`["w", "x", "y"]`), and the finite list of shapes it was built for, each with its own
instruction stream (and, for a kernel compiled per shape like IRON's GEMV per K, its own
`xclbin` / `kernel`). There is no `sizes` buffer: a launch's shape is its instruction
stream. Declared numerics: `bfp16_mmul` (linear ops: AIE2P's bf16 matmul emulated on bfp16),
`math` (layer ops: "exact" or "aie2p", exp and 1/x from the runtime library's tables).
Per-launch scalars of the layer ops: `scalars` "rtp" (a buffer), "insts" (words of the
stream) or "scratchpad" (a full ELF's control scratchpad, by its `params` file's symbols:
`npu.xrt.scratchpad`).

Ops: `gemv` (y[1, N] = x[1, K] W.T) and `gemm` (M rows at a time) are linear layers; `attn`,
`mlp` and `layer` are a Llama/Qwen3 decoder layer's attention block, MLP block or both for
one token, with the sequence's KV cache resident on the device (bf16) and the residual
stream updated in place (see `npu.xrt.layer_pack`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from npu.xrt.adapter import XRTError
from npu.xrt.packing import DTYPE_OF_LAYOUT, IRON_B, LAYOUTS

GENERATIONS = {"XDNA1": "npu1", "XDNA2": "npu2"}
MAX_BUFFERS = 5
LINEAR_OPS = ("gemv", "gemm")
LAYER_OPS = ("attn", "mlp", "layer")
SCALARS = ("pos", "len")
ARGS = {"gemv": ["x", "w", "y"], "gemm": ["x", "w", "y"], "mlp": ["x", "w"],
        "attn": ["x", "w", "kv", "rtp", "kvnew"], "layer": ["x", "w", "kv", "rtp", "kvnew"]}


class Shape(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One shape an op was built for and its instruction stream. Linear ops: m, k, n (the
    padded sizes). Layer ops: hidden, heads, kv_heads, head_dim, ffn (padded), ctx (tokens
    of KV the device holds per sequence), qk_norm."""

    insts: str = ""  # "bin": the instruction stream's file
    sequence: str = ""  # "elf": the kernel (sequence) name in the ELF
    # "bin": this shape's own xclbin and kernel name, where the op's kernel is compiled per
    # shape (IRON's GEMV compiles K in: one xclbin per K); empty: the op's
    xclbin: str = ""
    kernel: str = ""
    m: int = 0
    k: int = 0
    n: int = 0
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 0
    ctx: int = 0
    qk_norm: bool = False
    # op "scalars": "insts": the indices of the stream's words the host sets per launch, in
    # SCALARS' order (the first token's position, the KV rows the launch attends over)
    scalar_words: tuple[int, ...] = ()


class Op(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    xclbin: str = ""  # "bin"
    elf: str = ""  # "elf"
    kernel: str = "MLIR_AIE"  # "bin": the kernel's name in the xclbin
    instr_format: str = "bin"
    instr_length: str = "bytes"  # current mlir-aie and FastFlowLM hosts pass bytes
    dtype: dict[str, str]
    layout: str
    rounding: str = "conv_even"
    round_per_k_tile: bool = False
    # where a layer op takes its per-launch scalars: "rtp" (a buffer argument), "insts"
    # (words of the instruction stream, set before each launch, as real designs patch them)
    # or "scratchpad" (a full ELF's control scratchpad, `run.get_ctrl_scratchpad_bo()`, by
    # the symbols of the op's `params` file, aiecc's --get-scratchpad-parameters output)
    scalars: str = "rtp"
    params: str = ""  # scalars "scratchpad": the params.txt
    # scalars "scratchpad": the params.txt symbol of each of SCALARS (default: their names)
    scalar_symbols: dict[str, str] = {}
    # linear ops: the kernel's bf16 matmul runs on bfp16 (AIE2P's
    # AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16, IRON's GEMM default on NPU2): x, and a bf16
    # w, enter as bfp16ebs8 blocks of 8 along K in the op's rounding
    bfp16_mmul: bool = False
    # layer ops: how the kernel computes exp and 1/x (softmax, SiLU): "exact" (f32) or
    # "aie2p" (the AIE2P runtime library's lookup tables, npu.xrt.aie2p_math)
    math: str = "exact"
    gbps: float = 0.0  # the bandwidth its kernel reaches, for the simulator's timing model
    mmul: tuple[int, ...] = ()  # layout iron.pack_b: IRON flm.GEMM's [s, t, ct_k]
    granule: dict[str, int]
    args: list[str]
    shapes: list[Shape]


class ManifestV2(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int
    generation: str
    ops: dict[str, Op]


def _check(where: Path, m: ManifestV2) -> None:
    def bad(msg: str) -> XRTError:
        return XRTError(f"{where}: {msg}")

    if m.version != 2:
        raise bad(f"manifest version {m.version}; this engine reads version 2")
    if m.generation not in GENERATIONS.values():
        raise bad(f"generation {m.generation!r} is not npu1 or npu2")
    if "gemv" not in m.ops:
        raise bad("it has no gemv op (every model needs one for its lm_head)")
    for name, op in m.ops.items():
        _check_op(bad, name, op)
        _check_weights(bad, name, op)


def _check_op(bad: Callable[[str], XRTError], name: str, op: Op) -> None:
    """One op's instruction streams, scalars and buffer arguments."""
    if name not in ARGS:
        raise bad(f"op {name!r} is not one of {', '.join(ARGS)}")
    if op.instr_format not in ("bin", "elf"):
        raise bad(f"op {name}: instr_format {op.instr_format!r} is not bin or elf")
    if op.instr_format == "bin" and (any(not (s.xclbin or op.xclbin) for s in op.shapes)
                                     or any(not s.insts for s in op.shapes)):
        raise bad(f"op {name}: instr_format bin needs an xclbin (the op's, or each "
                  "shape's) and each shape's insts")
    if op.instr_format == "elf" and any(s.xclbin or s.kernel for s in op.shapes):
        raise bad(f"op {name}: a shape's own xclbin / kernel is for instr_format bin")
    if op.instr_format == "elf" and (not op.elf or any(not s.sequence
                                                       for s in op.shapes)):
        raise bad(f"op {name}: instr_format elf needs an elf and each shape's sequence")
    if op.dtype.get("acc", "f32") != "f32":
        raise bad(f"op {name}: accumulator {op.dtype.get('acc')!r}; the engine's numerics "
                  "(and the simulator's) assume f32 accumulation")
    text = [s.insts for s in op.shapes if s.insts.lower().endswith(".txt")]
    if text:
        raise bad(f"op {name}: instruction stream {text[0]} is a text listing; this engine "
                  "reads binary streams (aiecc.py's --npu-insts-name=insts.bin, or "
                  "convert each hex line to a little-endian 32-bit word)")
    if op.instr_length not in ("words", "bytes"):
        raise bad(f"op {name}: instr_length {op.instr_length!r} is not words or bytes")
    if len(op.args) > MAX_BUFFERS:
        raise bad(f"op {name}: {len(op.args)} buffer arguments; a kernel takes at most "
                  f"{MAX_BUFFERS}")
    want = ARGS[name]
    if op.gbps < 0:
        raise bad(f"op {name}: gbps {op.gbps} is negative")
    if op.scalars not in ("rtp", "insts", "scratchpad"):
        raise bad(f"op {name}: scalars {op.scalars!r} is not rtp, insts or scratchpad")
    if op.math not in ("exact", "aie2p"):
        raise bad(f"op {name}: math {op.math!r} is not exact or aie2p")
    if op.math != "exact" and name not in LAYER_OPS:
        raise bad(f"op {name}: math is for the layer ops (their softmax and SiLU)")
    if op.scalars == "scratchpad":
        if name not in ("attn", "layer") or op.instr_format != "elf" or not op.params:
            raise bad(f"op {name}: scalars in the control scratchpad are for the attn "
                      "and layer ops of instr_format elf, with the ELF's params file")
        if set(op.scalar_symbols) - set(SCALARS):
            raise bad(f"op {name}: scalar_symbols names {sorted(op.scalar_symbols)}; the "
                      f"scalars are {', '.join(SCALARS)}")
        want = [a for a in want if a != "rtp"]
    if op.scalars == "insts":
        if name not in ("attn", "layer") or op.instr_format != "bin":
            raise bad(f"op {name}: scalars in the instruction stream are for the attn and "
                      "layer ops of instr_format bin")
        if any(len(s.scalar_words) != len(SCALARS) for s in op.shapes):
            raise bad(f"op {name}: scalars insts needs each shape's scalar_words, the "
                      f"indices of its stream's words for {' and '.join(SCALARS)}")
        want = [a for a in want if a != "rtp"]
    if sorted(op.args) != sorted(want):
        raise bad(f"op {name}: args {op.args} must name {', '.join(want)}")
    if name in LINEAR_OPS and op.dtype.get("x") != "bf16":
        raise bad(f"op {name}: x must be bf16 (activations cross as bf16), not "
                  f"{op.dtype.get('x')!r}")
    if name in LAYER_OPS and op.dtype.get("x") not in ("bf16", "f32"):
        raise bad(f"op {name}: x (the residual stream) must be bf16 or f32, not "
                  f"{op.dtype.get('x')!r}")


def _check_weights(bad: Callable[[str], XRTError], name: str, op: Op) -> None:
    """One op's weight layout, dtypes, rounding, granules and shapes."""
    w = op.dtype.get("w")
    if op.layout in IRON_B:
        s, t, ct_k = (list(op.mmul) + [0, 0, 0])[:3]
        gk, gn = op.granule.get("k", 0), op.granule.get("n", 0)
        if name not in LINEAR_OPS or len(op.mmul) != 3 or min(s, t, ct_k) <= 0 or \
                gk % ct_k or ct_k % s or gn % t:
            raise bad(f"op {name}: layout {op.layout} is for gemv / gemm, with mmul "
                      "[s, t, ct_k] where ct_k divides the k granule, s divides ct_k "
                      "and t the n granule")
        if op.layout == "iron.pack_b.bfp16ebs8" and s != 8:
            raise bad(f"op {name}: layout iron.pack_b.bfp16ebs8 needs mmul s = 8 (a "
                      "block is 8 in-features)")
    if op.layout == "iron.rows" and name not in LINEAR_OPS:
        raise bad(f"op {name}: layout iron.rows is for gemv / gemm")
    if op.bfp16_mmul and (name not in LINEAR_OPS or op.granule.get("k", 0) % 8):
        raise bad(f"op {name}: bfp16_mmul is for gemv / gemm with a k granule that is a "
                  "multiple of 8 (a bfp16 block)")
    if op.layout == "flm.q4nx" and (name not in LINEAR_OPS or op.granule.get("n", 0) % 32
                                    or op.granule.get("k", 0) % 256):
        raise bad(f"op {name}: layout flm.q4nx is for gemv / gemm, with granules n a "
                  "multiple of 32 and k of 256 (its blocks)")
    if DTYPE_OF_LAYOUT.get(op.layout) != w or op.layout not in LAYOUTS:
        raise bad(f"op {name}: weight dtype {w!r} with layout {op.layout!r}; known: "
                  + ", ".join(f"{d} -> {lay}" for lay, d in DTYPE_OF_LAYOUT.items()))
    if op.dtype.get("y") not in ("bf16", "f32"):
        raise bad(f"op {name}: y must be bf16 or f32, not {op.dtype.get('y')!r}")
    if op.rounding not in ("floor", "conv_even"):
        raise bad(f"op {name}: rounding {op.rounding!r} is not floor or conv_even")
    if not {"n", "k"} <= set(op.granule):
        raise bad(f"op {name}: granule needs n and k")
    if not op.shapes:
        raise bad(f"op {name}: no shapes")
    if name == "gemv" and any(s.m != 1 for s in op.shapes):
        raise bad("op gemv: every shape has m = 1")
    gm = op.granule.get("m", 1)
    if name == "gemm" and any(s.m % gm for s in op.shapes):
        raise bad(f"op gemm: a shape's m must be a multiple of its m granule {gm} (e.g. "
                  "IRON's GEMM: 4 rows of 64-row tiles, M % 256)")


def generation_dir(kernel_dir: Path, generation: str, device_name: str) -> Path:
    """The sub-directory of `kernel_dir` for a device of `generation` ("XDNA1" | "XDNA2")."""
    kernel_dir = Path(kernel_dir)
    if not kernel_dir.is_dir():
        raise XRTError(f"the kernel directory {kernel_dir} does not exist (a kernel directory "
                       "holds npu1/ and/or npu2/, each with manifest.json)")
    want = GENERATIONS.get(generation)
    have = sorted(p.name for p in kernel_dir.iterdir() if (p / "manifest.json").exists()) \
        if kernel_dir.is_dir() else []
    if want is None:
        raise XRTError(f"cannot tell the NPU generation of {device_name!r} (known: Phoenix / "
                       f"Hawk Point npu1, Strix / Krackan / Gorgon npu2); {kernel_dir} has "
                       f"{', '.join(have) or 'no generation directory'}")
    if want not in have:
        raise XRTError(f"{kernel_dir} has kernels for {', '.join(have) or 'no generation'} "
                       f"but the device {device_name!r} is {want}: build the kernels for "
                       f"{want} (a kernel directory holds npu1/ and/or npu2/, each with "
                       "manifest.json)")
    return kernel_dir / want


def load_manifest(folder: Path) -> ManifestV2:
    path = Path(folder) / "manifest.json"
    try:
        m = msgspec.json.decode(path.read_bytes(), type=ManifestV2)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise XRTError(f"{path}: {exc}") from None
    _check(path, m)
    if m.generation != Path(folder).name:
        raise XRTError(f"{path}: generation {m.generation} in the {Path(folder).name}/ "
                       "directory")
    return m
