"""The XRT adapter: the portable subset of pyxrt that flm-serve uses, and GemmKernel.

`pyxrt` ships with AMD's XRT (not PyPI) and is imported only here, lazily; its absence is
an `XRTUnavailable` with what to install, never an ImportError at import time. The same
adapter drives the real module or `npu.xrt.sim.Simulator`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from npu.errors import ModelError

log = logging.getLogger(__name__)
XRT_PYTHON = "/opt/xilinx/xrt/python"
RUN_TIMEOUT_MS = 10_000


class XRTError(ModelError):
    """A device, xclbin or kernel run failed; the message says which and how."""


class XRTUnavailable(XRTError):
    """pyxrt cannot be imported."""


def import_pyxrt() -> Any:
    """The pyxrt module (also found in XRT's default install folder)."""
    try:
        import pyxrt  # type: ignore[import-not-found]
    except ImportError:
        if XRT_PYTHON not in sys.path and Path(XRT_PYTHON).exists():
            sys.path.append(XRT_PYTHON)
            try:
                import pyxrt  # type: ignore[import-not-found]
            except ImportError:
                pyxrt = None
        else:
            pyxrt = None
    if pyxrt is None:
        raise XRTUnavailable(
            "pyxrt is not importable: install AMD's XRT and the NPU driver (amdxdna), then "
            f"source /opt/xilinx/xrt/setup.sh (or add {XRT_PYTHON} to PYTHONPATH); "
            "or serve with device: cpu")
    return pyxrt


class DeviceInfo(msgspec.Struct, frozen=True):
    index: int
    name: str
    generation: str  # "XDNA1" | "XDNA2" | "unknown"


def generation_of(name: str) -> str:
    low = name.lower()
    if "npu1" in low or "phoenix" in low:
        return "XDNA1"
    if any(f"npu{i}" in low for i in (4, 5, 6)) or "strix" in low or "krackan" in low:
        return "XDNA2"
    return "unknown"


class XRT:
    """One process's view of its NPUs. Devices are opened once (a failed open is retried
    with backoff); hardware contexts are cached, a few per device (they are a scarce,
    system-wide resource)."""

    def __init__(self, module: Any = None, *, max_contexts: int = 4,
                 open_retries: int = 3, backoff_s: float = 0.05) -> None:
        self.x = module if module is not None else import_pyxrt()
        self.max_contexts = max_contexts
        self.open_retries = open_retries
        self.backoff_s = backoff_s
        self._devices: dict[int, Any] = {}
        self._contexts: OrderedDict[tuple[int, str], Any] = OrderedDict()

    def enumerate_devices(self) -> list[DeviceInfo]:
        """Every device that opens, in index order (stops at the first that does not)."""
        out = []
        index = 0
        while True:
            try:
                dev = self.device(index, retries=1)
            except XRTError:
                break
            name = str(dev.get_info(self.x.xrt_info_device.name))
            out.append(DeviceInfo(index=index, name=name, generation=generation_of(name)))
            index += 1
        return out

    def device(self, index: int, *, retries: int | None = None) -> Any:
        if index in self._devices:
            return self._devices[index]
        tries = retries or self.open_retries
        last: Exception | None = None
        for attempt in range(tries):
            try:
                dev = self.x.device(index)
                self._devices[index] = dev
                return dev
            except Exception as exc:  # pyxrt raises RuntimeError subclasses
                last = exc
                if attempt + 1 < tries:
                    time.sleep(self.backoff_s * (2 ** attempt))
        raise XRTError(f"cannot open NPU {index} after {tries} tries: {last}")

    def hw_context(self, index: int, xclbin_path: Path) -> tuple[Any, Any]:
        """(context, xclbin) for an xclbin on a device, registered and cached."""
        key = (index, str(xclbin_path))
        if key in self._contexts:
            self._contexts.move_to_end(key)
            return self._contexts[key]
        dev = self.device(index)
        try:
            xb = self.x.xclbin(str(xclbin_path))
            dev.register_xclbin(xb)
            ctx = self.x.hw_context(dev, xb.get_uuid())
        except Exception as exc:
            raise XRTError(f"cannot load {xclbin_path} on NPU {index}: {exc}") from None
        self._contexts[key] = (ctx, xb)
        while len(self._contexts) > self.max_contexts:
            self._contexts.popitem(last=False)
        return ctx, xb

    def kernel(self, ctx: Any, xb: Any, name: str | None) -> Any:
        names = [k.get_name() for k in xb.get_kernels()]
        if not names:
            raise XRTError("the xclbin holds no kernel")
        chosen = name if name in names else next((n for n in names if name and n.startswith(
            name)), None) if name else names[0]
        if chosen is None:
            raise XRTError(f"kernel {name!r} is not in the xclbin (it has {', '.join(names)})")
        try:
            return self.x.kernel(ctx, chosen)
        except Exception as exc:
            raise XRTError(f"cannot open kernel {chosen}: {exc}") from None

    def bo(self, index: int, size: int, flags: Any, group: int) -> Any:
        try:
            return self.x.bo(self.device(index), int(size), flags, group)
        except Exception as exc:
            raise XRTError(f"cannot allocate a {size}-byte buffer on NPU {index}: {exc}") \
                from None

    def to_device(self, bo: Any, data: np.ndarray) -> None:
        try:
            bo.write(np.ascontiguousarray(data).view(np.uint8).ravel(), 0)
            bo.sync(self.x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, data.nbytes, 0)
        except Exception as exc:
            raise XRTError(f"copy to the NPU failed: {exc}") from None

    def from_device(self, bo: Any, nbytes: int) -> np.ndarray:
        try:
            bo.sync(self.x.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, nbytes, 0)
            return np.asarray(bo.read(nbytes, 0), dtype=np.uint8)
        except Exception as exc:
            raise XRTError(f"copy from the NPU failed: {exc}") from None

    def run(self, kernel: Any, *args: Any, timeout_ms: int = RUN_TIMEOUT_MS) -> None:
        try:
            state = kernel(*args).wait(timeout_ms)
        except Exception as exc:
            raise XRTError(f"kernel run failed: {exc}") from None
        if state != self.x.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
            name = getattr(state, "name", str(state))
            raise XRTError(f"kernel run ended in {name} (expected ERT_CMD_STATE_COMPLETED)")


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """A GEMM kernel directory's manifest.json."""

    xclbin: str
    insts: str
    kernel: str | None = None
    tile: dict[str, int]
    dtype: dict[str, str] = msgspec.field(default_factory=lambda: {"a": "f32", "b": "f32",
                                                                    "c": "f32"})
    args: list[str] = msgspec.field(default_factory=lambda: ["a", "b", "c", "sizes"])
    instr_length: str = "words"


class DeviceWeight(msgspec.Struct):
    bo: Any
    k: int
    n: int
    kp: int
    np_: int


class GemmKernel:
    """The linear layers' GEMM on one NPU: weights uploaded once (tiled), activations
    through reused host buffers. Counts bytes each way and kernel runs."""

    def __init__(self, xrt: XRT, index: int, kernel_dir: Path) -> None:
        kernel_dir = Path(kernel_dir)
        try:
            self.manifest = msgspec.json.decode((kernel_dir / "manifest.json").read_bytes(),
                                                type=Manifest)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise XRTError(f"{kernel_dir}/manifest.json: {exc}") from None
        m = self.manifest
        if any(v != "f32" for v in m.dtype.values()):
            raise XRTError(f"{kernel_dir}: only f32 GEMM kernels are supported, not {m.dtype}")
        if set(m.args) != {"a", "b", "c", "sizes"}:
            raise XRTError(f"{kernel_dir}: args must name a, b, c and sizes, not {m.args}")
        self.tm, self.tk, self.tn = m.tile["m"], m.tile["k"], m.tile["n"]
        self.xrt, self.index = xrt, index
        ctx, xb = xrt.hw_context(index, kernel_dir / m.xclbin)
        self.kernel = xrt.kernel(ctx, xb, m.kernel)
        try:
            self.insts = np.fromfile(kernel_dir / m.insts, dtype=np.uint32)
        except OSError as exc:
            raise XRTError(f"{kernel_dir}: cannot read {m.insts}: {exc}") from None
        flags = xrt.x.bo
        self.instr_bo = xrt.bo(index, self.insts.nbytes, flags.cacheable,
                               self.kernel.group_id(1))
        xrt.to_device(self.instr_bo, self.insts)
        self.n_instr = self.insts.size if m.instr_length == "words" else self.insts.nbytes
        self.group = {name: self.kernel.group_id(3 + i) for i, name in enumerate(m.args)}
        self.sizes_bo = xrt.bo(index, 16, flags.host_only, self.group["sizes"])
        self._bufs: dict[str, tuple[int, Any]] = {}
        self.bytes_in = 0
        self.bytes_out = 0
        self.runs = 0
        self.weight_bytes = 0

    @staticmethod
    def _pad(v: int, t: int) -> int:
        return (v + t - 1) // t * t

    def upload(self, w: np.ndarray) -> DeviceWeight:
        """Tile and upload a [out, in] weight once; it stays on the device."""
        n, k = w.shape
        kp, np_ = self._pad(k, self.tk), self._pad(n, self.tn)
        b = np.zeros((kp, np_), dtype=np.float32)
        b[:k, :n] = w.T
        tiles = b.reshape(kp // self.tk, self.tk, np_ // self.tn, self.tn).transpose(2, 0, 1, 3)
        bo = self.xrt.bo(self.index, b.nbytes, self.xrt.x.bo.host_only, self.group["b"])
        self.xrt.to_device(bo, np.ascontiguousarray(tiles))
        self.weight_bytes += b.nbytes
        return DeviceWeight(bo=bo, k=k, n=n, kp=kp, np_=np_)

    def _buffer(self, name: str, nbytes: int) -> Any:
        have = self._bufs.get(name)
        if have is None or have[0] < nbytes:
            size = max(nbytes, 2 * have[0] if have else nbytes)
            have = (size, self.xrt.bo(self.index, size, self.xrt.x.bo.host_only,
                                      self.group[name]))
            self._bufs[name] = have
        return have[1]

    def matmul(self, x: np.ndarray, w: DeviceWeight) -> np.ndarray:
        """x [M, K] @ W.T -> [M, N] on the device."""
        m = x.shape[0]
        mp = self._pad(m, self.tm)
        # Only the real rows cross: the kernel also computes the padding rows of its last
        # M tile from whatever the buffer holds there, and those results are dropped.
        a = np.zeros((m, w.kp), dtype=np.float32)
        a[:, : w.k] = x
        a_bo = self._buffer("a", mp * w.kp * 4)
        c_bo = self._buffer("c", mp * w.np_ * 4)
        self.xrt.to_device(a_bo, a)
        sizes = np.array([mp, w.kp, w.np_, 0], dtype=np.uint32)
        self.xrt.to_device(self.sizes_bo, sizes)
        order = {"a": a_bo, "b": w.bo, "c": c_bo, "sizes": self.sizes_bo}
        self.xrt.run(self.kernel, 3, self.instr_bo, self.n_instr,
                     *[order[name] for name in self.manifest.args])
        out = self.xrt.from_device(c_bo, m * w.np_ * 4).view(np.float32).reshape(m, w.np_)
        self.bytes_in += a.nbytes + sizes.nbytes
        self.bytes_out += m * w.np_ * 4
        self.runs += 1
        return out[:, : w.n]
