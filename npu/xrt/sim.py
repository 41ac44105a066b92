"""A simulator of the pyxrt calls flm-serve makes, for CI and development without an NPU.

`Simulator()` is a stand-in for the `pyxrt` module: same names and call signatures
(`device`, `xclbin`, `hw_context`, `kernel`, `run` + `set_arg`, `runlist` + `add` / `execute`
/ `wait`, `bo`, `xclBOSyncDirection`, `ert_cmd_state`, `xrt_info_device`). Its kernels are
numpy callables registered per (xclbin uuid, kernel name) (`npu.xrt.sim_kernels` has the ones
a kernel directory describes). Device memory is separate from host memory, so a missing
`sync` gives wrong results as it would on hardware, and a kernel can tell which bytes of a
buffer were synced since its last run (rows the host did not write are undefined). It
enforces the context limit (6 on Phoenix/npu1, 16 on XDNA2), at most 5 buffer arguments,
the kernel's argument count, buffer flags and group ids, one context per runlist; it models
each launch's time (`npu.xrt.timing`, `clock`), and it can be told to fail device opens, to
hang a run until its wait times out, to abort or error a run, and to lose a device. An
"xclbin" for it is a JSON file: {"uuid", "kernels"}.
"""

from __future__ import annotations

import enum
import json
import uuid as uuid_mod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from npu.xrt.timing import Clock, TimingModel

MAX_BUFFERS = 5
KernelFn = Callable[..., None]


class SimulatorError(RuntimeError):
    """What pyxrt would raise (it raises RuntimeError subclasses)."""


class xclBOSyncDirection(enum.IntEnum):  # noqa: N801  (pyxrt's name)
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1


class ert_cmd_state(enum.IntEnum):  # noqa: N801
    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_RUNNING = 3
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_TIMEOUT = 9


class xrt_info_device(enum.IntEnum):  # noqa: N801
    bdf = 0
    name = 1


class _Flags(enum.IntEnum):
    normal = 0
    cacheable = 1
    host_only = 2
    device_only = 3


class Faults:
    """What to break: counts are consumed as faults happen."""

    def __init__(self) -> None:
        self.fail_opens = 0
        self.timeouts = 0  # the run's wait returns TIMEOUT at once
        self.hangs = 0  # the run never completes: its wait times out after timeout_ms
        self.aborts = 0
        self.errors = 0
        self.lost_devices: set[int] = set()


def context_limit(name: str) -> int:
    return 6 if "npu1" in name.lower() or "phoenix" in name.lower() else 16


