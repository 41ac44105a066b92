"""The XRT adapter: the portable subset of pyxrt that flm-serve uses.

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
    if any(f"npu{i}" in low for i in (4, 5, 6)) or any(
            family in low for family in ("strix", "krackan", "gorgon")):
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
        def load(dev: Any) -> tuple[Any, Any]:
            xb = self.x.xclbin(str(xclbin_path))
            dev.register_xclbin(xb)
            return self.x.hw_context(dev, xb.get_uuid()), xb

        return self._context(index, xclbin_path, load)

    def elf_context(self, index: int, elf_path: Path) -> Any:
        """The hardware context of a full ELF on a device, cached like xclbins'."""
        return self._context(index, elf_path,
                             lambda dev: self.x.hw_context(dev, self.x.elf(str(elf_path))))

    def _context(self, index: int, path: Path, load: Any) -> Any:
        """`load(device)` once per (device, file), the few most recent kept."""
        key = (index, str(path))
        if key in self._contexts:
            self._contexts.move_to_end(key)
            return self._contexts[key]
        dev = self.device(index)
        try:
            made = load(dev)
        except Exception as exc:
            raise XRTError(f"cannot load {path} on NPU {index}: {exc}") from None
        self._contexts[key] = made
        while len(self._contexts) > self.max_contexts:
            self._contexts.popitem(last=False)
        return made

    def elf_kernel(self, ctx: Any, name: str) -> Any:
        try:
            return self.x.ext.kernel(ctx, name)
        except Exception as exc:
            raise XRTError(f"cannot open the ELF's kernel {name}: {exc}") from None

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
        self._check_state(state)

    def run_built(self, kernel: Any, *args: Any, timeout_ms: int = RUN_TIMEOUT_MS) -> None:
        """A run set up argument by argument (the ELF kernels' way: buffers from 0)."""
        try:
            r = self.x.run(kernel)
            for i, a in enumerate(args):
                r.set_arg(i, a)
            r.start()
            state = r.wait(timeout_ms)
        except Exception as exc:
            raise XRTError(f"kernel run failed: {exc}") from None
        self._check_state(state)

    def _check_state(self, state: Any) -> None:
        if state != self.x.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
            name = getattr(state, "name", str(state))
            raise XRTError(f"kernel run ended in {name} (expected ERT_CMD_STATE_COMPLETED)")

    @property
    def has_runlist(self) -> bool:
        return hasattr(self.x, "runlist")

    def run_all(self, launches: list[tuple[Any, Any, tuple]],
                timeout_ms: int = RUN_TIMEOUT_MS) -> None:
        """(context, kernel, arguments) launches in order: each stretch of one hardware
        context as one runlist submission when pyxrt has `runlist` (a runlist belongs to
        one context), else one run after another."""
        if not self.has_runlist:
            for _, kernel, args in launches:
                self.run_built(kernel, *args, timeout_ms=timeout_ms)
            return
        start = 0
        while start < len(launches):
            ctx = launches[start][0]
            end = start
            while end < len(launches) and launches[end][0] is ctx:
                end += 1
            self._runlist(ctx, [(k, a) for _, k, a in launches[start:end]], timeout_ms)
            start = end

    def _runlist(self, ctx: Any, launches: list[tuple[Any, tuple]], timeout_ms: int) -> None:
        try:
            rl = self.x.runlist(ctx)
            runs = []
            for kernel, args in launches:
                r = self.x.run(kernel)
                for i, a in enumerate(args):
                    r.set_arg(i, a)
                rl.add(r)
                runs.append(r)
            rl.execute()
            waited = rl.wait(timeout_ms)
            # XRT's runlist wait returns a cv_status (timeout / no_timeout) where bindings
            # map it; each run's own state says which one failed
            if str(getattr(waited, "name", "")).lower() == "timeout":
                raise XRTError(f"the runlist did not complete within {timeout_ms} ms")
            states = [r.state() for r in runs]
        except XRTError:
            raise
        except Exception as exc:
            raise XRTError(f"runlist failed: {exc}") from None
        done = self.x.ert_cmd_state.ERT_CMD_STATE_COMPLETED
        failed = next((st for st in states if st != done), None)
        if failed is not None:
            self._check_state(failed)
