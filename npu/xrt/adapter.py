"""The XRT adapter: the portable subset of pyxrt that flm-serve uses.

`pyxrt` ships with AMD's XRT (not PyPI) and is imported only here, lazily; its absence is
an `XRTUnavailable` with what to install, never an ImportError at import time. The same
adapter drives the real module or `npu.xrt.sim.Simulator`.

It calls pyxrt only in the argument forms XRT's bindings define (`src/python/pybind11/src/
pyxrt.cpp` at Xilinx/XRT@963c58ee, XRT 2.26; tests/npu/xrt/pyxrt_table.py lists them and
checks this module against them). Hence: a runlist's `wait()` takes no argument (its
`std::chrono` timeout does not convert from Python), so a watchdog thread bounds it; a
failed runlist run is an exception from `wait()`, and no run of a runlist is asked its
`state()` (`xrt_kernel.h` forbids it); a single run's `wait(timeout_ms)` returns its state.
`kernel(...)` silently drops an argument it cannot set, so every launch's arguments are
checked against the kernel's declared count and types first. XRT's version is read from its
`version.json`, and what needs a newer XRT is refused or done without, naming both versions.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from npu.errors import ModelError

log = logging.getLogger(__name__)
XRT_PYTHON = "/opt/xilinx/xrt/python"
RUN_TIMEOUT_MS = 10_000
# (XRT version, what) each feature needs; the binding landed in XRT's master at
# d4a92e8740 (runlist, ext.kernel) and 2a6ffe7a7f (hw_context(device, elf), master at 2.23)
# (6dd06dc947, run.get_ctrl_scratchpad_bo, landed while master said 2.23 and ships in 2.25:
# its presence on pyxrt.run is what is checked, the version only named)
NEEDS = {"runlist": ((2, 21), "runlists (pyxrt.runlist)"),
         "elf": ((2, 23), "full-ELF kernels (pyxrt.hw_context(device, elf))"),
         "scratchpad": ((2, 25), "control scratchpads (pyxrt.run.get_ctrl_scratchpad_bo)")}
Prepare = Callable[[Any], None]  # a run set up, before it starts: e.g. its scratchpad written


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


def xrt_version(module: Any) -> tuple[int, ...] | None:
    """XRT's version (major, minor, patch), or None when it cannot be read. pyxrt binds none:
    XRT installs `version.json` ({"BUILD_VERSION": "2.26.0", ...}) in its root, the parent
    of pyxrt's `python/` folder. The simulator says which XRT it stands for (`xrt_version`)."""
    text = getattr(module, "xrt_version", None)
    if text is None:
        roots = [Path(XRT_PYTHON).parent]
        if getattr(module, "__file__", None):
            roots.insert(0, Path(module.__file__).resolve().parent.parent)
        for root in roots:
            try:
                text = json.loads((root / "version.json").read_text())["BUILD_VERSION"]
                break
            except (OSError, ValueError, KeyError, TypeError):
                continue
    if not isinstance(text, str):
        return None
    parts = [int(p) for p in text.split(".")[:3] if p.isdigit()]
    return tuple(parts) if len(parts) >= 2 else None


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


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
                 open_retries: int = 3, backoff_s: float = 0.05,
                 run_timeout_ms: int = RUN_TIMEOUT_MS) -> None:
        self.x = module if module is not None else import_pyxrt()
        self.max_contexts = max_contexts
        self.open_retries = open_retries
        self.backoff_s = backoff_s
        self.run_timeout_ms = run_timeout_ms
        self.version = xrt_version(self.x)
        self._devices: dict[int, Any] = {}
        self._contexts: OrderedDict[tuple[int, str], Any] = OrderedDict()
        self._declared: dict[int, tuple[str, int]] = {}  # id(kernel) -> (name, its args)
        if self.version is None:
            log.warning("cannot read XRT's version (no version.json beside pyxrt or in "
                        "/opt/xilinx/xrt); assuming it has what each mode needs")

    def supports(self, feature: str) -> bool:
        """Whether this XRT is new enough for `feature` ("runlist" | "elf"); an unknown
        version is taken to be."""
        return self.version is None or self.version >= NEEDS[feature][0]

    def require(self, feature: str) -> None:
        need, what = NEEDS[feature]
        if not self.supports(feature):
            raise XRTError(f"{what} need XRT {_dotted(need)} or newer; this is XRT "
                           f"{_dotted(self.version or ())}: update XRT and the NPU driver, or "
                           "use a kernel directory without them")

    def scratchpad_run(self, kernel: Any) -> Any:
        """A run of an ELF kernel with its control scratchpad, checked before any launch:
        refused where pyxrt does not bind `get_ctrl_scratchpad_bo` (XRT before 2.25) or the
        ELF has no scratchpad section (XRT throws)."""
        run = self.x.run(kernel)
        if not hasattr(run, "get_ctrl_scratchpad_bo"):
            need, what = NEEDS["scratchpad"]
            raise XRTError(f"{what} need XRT {_dotted(need)} or newer; this is XRT "
                           f"{_dotted(self.version or ()) or 'of unknown version'}: update "
                           "XRT, or use a kernel directory whose ops take their scalars in "
                           "the instruction stream")
        self.ctrl_scratchpad(run)
        return run

    def ctrl_scratchpad(self, run: Any) -> Any:
        """The run's control scratchpad buffer."""
        try:
            return run.get_ctrl_scratchpad_bo()
        except Exception as exc:
            raise XRTError(f"the kernel's run has no control scratchpad: {exc}") from None

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
        self.require("elf")
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
            kernel = self.x.ext.kernel(ctx, name)
        except Exception as exc:
            raise XRTError(f"cannot open the ELF's kernel {name}: {exc}") from None
        self._declared.pop(id(kernel), None)  # an id an earlier, freed kernel had
        return kernel

    def kernel(self, ctx: Any, xb: Any, name: str | None, *, buffers: int) -> Any:
        """An xclbin's kernel, called (opcode, instructions, their length, `buffers` buffers):
        refused when the xclbin declares fewer arguments (pyxrt would drop the rest)."""
        declared = {k.get_name(): k.get_num_args() for k in xb.get_kernels()}
        names = list(declared)
        if not names:
            raise XRTError("the xclbin holds no kernel")
        chosen = name if name in names else next((n for n in names if name and n.startswith(
            name)), None) if name else names[0]
        if chosen is None:
            raise XRTError(f"kernel {name!r} is not in the xclbin (it has {', '.join(names)})")
        if 3 + buffers > declared[chosen]:
            raise XRTError(f"kernel {chosen} declares {declared[chosen]} arguments; the "
                           f"manifest gives it 3 + {buffers} buffers (opcode, instructions, "
                           "their length, then the buffers)")
        try:
            kernel = self.x.kernel(ctx, chosen)
        except Exception as exc:
            raise XRTError(f"cannot open kernel {chosen}: {exc}") from None
        self._declared[id(kernel)] = (chosen, declared[chosen])
        return kernel

    def _check_args(self, kernel: Any, args: tuple) -> None:
        """Before a launch: every argument one pyxrt can set (a bo or an int), and no more
        than the kernel declares (ELF kernels declare none to pyxrt: not counted)."""
        for i, a in enumerate(args):
            if isinstance(a, bool) or not isinstance(a, (int, np.integer, self.x.bo)):
                raise XRTError(f"kernel argument {i} is a {type(a).__name__}; pyxrt sets "
                               "buffers and ints only (it would drop this one silently)")
        name, count = self._declared.get(id(kernel), ("", len(args)))
        if len(args) > count:
            raise XRTError(f"kernel {name} declares {count} arguments; this launch passes "
                           f"{len(args)}")

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
            return np.asarray(bo.read(nbytes, 0)).view(np.uint8)  # read gives int8 (char)
        except Exception as exc:
            raise XRTError(f"copy from the NPU failed: {exc}") from None

    def run(self, kernel: Any, *args: Any) -> None:
        """One launch of an xclbin kernel; its wait returns the run's state."""
        self._check_args(kernel, args)
        try:
            state = kernel(*args).wait(self.run_timeout_ms)
        except Exception as exc:
            raise XRTError(f"kernel run failed: {exc}") from None
        self._check_state(state)

    def run_built(self, kernel: Any, *args: Any, prepare: Prepare | None = None) -> None:
        """A run set up argument by argument (the ELF kernels' way: buffers from 0), then
        `prepare(run)` before it starts."""
        self._check_args(kernel, args)
        try:
            r = self.x.run(kernel)
            for i, a in enumerate(args):
                r.set_arg(i, a)
            if prepare is not None:
                prepare(r)
            r.start()
            state = r.wait(self.run_timeout_ms)
        except XRTError:
            raise
        except Exception as exc:
            raise XRTError(f"kernel run failed: {exc}") from None
        self._check_state(state)

    def _check_state(self, state: Any) -> None:
        if state != self.x.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
            name = getattr(state, "name", str(state))
            raise XRTError(f"kernel run ended in {name} (expected ERT_CMD_STATE_COMPLETED)")

    @property
    def has_runlist(self) -> bool:
        """pyxrt binds `runlist` and XRT is new enough for it (else runs one by one)."""
        return hasattr(self.x, "runlist") and self.supports("runlist")

    def run_all(self, launches: list[tuple[Any, Any, tuple, Prepare | None]]) -> None:
        """(context, kernel, arguments, prepare) launches in order: each stretch of one
        hardware context as one runlist submission when XRT has runlists (a runlist belongs
        to one context), else one run after another; `prepare(run)` (or None) on each run
        once its arguments are set."""
        for _, kernel, args, _ in launches:
            self._check_args(kernel, args)
        if not self.has_runlist:
            for _, kernel, args, prepare in launches:
                self.run_built(kernel, *args, prepare=prepare)
            return
        start = 0
        while start < len(launches):
            ctx = launches[start][0]
            end = start
            while end < len(launches) and launches[end][0] is ctx:
                end += 1
            self._runlist(ctx, [(k, a, p) for _, k, a, p in launches[start:end]])
            start = end

    def _runlist(self, ctx: Any, launches: list[tuple[Any, tuple, Prepare | None]]) -> None:
        try:
            rl = self.x.runlist(ctx)
            for kernel, args, prepare in launches:
                r = self.x.run(kernel)
                for i, a in enumerate(args):
                    r.set_arg(i, a)
                if prepare is not None:
                    prepare(r)
                rl.add(r)
            rl.execute()
        except XRTError:
            raise
        except Exception as exc:
            raise XRTError(f"runlist failed: {exc}") from None
        self._watchdog(rl.wait, f"a runlist of {len(launches)} runs")

    def _watchdog(self, wait: Callable[[], Any], what: str) -> None:
        """`wait()` (which takes no timeout) on a thread, given up after run_timeout_ms;
        what it raises (XRT's command_error: a run failed) is an XRTError."""
        failed: list[BaseException] = []

        def waiting() -> None:
            try:
                wait()
            except BaseException as exc:  # noqa: BLE001  (handed to the caller)
                failed.append(exc)

        thread = threading.Thread(target=waiting, name="xrt-wait", daemon=True)
        thread.start()
        thread.join(self.run_timeout_ms / 1000)
        if thread.is_alive():
            raise XRTError(f"{what} did not complete within {self.run_timeout_ms} ms "
                           "(ERT_CMD_STATE_TIMEOUT by the watchdog; the NPU may need a reset: "
                           "xrt-smi examine, then reload the driver)")
        if failed:
            raise XRTError(f"{what} failed: {failed[0]}")