class Simulator:
    """A pyxrt-like module. `devices` are the device names it shows (one per NPU)."""

    xclBOSyncDirection = xclBOSyncDirection
    ert_cmd_state = ert_cmd_state
    xrt_info_device = xrt_info_device

    # Over 200 lines, on purpose: pyxrt's classes (device, xclbin, hw_context, bo, kernel,
    # run, runlist) are made here, one set per Simulator and closed over its state, as the
    # real module's are bound to one driver; code written against pyxrt then runs unchanged.
    # (The NPU issue, 30, reworks this simulator against pyxrt.cpp: split it there.)
    def __init__(self, devices: list[str] | None = None, *, runlist: bool = True,
                 timing: TimingModel | None = None) -> None:
        self.device_names = list(devices if devices is not None else ["RyzenAI-npu4"])
        self.faults = Faults()
        self.kernels: dict[tuple[str, str], tuple[int, KernelFn]] = {}
        self.runs = 0
        self.clock = Clock(timing or TimingModel())
        has_runlist = runlist  # (the name is the class's below)
        sim = self

        class device:  # noqa: N801
            def __init__(self, index: int) -> None:
                if index >= len(sim.device_names) or index < 0:
                    raise SimulatorError(f"No such device {index}")
                if sim.faults.fail_opens > 0:
                    sim.faults.fail_opens -= 1
                    raise SimulatorError(f"Failed to open device {index} (simulated)")
                self.index = index
                self.registered: dict[str, Any] = {}
                self.contexts = 0

            def register_xclbin(self, xb: Any) -> Any:
                self.registered[xb.uuid] = xb
                return xb.get_uuid()

            def get_info(self, key: Any) -> str:
                if sim._lost(self):
                    raise SimulatorError("device lost")
                if key == xrt_info_device.name:
                    return sim.device_names[self.index]
                if key == xrt_info_device.bdf:
                    return f"0000:{0xc4 + self.index:02x}:00.1"
                raise SimulatorError(f"unsupported info key {key}")

        class xclbin:  # noqa: N801
            def __init__(self, path: str) -> None:
                self.uuid, self._kernels = _read_binary(path, "xclbin")

            def get_uuid(self) -> str:
                return self.uuid

            def get_kernels(self) -> list:
                return [_KernelInfo(n) for n in self._kernels]

        class elf:  # noqa: N801
            """A full ELF: its kernels are instruction sequences, called with buffers only."""

            def __init__(self, path: str) -> None:
                self.uuid, self.kernels = _read_binary(path, "ELF")

        class hw_context:  # noqa: N801
            def __init__(self, dev: Any, xuuid: Any) -> None:
                if sim._lost(dev):
                    raise SimulatorError("device lost")
                self.elf = isinstance(xuuid, elf)
                if self.elf:
                    xuuid = xuuid.uuid
                elif xuuid not in dev.registered:
                    raise SimulatorError("xclbin not registered on this device")
                limit = context_limit(sim.device_names[dev.index])
                if dev.contexts >= limit:
                    raise SimulatorError(f"No free hardware context ({limit} in use)")
                dev.contexts += 1
                self.device = dev
                self.uuid = xuuid

        class bo:  # noqa: N801
            flags = _Flags
            normal = _Flags.normal
            cacheable = _Flags.cacheable
            host_only = _Flags.host_only
            device_only = _Flags.device_only

            def __init__(self, dev: Any, size: int, flags: Any, group: int) -> None:
                if size <= 0:
                    raise SimulatorError("bo size must be positive")
                self.device, self.size, self.flags, self.group = dev, int(size), flags, group
                self.host = np.zeros(self.size, dtype=np.uint8)
                self.dev = np.zeros(self.size, dtype=np.uint8)
                self.synced: list[tuple[int, int]] = []  # to the device since the last run
                self.version = 0  # bumped by every sync to the device

            def write(self, data: Any, offset: int) -> None:
                raw = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray)
                                    else data.tobytes(), dtype=np.uint8)
                if offset + raw.size > self.size:
                    raise SimulatorError("write past the end of the bo")
                self.host[offset : offset + raw.size] = raw

            def read(self, size: int, offset: int) -> np.ndarray:
                return self.host[offset : offset + size].copy()

            def map(self) -> memoryview:
                return memoryview(self.host)

            def sync(self, direction: Any, size: int | None = None, offset: int = 0) -> None:
                if sim._lost(self.device):
                    raise SimulatorError("device lost")
                end = self.size if size is None else offset + size
                if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
                    self.dev[offset:end] = self.host[offset:end]
                    self.synced.append((offset, end))
                    self.version += 1
                else:
                    self.host[offset:end] = self.dev[offset:end]

        class kernel:  # noqa: N801
            def __init__(self, ctx: Any, name: str) -> None:
                key = (ctx.uuid, name)
                if key not in sim.kernels or ctx.elf:
                    raise SimulatorError(f"No kernel {name!r} in the xclbin")
                self.ctx, self.name, self.elf = ctx, name, False
                self.n_args, self.fn = sim.kernels[key]

            def group_id(self, arg: int) -> int:
                if not 0 <= arg < self.n_args:
                    raise SimulatorError(f"kernel {self.name} has no argument {arg}")
                return 0 if self.elf else arg

            def check(self, args: tuple) -> None:
                if len(args) != self.n_args:
                    raise SimulatorError(f"kernel {self.name} takes {self.n_args} arguments, "
                                         f"got {len(args)}")
                for i, a in enumerate(args):
                    if self.elf and not isinstance(a, bo):
                        raise SimulatorError(f"argument {i}: an ELF kernel takes buffers only "
                                             "(no opcode or instruction arguments)")
                    if isinstance(a, bo):
                        if a.group != self.group_id(i):
                            raise SimulatorError(f"argument {i}: bo in group {a.group}, the "
                                                 f"kernel wants group {self.group_id(i)}")
                        want = (_Flags.cacheable if i == 1 and not self.elf
                                else _Flags.host_only)
                        if a.flags != want:
                            raise SimulatorError(f"argument {i}: bo flags {a.flags!r}, "
                                                 f"expected {want!r}")

            def __call__(self, *args: Any) -> Any:
                self.check(args)
                return _Run(sim, self, args, in_runlist=False)

        xclbin_kernel = kernel

        class ext:  # noqa: N801
            class kernel(xclbin_kernel):  # noqa: N801
                """A kernel (instruction sequence) of a full ELF's context."""

                def __init__(self, ctx: Any, name: str) -> None:
                    key = (ctx.uuid, name)
                    if key not in sim.kernels or not ctx.elf:
                        raise SimulatorError(f"No kernel {name!r} in the ELF")
                    self.ctx, self.name, self.elf = ctx, name, True
                    self.n_args, self.fn = sim.kernels[key]

        class run:  # noqa: N801
            """A run built argument by argument (for runlists, and ELF kernels)."""

            def __init__(self, k: Any) -> None:
                self.kernel = k
                self.args: list[Any] = [None] * k.n_args
                self.done: _Run | None = None

            def set_arg(self, index: int, value: Any) -> None:
                if not 0 <= index < self.kernel.n_args:
                    raise SimulatorError(f"kernel {self.kernel.name} has no argument {index}")
                self.args[index] = value

            def start(self) -> None:
                args = tuple(self.args)
                self.kernel.check(args)
                self.done = _Run(sim, self.kernel, args, in_runlist=False)

            def wait(self, timeout_ms: int = 0) -> ert_cmd_state:
                if self.done is None:
                    raise SimulatorError("the run was not started")
                return self.done.wait(timeout_ms)

            def state(self) -> ert_cmd_state:
                return ert_cmd_state.ERT_CMD_STATE_NEW if self.done is None else self.done.state

        class runlist:  # noqa: N801
            """Runs submitted together on one hardware context."""

            def __init__(self, ctx: Any) -> None:
                self.ctx = ctx
                self.runs: list[Any] = []
                self.state = ert_cmd_state.ERT_CMD_STATE_NEW

            def add(self, r: Any) -> None:
                if r.kernel.ctx is not self.ctx:
                    raise SimulatorError("a runlist takes runs of its own hardware context")
                self.runs.append(r)

            def execute(self) -> None:
                self.state = ert_cmd_state.ERT_CMD_STATE_COMPLETED
                self.hung = False
                for r in self.runs:
                    r.done = None
                for r in self.runs:
                    args = tuple(r.args)
                    r.kernel.check(args)
                    r.done = done = _Run(sim, r.kernel, args, in_runlist=True)
                    if done.state != ert_cmd_state.ERT_CMD_STATE_COMPLETED:
                        self.state, self.hung = done.state, done.hung
                        break

            def wait(self, timeout_ms: int = 0) -> ert_cmd_state:
                if self.hung:
                    sim.clock.wait(timeout_ms / 1000)
                return self.state

        self.device, self.xclbin, self.elf, self.hw_context = device, xclbin, elf, hw_context
        self.bo, self.kernel, self.ext = bo, kernel, ext
        self.run = run
        if has_runlist:  # older XRT builds' pyxrt has no runlist
            self.runlist = runlist

    def register_kernel(self, xclbin_uuid: str, name: str, n_args: int, fn: KernelFn, *,
                        elf: bool = False) -> None:
        """`fn(*args)` gets ints as ints and bos as bos (`.dev`: device memory, uint8;
        `.synced`: the byte ranges synced to the device since the last run); it returns the
        bytes the launch reads from memory (for the timing model). An xclbin's kernel takes
        (opcode, instructions, their length, buffers...); an ELF's (`elf`) buffers only."""
        buffers = n_args if elf else n_args - 3
        if buffers > MAX_BUFFERS:
            raise SimulatorError(f"kernel {name}: {buffers} buffer arguments; an NPU kernel "
                                 f"takes at most {MAX_BUFFERS}")
        self.kernels[(xclbin_uuid, name)] = (n_args, fn)

    def lose_device(self, index: int) -> None:
        self.faults.lost_devices.add(index)

    def _lost(self, dev: Any) -> bool:
        return dev.index in self.faults.lost_devices


