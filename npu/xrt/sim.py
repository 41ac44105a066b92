"""A simulator of the pyxrt calls flm-serve makes, for CI and development without an NPU.

`Simulator()` is a stand-in for the `pyxrt` module: the names and argument forms of XRT's
pybind11 bindings (`src/python/pybind11/src/pyxrt.cpp`, read at Xilinx/XRT@963c58ee, XRT
2.26; `tests/npu/xrt/pyxrt_table.py` lists the forms), and it rejects with a `TypeError`
what those bindings would not convert: a runlist's `wait` takes no argument from Python
(its timeout is a `std::chrono::milliseconds` and pyxrt does not include pybind11's chrono
casters), `bo.sync` takes the direction alone or with size and offset, paths are `str`, sizes and
offsets are unsigned (`size_t`). A read, write or sync past a buffer's end fails, as XRT's
`bo::read` / `bo::write` and the amdxdna shim's `sync` (EINVAL) do.
Failures are as XRT's: a single run's `wait` returns its `ert_cmd_state`; a runlist's
`wait` raises (XRT's `runlist::command_error`, a RuntimeError in Python) and blocks while
a run hangs; `state()` may not be called on a run of a runlist (`xrt_kernel.h`). The
module is the XRT `version` given (`xrt_version`): `hw_context(device, elf)` from 2.23.

Its kernels are numpy callables registered per (xclbin uuid, kernel name)
(`npu.xrt.sim_kernels` has the ones a kernel directory describes). Device memory is
separate from host memory, so a missing `sync` gives wrong results as it would on hardware,
and a kernel can tell which bytes of a buffer were synced since its last run. It enforces
the context limit (6 on Phoenix/npu1, 16 on XDNA2), at most 5 buffer arguments, the
kernel's declared arguments (pyxrt's `kernel(...)` drops what it cannot set, and the
device then runs on what it holds: here an error), buffer flags and group ids, one context
per runlist; it models each launch's time (`npu.xrt.timing`, `clock`), and it can be told
to fail device opens, to hang, abort or error a run, and to lose a device. An "xclbin" for
it is a JSON file: {"uuid", "kernels"}.
"""

from __future__ import annotations

import enum
import json
import threading
import uuid as uuid_mod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from npu.xrt.timing import Clock, TimingModel

MAX_BUFFERS = 5
XRT_VERSION = "2.26.0"
ELF_CONTEXT_VERSION = (2, 23)
HANG_LIMIT_S = 60.0  # a hung wait without a timeout returns after this (real) time, raising
KernelFn = Callable[..., None]


class SimulatorError(RuntimeError):
    """What pyxrt would raise (XRT's exceptions reach Python as RuntimeError)."""


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
        self.timeouts = 0  # the run ends in ERT_CMD_STATE_TIMEOUT at once
        self.hangs = 0  # the run never completes: waits block (or time out)
        self.aborts = 0
        self.errors = 0
        self.lost_devices: set[int] = set()


def context_limit(name: str) -> int:
    return 6 if "npu1" in name.lower() or "phoenix" in name.lower() else 16


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


