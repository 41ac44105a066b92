"""A recording stand-in for the pyxrt module: it forwards every call to a Simulator and
notes the call's name ("class" for a constructor, "class.method") and argument kinds in the
vocabulary of `tests/npu/xrt/pyxrt_table.py`, so that what our code calls can be checked
against what XRT's bindings define."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

CLASSES = ("device", "xclbin", "elf", "hw_context", "kernel", "run", "runlist", "bo")
ENUMS = ("xclBOSyncDirection", "ert_cmd_state", "xrt_info_device")
# what a call returns, when it is a pyxrt object: its class
RETURNS = {"device.register_xclbin": "uuid", "xclbin.get_uuid": "uuid",
           "kernel.__call__": "run", "run.get_ctrl_scratchpad_bo": "bo"}

Call = tuple[str, tuple[str, ...]]


def kind(value: Any) -> str:
    if isinstance(value, _Object):
        return value.cls
    if isinstance(value, enum.Enum):  # before int: the simulator's enums are IntEnums
        name = type(value).__name__
        return "bo.flags" if name == "_Flags" else name
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | np.integer):
        return "int"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes | bytearray | memoryview | np.ndarray):
        return "buffer"
    return type(value).__name__


def _plain(value: Any) -> Any:
    return value.target if isinstance(value, _Object) else value


class _Object:
    """A pyxrt object: method calls are noted and forwarded."""

    def __init__(self, target: Any, cls: str, calls: list[Call]) -> None:
        self.target, self.cls, self.calls = target, cls, calls

    def _call(self, name: str, fn: Any, args: tuple) -> Any:
        key = f"{self.cls}.{name}"
        self.calls.append((key, tuple(kind(a) for a in args)))
        out = fn(*(_plain(a) for a in args))
        if key == "xclbin.get_kernels":
            return [_Object(k, "xclbinkernel", self.calls) for k in out]
        return _Object(out, RETURNS[key], self.calls) if key in RETURNS else out

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.target, name)
        if not callable(attr):
            return attr
        return lambda *args: self._call(name, attr, args)

    def __call__(self, *args: Any) -> Any:
        return self._call("__call__", self.target, args)


class _Class:
    """A pyxrt class: construction and attribute reads are noted."""

    def __init__(self, target: Any, cls: str, calls: list[Call]) -> None:
        self.target, self.cls, self.calls = target, cls, calls

    def __call__(self, *args: Any) -> _Object:
        self.calls.append((self.cls, tuple(kind(a) for a in args)))
        made = self.target(*(_plain(a) for a in args))
        return _Object(made, "kernel" if self.cls == "ext.kernel" else self.cls, self.calls)

    def __getattr__(self, name: str) -> Any:
        self.calls.append((f"{self.cls}.{name}", ("attribute",)))
        return getattr(self.target, name)

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(_plain(obj), self.target)


class _Namespace:
    def __init__(self, target: Any, prefix: str, calls: list[Call]) -> None:
        self.target, self.prefix, self.calls = target, prefix, calls

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.target, name)
        if self.prefix == "ext":
            return _Class(value, f"ext.{name}", self.calls)
        self.calls.append((f"{self.prefix}.{name}", ("attribute",)))
        return value


class RecordingPyxrt:
    """`RecordingPyxrt(sim)` for `XRT(...)`; `.calls` lists (name, argument kinds)."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.calls: list[Call] = []
        self.xrt_version = module.xrt_version  # the simulator's: pyxrt has no such name

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)  # AttributeError where the module lacks it
        if name in CLASSES:
            return _Class(value, name, self.calls)
        if name in ENUMS or name == "ext":
            return _Namespace(value, name, self.calls)
        raise AttributeError(f"{name!r} is not a pyxrt name this recorder knows")