class _KernelInfo:
    def __init__(self, name: str) -> None:
        self._name = name

    def get_name(self) -> str:
        return self._name


class _Run:
    def __init__(self, sim: Simulator, k: Any, args: tuple, *, in_runlist: bool) -> None:
        self.state = ert_cmd_state.ERT_CMD_STATE_COMPLETED
        self.hung = False
        self.sim = sim
        f = sim.faults
        sim.runs += 1
        if sim._lost(k.ctx.device):
            self.state = ert_cmd_state.ERT_CMD_STATE_ABORT
        elif f.timeouts > 0:
            f.timeouts -= 1
            self.state = ert_cmd_state.ERT_CMD_STATE_TIMEOUT
        elif f.hangs > 0:
            f.hangs -= 1
            self.state, self.hung = ert_cmd_state.ERT_CMD_STATE_TIMEOUT, True
        elif f.aborts > 0:
            f.aborts -= 1
            self.state = ert_cmd_state.ERT_CMD_STATE_ABORT
        elif f.errors > 0:
            f.errors -= 1
            self.state = ert_cmd_state.ERT_CMD_STATE_ERROR
        else:
            nbytes = k.fn(*args)
            sim.clock.launch(k.ctx, int(nbytes or 0), in_runlist=in_runlist)
            for a in args:
                if hasattr(a, "synced"):
                    a.synced.clear()

    def wait(self, timeout_ms: int = 0) -> ert_cmd_state:
        if self.hung:  # the command never completes: the wait returns at its timeout
            self.sim.clock.wait(timeout_ms / 1000)
        return self.state


def _read_binary(path: str, what: str) -> tuple[str, list[str]]:
    """(uuid, kernel names) of a simulator xclbin or ELF file."""
    try:
        data = json.loads(Path(path).read_text())
        return str(data["uuid"]), list(data["kernels"])
    except (OSError, ValueError, KeyError) as exc:
        raise SimulatorError(f"Failed to load {what} {path}: {exc}") from None


def write_xclbin(path: Path, kernels: list[str]) -> str:
    """Write a simulator xclbin (or full ELF: the same file); returns its uuid."""
    xuuid = str(uuid_mod.uuid4())
    path.write_text(json.dumps({"uuid": xuuid, "kernels": kernels}))
    return xuuid