def _forms(what: str, got: tuple, *forms: str) -> TypeError:
    """pybind11's error when no overload converts the arguments."""
    kinds = ", ".join(type(a).__name__ for a in got)
    return TypeError(f"{what}(): incompatible function arguments. The following argument "
                     f"types are supported: {'; '.join(forms)}. Invoked with: {kinds}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | enum.Enum)


def _is_size(value: Any) -> bool:
    """A value pybind11 converts to a `size_t` (no negative ones)."""
    return _is_int(value) and value >= 0


class _Bound:
    """A pyxrt class bound to one Simulator (`sim`), as the real ones are to one driver."""

    sim: Simulator


class uuid:  # noqa: N801
    def __init__(self, text: str) -> None:
        self.text = text

    def to_string(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, uuid) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


class _Device(_Bound):
    def __init__(self, index: Any) -> None:
        if not _is_int(index):
            raise _forms("device", (index,), "(index: int)", "(bdf: str)")
        sim = self.sim
        if index >= len(sim.device_names) or index < 0:
            raise SimulatorError(f"No such device {index}")
        if sim.faults.fail_opens > 0:
            sim.faults.fail_opens -= 1
            raise SimulatorError(f"Failed to open device {index} (simulated)")
        self.index = int(index)
        self.registered: dict[str, Any] = {}
        self.contexts = 0

    def register_xclbin(self, xb: Any) -> uuid:
        if not isinstance(xb, _Xclbin):
            raise _forms("register_xclbin", (xb,), "(xclbin: pyxrt.xclbin)")
        self.registered[xb.uuid] = xb
        return xb.get_uuid()

    def get_info(self, key: Any) -> str:
        if not isinstance(key, xrt_info_device):
            raise _forms("get_info", (key,), "(key: pyxrt.xrt_info_device)")
        if self.sim.lost(self):
            raise SimulatorError("device lost")
        if key == xrt_info_device.name:
            return self.sim.device_names[self.index]
        return f"0000:{0xc4 + self.index:02x}:00.1"


class _XclbinKernel:
    def __init__(self, name: str, n_args: int) -> None:
        self._name, self._n_args = name, n_args

    def get_name(self) -> str:
        return self._name

    def get_num_args(self) -> int:
        return self._n_args


def _read_binary(path: Any, what: str) -> tuple[str, list[str]]:
    """(uuid, kernel names) of a simulator xclbin or ELF file."""
    if not isinstance(path, str):
        raise _forms(what, (path,), "(filename: str)")
    try:
        data = json.loads(Path(path).read_text())
        return str(data["uuid"]), list(data["kernels"])
    except (OSError, ValueError, KeyError) as exc:
        raise SimulatorError(f"Failed to load {what} {path}: {exc}") from None


class _Xclbin(_Bound):
    def __init__(self, path: Any) -> None:
        self.uuid, self._kernels = _read_binary(path, "xclbin")

    def get_uuid(self) -> uuid:
        return uuid(self.uuid)

    def get_kernels(self) -> list[_XclbinKernel]:
        return [_XclbinKernel(n, self.sim.kernels.get((self.uuid, n), (0, None))[0])
                for n in self._kernels]


class _Elf(_Bound):
    """A full ELF: its kernels are instruction sequences, called with buffers only."""

    def __init__(self, path: Any) -> None:
        self.uuid, self.kernels = _read_binary(path, "elf")


class _HwContext(_Bound):
    def __init__(self, dev: Any, binary: Any) -> None:
        sim = self.sim
        self.elf = isinstance(binary, _Elf)
        elf_ok = version_tuple(sim.xrt_version) >= ELF_CONTEXT_VERSION
        if not isinstance(dev, _Device) or not (isinstance(binary, uuid) or (
                self.elf and elf_ok)):
            forms = ["(device, uuid: pyxrt.uuid)"] + (["(device, elf)"] if elf_ok else [])
            raise _forms("hw_context", (dev, binary), *forms)
        if sim.lost(dev):
            raise SimulatorError("device lost")
        key = binary.uuid if self.elf else binary.text
        if not self.elf and key not in dev.registered:
            raise SimulatorError("xclbin not registered on this device")
        limit = context_limit(sim.device_names[dev.index])
        if dev.contexts >= limit:
            raise SimulatorError(f"No free hardware context ({limit} in use)")
        dev.contexts += 1
        self.device, self.uuid = dev, key


class _Bo(_Bound):
    flags = _Flags
    normal = _Flags.normal
    cacheable = _Flags.cacheable
    host_only = _Flags.host_only
    device_only = _Flags.device_only

    def __init__(self, dev: Any, size: Any, flags: Any, group: Any) -> None:
        if not (isinstance(dev, _Device) and _is_size(size) and isinstance(flags, _Flags)
                and _is_size(group)):
            raise _forms("bo", (dev, size, flags, group),
                         "(device, size: int, flags: pyxrt.bo.flags, group: int)")
        if size <= 0:
            raise SimulatorError("bo size must be positive")
        self.device, self.nbytes, self.flags, self.group = dev, int(size), flags, int(group)
        self.host = np.zeros(self.nbytes, dtype=np.uint8)
        self.dev = np.zeros(self.nbytes, dtype=np.uint8)
        self.synced: list[tuple[int, int]] = []  # to the device since the last run
        self.version = 0  # bumped by every sync to the device

    def size(self) -> int:
        return self.nbytes

    def write(self, data: Any, seek: Any) -> None:
        if not isinstance(data, bytes | bytearray | memoryview | np.ndarray) or not \
                _is_size(seek):
            raise _forms("write", (data, seek), "(buffer, seek: int)")
        if not memoryview(data).c_contiguous:  # pyxrt copies itemsize * size bytes from
            # the buffer's start, strides ignored: the device would get other bytes
            raise SimulatorError("write of a non-contiguous buffer: pyxrt copies its memory "
                                 "as it lies, not its elements in order")
        raw = np.frombuffer(data.tobytes() if isinstance(data, np.ndarray) else bytes(data),
                            dtype=np.uint8)
        if seek + raw.size > self.nbytes:  # xrt::bo::write
            raise SimulatorError("attempting to write past buffer size")
        self.host[seek : seek + raw.size] = raw

    def read(self, size: Any, skip: Any) -> np.ndarray:
        if not (_is_size(size) and _is_size(skip)):
            raise _forms("read", (size, skip), "(size: int, skip: int)")
        if size + skip > self.nbytes:  # xrt::bo::read
            raise SimulatorError("attempting to read past buffer size")
        return self.host[skip : skip + size].view(np.int8).copy()  # py::array_t<char>

    def map(self) -> memoryview:
        return memoryview(self.host)

    def sync(self, direction: Any, *size_offset: Any) -> None:
        if not isinstance(direction, xclBOSyncDirection) or len(size_offset) not in (0, 2) \
                or not all(_is_size(v) for v in size_offset):
            raise _forms("sync", (direction, *size_offset), "(dir)",
                         "(dir, size: int, offset: int)")
        if self.sim.lost(self.device):
            raise SimulatorError("device lost")
        size, offset = size_offset or (self.nbytes, 0)
        if offset + size > self.nbytes:  # the amdxdna shim's buffer::sync: EINVAL
            raise SimulatorError(f"Invalid BO offset and size for sync'ing: {offset}, {size}")
        end = offset + size
        if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
            self.dev[offset:end] = self.host[offset:end]
            self.synced.append((offset, end))
            self.version += 1
        else:
            self.host[offset:end] = self.dev[offset:end]


class _Kernel(_Bound):
    elf = False

    def __init__(self, ctx: Any, name: Any) -> None:
        if not (isinstance(ctx, _HwContext) and isinstance(name, str)):
            raise _forms("kernel", (ctx, name), "(hw_context, name: str)")
        key = (ctx.uuid, name)
        if key not in self.sim.kernels or ctx.elf != self.elf:
            raise SimulatorError(f"No kernel {name!r} in the {'ELF' if self.elf else 'xclbin'}")
        self.ctx, self.name = ctx, name
        self.n_args, self.fn = self.sim.kernels[key]
        self.scratch_words = self.sim.scratchpads.get(key, 0)

    def group_id(self, arg: Any) -> int:
        if not _is_int(arg):
            raise _forms("group_id", (arg,), "(argno: int)")
        if not 0 <= arg < self.n_args:
            raise SimulatorError(f"kernel {self.name} has no argument {arg}")
        return 0 if self.elf else int(arg)

    def check(self, args: tuple) -> None:
        """What the device would get wrong: XRT sets what it can and launches."""
        if len(args) > self.n_args:
            raise SimulatorError(f"kernel {self.name} declares {self.n_args} arguments, got "
                                 f"{len(args)} (pyxrt cannot set the rest)")
        for i, a in enumerate(args):
            if a is None:
                raise SimulatorError(f"kernel {self.name}: argument {i} is not set")
            if not (isinstance(a, _Bo) or _is_int(a)):
                raise SimulatorError(f"kernel {self.name}: argument {i} is a "
                                     f"{type(a).__name__}, which pyxrt drops")
            if self.elf and not isinstance(a, _Bo):
                raise SimulatorError(f"argument {i}: an ELF kernel takes buffers only "
                                     "(no opcode or instruction arguments)")
            if isinstance(a, _Bo):
                if a.group != self.group_id(i):
                    raise SimulatorError(f"argument {i}: bo in group {a.group}, the "
                                         f"kernel wants group {self.group_id(i)}")
                want = _Flags.cacheable if i == 1 and not self.elf else _Flags.host_only
                if a.flags != want:
                    raise SimulatorError(f"argument {i}: bo flags {a.flags!r}, "
                                         f"expected {want!r}")
        if len(args) < self.n_args:
            raise SimulatorError(f"kernel {self.name}: argument {len(args)} is not set")

    def __call__(self, *args: Any) -> Any:
        r = self.sim.run(self)
        r.args = list(args)  # set argument by argument, as pyxrt does
        r.start()
        return r


class _ExtKernel(_Kernel):
    """A kernel (instruction sequence) of a full ELF's context."""

    elf = True


class _Launch:
    """One execution on the device: its end state, and whether it hangs."""

    def __init__(self, sim: Simulator, k: Any, args: tuple, *, in_runlist: bool,
                 run: Any = None) -> None:
        self.state = ert_cmd_state.ERT_CMD_STATE_COMPLETED
        self.hung = False
        f = sim.faults
        sim.runs += 1
        if sim.lost(k.ctx.device):
            self.state = ert_cmd_state.ERT_CMD_STATE_ABORT
        elif f.timeouts > 0:
            f.timeouts -= 1
            self.state = ert_cmd_state.ERT_CMD_STATE_TIMEOUT
        elif f.hangs > 0:
            f.hangs -= 1
            self.state, self.hung = ert_cmd_state.ERT_CMD_STATE_RUNNING, True
        elif f.aborts > 0:
            f.aborts -= 1
            self.state = ert_cmd_state.ERT_CMD_STATE_ABORT
        elif f.errors > 0:
            f.errors -= 1
            self.state = ert_cmd_state.ERT_CMD_STATE_ERROR
        else:
            extra = {}
            if k.scratch_words:  # the firmware applies the scratchpad as the run starts
                extra["ctrl"] = run.apply_scratchpad()
            nbytes = k.fn(*args, **extra)
            sim.clock.launch(k.ctx, int(nbytes or 0), in_runlist=in_runlist,
                             gbps=sim.gbps.get((k.ctx.uuid, k.name), 0.0))
            for a in args:
                if isinstance(a, _Bo):
                    a.synced.clear()


class _Run(_Bound):
    """A run built argument by argument (for runlists, and ELF kernels)."""

    def __init__(self, k: Any) -> None:
        if not isinstance(k, _Kernel):
            raise _forms("run", (k,), "(kernel)")
        self.kernel = k
        self.args: list[Any] = [None] * k.n_args
        self.launch: _Launch | None = None
        self.runlist: Any = None
        self._ctrl: Any = None  # the control scratchpad's bo, made on first ask
        self._registers = np.zeros(k.scratch_words, dtype=np.uint32)

    def get_ctrl_scratchpad_bo(self) -> Any:
        """This run's control scratchpad (XRT throws for a run of an xclbin kernel, or of an
        ELF without a scratchpad section)."""
        k = self.kernel
        if not k.elf or not k.scratch_words:
            raise SimulatorError("no control scratchpad: " + (
                "the ELF has no scratchpad section" if k.elf else
                "get_ctrl_scratchpad_bo is only valid for runs of an ELF kernel"))
        if self._ctrl is None:
            self._ctrl = self.sim.bo(k.ctx.device, 4 * k.scratch_words, _Flags.host_only, 0)
        return self._ctrl

    def apply_scratchpad(self) -> tuple[np.ndarray, np.ndarray]:
        """(the words on the device, the registers they add up to): `core` values reach
        the cores through UPDATE_REG increments, accumulated per run handle from zero."""
        raw = (self._ctrl.dev.view(np.uint32).copy() if self._ctrl is not None
               else np.zeros(self.kernel.scratch_words, dtype=np.uint32))
        self._registers = (self._registers + raw).astype(np.uint32)  # modulo 2^32
        return raw, self._registers.copy()

    def set_arg(self, index: Any, value: Any) -> None:
        if not (_is_int(index) and (isinstance(value, _Bo) or _is_int(value))):
            raise _forms("set_arg", (index, value), "(index: int, bo)", "(index: int, int)")
        if not 0 <= index < self.kernel.n_args:
            raise SimulatorError(f"kernel {self.kernel.name} has no argument {index}")
        self.args[index] = value

    def start(self) -> None:
        if self.runlist is not None:
            raise SimulatorError("a run of a runlist is started by the runlist")
        args = tuple(self.args)
        self.kernel.check(args)
        self.launch = _Launch(self.sim, self.kernel, args, in_runlist=False, run=self)

    def wait(self, *timeout_ms: Any) -> ert_cmd_state:
        if len(timeout_ms) > 1 or not all(_is_int(t) and t >= 0 for t in timeout_ms):
            raise _forms("wait", timeout_ms, "()", "(timeout_ms: unsigned int)")
        if self.launch is None:
            raise SimulatorError("the run was not started")
        if self.launch.hung:
            ms = timeout_ms[0] if timeout_ms else 0
            if ms == 0:  # blocks until the command completes: never
                self.sim.block()
            self.sim.clock.wait(ms / 1000)
            return ert_cmd_state.ERT_CMD_STATE_TIMEOUT
        return self.launch.state

    def state(self) -> ert_cmd_state:
        if self.runlist is not None:
            raise SimulatorError("state() cannot be called for a run that is part of a "
                                 "runlist (xrt_kernel.h)")
        return ert_cmd_state.ERT_CMD_STATE_NEW if self.launch is None else self.launch.state


class _RunBefore225(_Run):
    """pyxrt.run before XRT 2.25 (6dd06dc947): no get_ctrl_scratchpad_bo binding."""

    @property
    def get_ctrl_scratchpad_bo(self) -> Any:
        raise AttributeError("'pyxrt.run' object has no attribute 'get_ctrl_scratchpad_bo'")


class _Runlist(_Bound):
    """Runs submitted together on one hardware context; `wait()` raises on a failed run."""

    def __init__(self, ctx: Any) -> None:
        if not isinstance(ctx, _HwContext):
            raise _forms("runlist", (ctx,), "()", "(hwctx)")
        self.ctx = ctx
        self.runs: list[_Run] = []
        self.executing = False
        self.failed: _Launch | None = None

    def add(self, r: Any) -> None:
        if not isinstance(r, _Run):
            raise _forms("add", (r,), "(run)")
        if r.kernel.ctx is not self.ctx:
            raise SimulatorError("a runlist takes runs of its own hardware context")
        if r.runlist is not None or self.executing:
            raise SimulatorError("the run is already in a runlist" if r.runlist is not None
                                 else "the runlist is executing")
        r.runlist = self
        self.runs.append(r)

    def execute(self) -> None:
        if self.executing:
            raise SimulatorError("the runlist is already executing")
        self.executing, self.failed = True, None
        for r in self.runs:
            args = tuple(r.args)
            r.kernel.check(args)
            r.launch = done = _Launch(self.sim, r.kernel, args, in_runlist=True, run=r)
            if done.state != ert_cmd_state.ERT_CMD_STATE_COMPLETED:
                self.failed = done
                break

    def wait(self, *args: Any) -> None:
        if args:  # a std::chrono::milliseconds: pyxrt does not include pybind11/chrono.h
            raise _forms("wait", args, "()")
        try:
            if self.failed is not None and self.failed.hung:
                self.sim.block()
                raise SimulatorError("the runlist never completed (simulated hang)")
            if self.failed is not None:
                raise SimulatorError(f"runlist command failed: {self.failed.state.name}")
        finally:
            self.executing = False


def _bind(cls: type, sim: Simulator) -> type:
    name = cls.__name__.lstrip("_").lower()
    names = {"xclbin": "xclbin", "hwcontext": "hw_context", "extkernel": "kernel"}
    return type(names.get(name, name), (cls,), {"sim": sim})


class Simulator:
    """A pyxrt-like module. `devices` are the device names it shows (one per NPU); `version`
    the XRT it stands for; `runlist` False leaves out the runlist binding (XRT < 2.21),
    `scratchpad` False run.get_ctrl_scratchpad_bo (XRT < 2.25)."""

    xclBOSyncDirection = xclBOSyncDirection
    ert_cmd_state = ert_cmd_state
    xrt_info_device = xrt_info_device
    uuid = uuid

    def __init__(self, devices: list[str] | None = None, *, version: str = XRT_VERSION,
                 runlist: bool = True, scratchpad: bool = True,
                 timing: TimingModel | None = None) -> None:
        self.device_names = list(devices if devices is not None else ["RyzenAI-npu4"])
        self.xrt_version = version
        self.faults = Faults()
        self.kernels: dict[tuple[str, str], tuple[int, KernelFn]] = {}
        self.gbps: dict[tuple[str, str], float] = {}  # a kernel's own bandwidth
        self.scratchpads: dict[tuple[str, str], int] = {}  # an ELF kernel's scratchpad words
        self.runs = 0
        self.clock = Clock(timing or TimingModel())
        self._released = threading.Event()
        self.device, self.xclbin, self.elf = (_bind(c, self) for c in (_Device, _Xclbin, _Elf))
        self.hw_context, self.bo, self.kernel = (_bind(c, self)
                                                 for c in (_HwContext, _Bo, _Kernel))
        self.run = _bind(_Run if scratchpad else _RunBefore225, self)
        self.ext = type("ext", (), {"kernel": _bind(_ExtKernel, self)})
        if runlist:  # older XRT builds' pyxrt has no runlist
            self.runlist = _bind(_Runlist, self)

    def register_kernel(self, xclbin_uuid: str, name: str, n_args: int, fn: KernelFn, *,
                        elf: bool = False, gbps: float = 0.0, scratchpad_words: int = 0
                        ) -> None:
        """`fn(*args)` gets ints as ints and bos as bos (`.dev`: device memory, uint8;
        `.synced`: the byte ranges synced to the device since the last run); it returns the
        bytes the launch reads from memory (for the timing model). An xclbin's kernel takes
        (opcode, instructions, their length, buffers...); an ELF's (`elf`) buffers only.
        `gbps`: the bandwidth its launches read at (0: the timing model's).
        `scratchpad_words` (ELF kernels): its control scratchpad's size; `fn` then also gets
        `ctrl=(words, registers)` (`_Run.apply_scratchpad`)."""
        buffers = n_args if elf else n_args - 3
        if buffers > MAX_BUFFERS:
            raise SimulatorError(f"kernel {name}: {buffers} buffer arguments; an NPU kernel "
                                 f"takes at most {MAX_BUFFERS}")
        if scratchpad_words and not elf:
            raise SimulatorError(f"kernel {name}: a control scratchpad is a full ELF's")
        self.kernels[(xclbin_uuid, name)] = (n_args, fn)
        self.gbps[(xclbin_uuid, name)] = gbps
        self.scratchpads[(xclbin_uuid, name)] = scratchpad_words

    def lose_device(self, index: int) -> None:
        self.faults.lost_devices.add(index)

    def lost(self, dev: Any) -> bool:
        return dev.index in self.faults.lost_devices

    def block(self) -> None:
        """A wait that never ends: until `release()` (or HANG_LIMIT_S of real time)."""
        self._released.wait(HANG_LIMIT_S)

    def release(self) -> None:
        """Let every blocked wait return (a test's cleanup after a simulated hang)."""
        self._released.set()


def write_xclbin(path: Path, kernels: list[str]) -> str:
    """Write a simulator xclbin (or full ELF: the same file); returns its uuid."""
    xuuid = str(uuid_mod.uuid4())
    path.write_text(json.dumps({"uuid": xuuid, "kernels": kernels}))
    return xuuid
