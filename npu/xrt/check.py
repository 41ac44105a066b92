"""`npu-check`: one launch of each linear kernel shape in a kernel directory against numpy,
so the first person with a Ryzen AI machine can say in one command what works.

For the device's generation directory, every `gemv` and `gemm` shape is launched once on a
random weight and activations; the output is compared with numpy's product of what the
kernel was given (the bf16 activations and the weight as its layout encodes it), and the
launch is timed on the wall clock (host copies included) for the GB/s it moved. Layer ops
are listed as not checked: their numbers need a model (the engine's tests cover them on
the simulator). Run it as

    python -m npu.xrt.check --kernel-dir DIR [--device 0] [--simulate]

(`--simulate`: against `npu.xrt.sim`, as CI does).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

from npu.xrt import iron_pack, packing
from npu.xrt.adapter import XRT, XRTError, generation_of
from npu.xrt.kernels import LinearOps, OpKernel
from npu.xrt.manifest import LINEAR_OPS, Op, generation_dir, load_manifest

# the largest relative error (of the output's peak) a shape may show and still match
TOLERANCE = {"bf16": 2e-2, "f32": 2e-3}


class KernelCheck(msgspec.Struct, frozen=True, kw_only=True):
    op: str
    shape: str
    matched: bool = False
    max_rel_err: float = float("nan")
    gbps: float = 0.0
    note: str = ""
    failed: bool = False  # the op did not open, or the launch failed: the check fails


def check_kernels(kernel_dir: Path, xrt: XRT, *, device_index: int = 0,
                  seed: int = 0) -> list[KernelCheck]:
    """One launch per linear shape of the device's generation directory."""
    name = str(xrt.device(device_index).get_info(xrt.x.xrt_info_device.name))
    folder = generation_dir(Path(kernel_dir), generation_of(name), name)
    manifest = load_manifest(folder)
    rng = np.random.default_rng(seed)
    out = []
    for op_name, op in manifest.ops.items():
        if op_name not in LINEAR_OPS:
            out.append(KernelCheck(op=op_name, shape="*", note="not checked (a layer op)"))
            continue
        try:
            kernel = OpKernel(xrt, device_index, folder, op_name, op)
        except XRTError as exc:
            out.append(KernelCheck(op=op_name, shape="*", note=f"cannot open: {exc}",
                                   failed=True))
            continue
        ops = LinearOps(kernel, None) if op_name == "gemv" else LinearOps(kernel, kernel)
        for s in op.shapes:
            out.append(_check_shape(ops, op_name, s.m, s.k, s.n, op, rng))
    return out


def _check_shape(ops: LinearOps, op: str, m: int, k: int, n: int, spec: Op,
                 rng: np.random.Generator) -> KernelCheck:
    y, rounding = spec.dtype["y"], spec.rounding
    label = f"{m}x{k}x{n}"
    w = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    try:
        dw = ops.upload(w)
        start = time.perf_counter()
        got = ops.matmul(x, dw)
        seconds = time.perf_counter() - start
    except XRTError as exc:
        return KernelCheck(op=op, shape=label, note=f"failed: {exc}", failed=True)
    t = dw.tiling
    encoded = packing.unpack(packing.pack(w, t), t, rounding)
    xs = np.zeros((m, t.kp), dtype=np.float32)
    xs[:, :k] = packing.round_bf16(x)
    if spec.bfp16_mmul:  # the kernel's matmul converts both operands to bfp16 first
        xs = iron_pack.quantize_bfp16(xs, rounding)
        encoded = iron_pack.quantize_bfp16(encoded, rounding)
    want = xs[:, :k] @ encoded[:n, :k].T
    peak = float(np.abs(want).max()) or 1.0
    err = float(np.nan_to_num(np.abs(got - want), nan=np.inf).max() / peak)
    moved = t.nbytes + m * t.kp * 2 + m * t.np_ * (2 if y == "bf16" else 4)
    return KernelCheck(op=op, shape=label, matched=err <= TOLERANCE[y], max_rel_err=err,
                       gbps=moved / seconds / 1e9 if seconds > 0 else 0.0)


def report(results: list[KernelCheck]) -> str:
    lines = [f"{'op':<5} {'shape':<16} {'result':<8} {'max rel err':>11} {'GB/s':>7}  note"]
    for r in results:
        result = "matched" if r.matched else ("off" if np.isfinite(r.max_rel_err) else "-")
        lines.append(f"{r.op:<5} {r.shape:<16} {result:<8} {r.max_rel_err:>11.2e} "
                     f"{r.gbps:>7.2f}  {r.note}")
    ok = sum(r.matched for r in results)
    tried = sum(np.isfinite(r.max_rel_err) for r in results)
    failed = sum(r.failed for r in results)
    lines.append(f"{ok} of {tried} shapes matched numpy"
                 + (f"; {failed} could not run" if failed else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="npu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--kernel-dir", type=Path, required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--simulate", action="store_true",
                    help="run against the pyxrt simulator (npu.xrt.sim), not the NPU")
    args = ap.parse_args(argv)
    try:
        if args.simulate:
            from npu.xrt.sim_kernels import simulator_for

            xrt = XRT(simulator_for(args.kernel_dir, ["RyzenAI-npu4", "NPU Phoenix npu1"]))
        else:
            xrt = XRT()
        results = check_kernels(args.kernel_dir, xrt, device_index=args.device)
    except XRTError as exc:
        print(f"npu-check: {exc}", file=sys.stderr)
        return 2
    print(report(results))
    return 0 if all(r.matched for r in results
                    if r.failed or np.isfinite(r.max_rel_err)) else 1


if __name__ == "__main__":
    sys.exit(main())
