"""Conformance with XRT's Python bindings (tests/npu/xrt/pyxrt_table.py, from pyxrt.cpp at
a named XRT commit): the adapter calls pyxrt in no form the bindings lack, and the
simulator accepts the bindings' forms and rejects, with pybind11's TypeError, what they
would not convert."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pytest

from npu import config_from_json, load_model
from npu.xrt import XRT, XRTError
from npu.xrt.sim import Simulator, SimulatorError, write_xclbin
from npu.xrt.sim_kernels import make_kernel_dir, simulator_for
from tests.npu.xrt import pyxrt_table as table
from tests.npu.xrt.pyxrt_recorder import RecordingPyxrt

Call = tuple[str, tuple[str, ...]]


def conforms(call: Call, version: tuple[int, ...] = (2, 26)) -> bool:
    key, kinds = call
    if kinds == ("attribute",):
        return key in table.ATTRIBUTES
    if key == "kernel.__call__":
        return all(k in table.ARGS_OF_CALL for k in kinds)
    if (key, kinds) in table.UNREACHABLE or kinds not in table.FORMS.get(key, []):
        return False
    since = table.SINCE.get((key, kinds), table.SINCE.get((key.split(".")[0], None), (0,)))
    return version >= since


def test_the_table_is_what_the_checker_reads() -> None:
    assert table.XRT_COMMIT.startswith("963c58ee")
    assert conforms(("runlist.wait", ()))
    assert conforms(("run.wait", ("int",)))
    assert conforms(("kernel.__call__", ("int", "bo", "int", "bo")))
    assert conforms(("bo.sync", ("xclBOSyncDirection", "int", "int")))
    # what the adapter used to do, and what pyxrt would refuse or drop
    assert not conforms(("runlist.wait", ("int",)))
    assert not conforms(("runlist.wait", ("chrono.milliseconds",)))
    assert not conforms(("runlist.state", ()))
    assert not conforms(("bo.sync", ("xclBOSyncDirection", "int")))
    assert not conforms(("kernel.__call__", ("int", "float")))
    assert not conforms(("xclbin", ("PosixPath",)))
    assert not conforms(("hw_context", ("device", "elf")), (2, 22))
    assert not conforms(("runlist", ("hw_context",)), (2, 20))
    assert not conforms(("bo.nbytes", ("attribute",)))
    assert conforms(("run.get_ctrl_scratchpad_bo", ()))
    assert not conforms(("run.get_ctrl_scratchpad_bo", ()), (2, 24))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from npu.load.tiny import ensure_tiny

    return ensure_tiny(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def kdirs(tmp_path_factory, tiny: Path) -> dict[str, Path]:
    cfg = config_from_json(json.loads((tiny / "config.json").read_text()))
    root = tmp_path_factory.mktemp("k")
    out = {fmt: make_kernel_dir(root / fmt, [cfg], weights="bf16", ctx=64, instr_format=fmt,
                                ops=("gemv", "gemm", "layer"))
           for fmt in ("bin", "elf")}
    out["scratchpad"] = make_kernel_dir(root / "scratchpad", [cfg], weights="bf16", ctx=64,
                                        instr_format="elf", scalars="scratchpad",
                                        ops=("gemv", "gemm", "layer"))
    return out


@pytest.mark.parametrize("fmt,mode,runlist", [
    ("bin", "linear", True), ("bin", "layer", True), ("bin", "layer", False),
    ("elf", "layer", True), ("elf", "linear", False), ("scratchpad", "layer", True),
    ("scratchpad", "layer", False),
])
def test_the_adapter_calls_pyxrt_only_in_the_bindings_forms(tiny, kdirs, fmt: str, mode: str,
                                                            runlist: bool) -> None:
    pyxrt = RecordingPyxrt(simulator_for(kdirs[fmt], ["NPU Strix"], runlist=runlist))
    xrt = XRT(pyxrt)
    model = load_model(tiny, "npu", kernel_dir=kdirs[fmt], xrt=xrt, npu_mode=mode)
    model.engine.prefill("a", [1, 2, 3])
    model.engine.decode(["a"], [4])
    model.engine.check_device()
    assert [d.generation for d in xrt.enumerate_devices()] == ["XDNA2"]
    outside = sorted({c for c in pyxrt.calls if not conforms(c)})
    assert outside == [], f"calls outside pyxrt.cpp@{table.XRT_COMMIT[:8]}: {outside}"
    names = {key for key, _ in pyxrt.calls}
    if mode == "layer" and runlist:
        assert ("runlist.wait", ()) in pyxrt.calls
        assert "run.state" not in names  # never asked of a runlist's runs
    assert ("hw_context", ("device", "uuid") if fmt == "bin" else ("device", "elf")) \
        in pyxrt.calls
    assert (("run.get_ctrl_scratchpad_bo", ()) in pyxrt.calls) == (fmt == "scratchpad")


class _Rig:
    """A simulator with an xclbin kernel K (opcode, instructions, length, two buffers) and
    a full ELF's kernel main:k (two buffers), opened."""

    def __init__(self, tmp_path: Path, version: str = "2.26.0") -> None:
        s = self.s = Simulator(version=version)
        xb_path, elf_path = tmp_path / "k.xclbin", tmp_path / "k.elf"
        s.register_kernel(write_xclbin(xb_path, ["K"]), "K", 5, lambda *a: 0)
        s.register_kernel(write_xclbin(elf_path, ["main:k"]), "main:k", 2, lambda *a: 0,
                          elf=True)
        self.xb_path, self.elf_path = str(xb_path), str(elf_path)
        self.dev = s.device(0)
        self.xb = s.xclbin(self.xb_path)
        self.ctx = s.hw_context(self.dev, self.dev.register_xclbin(self.xb))
        self.k = s.kernel(self.ctx, "K")
        self.instr = s.bo(self.dev, 16, s.bo.cacheable, self.k.group_id(1))
        self.a = s.bo(self.dev, 16, s.bo.host_only, self.k.group_id(3))
        self.b = s.bo(self.dev, 16, s.bo.host_only, self.k.group_id(4))

    def built_run(self):
        r = self.s.run(self.k)
        for i, value in enumerate((3, self.instr, 4, self.a, self.b)):
            r.set_arg(i, value)
        return r


def test_the_simulator_accepts_the_forms_the_adapter_uses(tmp_path) -> None:
    rig = _Rig(tmp_path)
    s, to_dev = rig.s, Simulator.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
    assert rig.dev.get_info(s.xrt_info_device.name) == "RyzenAI-npu4"
    assert [(k.get_name(), k.get_num_args()) for k in rig.xb.get_kernels()] == [("K", 5)]
    rig.a.write(b"\x01" * 16, 0)
    rig.a.write(np.zeros(4, np.uint8), 4)
    rig.a.sync(to_dev)
    rig.a.sync(to_dev, 8, 0)
    assert rig.a.read(8, 0).dtype == np.int8 and rig.a.size() == 16 and len(rig.a.map()) == 16
    done = s.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    assert rig.k(3, rig.instr, 4, rig.a, rig.b).wait(1000) == done
    r = rig.built_run()
    r.start()
    assert r.wait() == done and r.state() == done
    rl = s.runlist(rig.ctx)
    rl.add(rig.built_run())
    rl.add(rig.built_run())
    rl.execute()
    assert rl.wait() is None
    ectx = s.hw_context(rig.dev, s.elf(rig.elf_path))
    ek = s.ext.kernel(ectx, "main:k")
    assert ek.group_id(0) == 0


@pytest.mark.parametrize("call,what", [
    (lambda rig, rl: rl.wait(100), "runlist.wait(int)"),
    (lambda rig, rl: rl.wait(datetime.timedelta(milliseconds=100)), "runlist.wait(timedelta)"),
    (lambda rig, rl: rig.a.sync(Simulator.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, 8),
     "bo.sync(dir, size)"),
    (lambda rig, rl: rig.a.read(8), "bo.read(size)"),
    (lambda rig, rl: rig.a.write(b"\x00"), "bo.write(data)"),
    (lambda rig, rl: rig.a.write([0, 1], 0), "bo.write(list)"),
    (lambda rig, rl: rig.s.bo(rig.dev, 16, 2, 3), "bo(device, size, int, group)"),
    (lambda rig, rl: rig.s.xclbin(Path(rig.xb_path)), "xclbin(Path)"),
    (lambda rig, rl: rig.dev.get_info(1), "get_info(int)"),
    (lambda rig, rl: rig.s.hw_context(rig.dev, rig.xb.get_uuid().to_string()),
     "hw_context(device, str uuid)"),
    (lambda rig, rl: rig.built_run().set_arg(0, 1.5), "run.set_arg(int, float)"),
    (lambda rig, rl: rig.built_run().wait(-1), "run.wait(negative)"),
    (lambda rig, rl: rig.s.kernel(rig.ctx, b"K"), "kernel(ctx, bytes)"),
    (lambda rig, rl: rig.a.read(4, -4), "bo.read(size, negative skip)"),
    (lambda rig, rl: rig.a.write(b"\x00", -1), "bo.write(data, negative seek)"),
    (lambda rig, rl: rig.a.sync(Simulator.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, 4, -4),
     "bo.sync(dir, size, negative offset)"),
    (lambda rig, rl: rig.s.bo(rig.dev, 16, rig.s.bo.host_only, -1), "bo(..., negative group)"),
])
def test_the_simulator_rejects_what_the_bindings_cannot_convert(tmp_path, call, what) -> None:
    rig = _Rig(tmp_path)
    rl = rig.s.runlist(rig.ctx)
    # pybind11's message, or Python's for a missing argument: a TypeError either way
    with pytest.raises(TypeError, match="incompatible function arguments|required positional"):
        call(rig, rl)


@pytest.mark.parametrize("call", [
    lambda a, d: a.read(8, 12), lambda a, d: a.read(17, 0), lambda a, d: a.write(b"\0" * 8, 12),
    lambda a, d: a.sync(d.XCL_BO_SYNC_BO_TO_DEVICE, 8, 12),
    lambda a, d: a.sync(d.XCL_BO_SYNC_BO_FROM_DEVICE, 32, 0)])
def test_reads_writes_and_syncs_past_a_buffer_fail_as_xrts_do(tmp_path, call) -> None:
    # xrt::bo::read / write: "attempting to read past buffer size"; the amdxdna shim's
    # buffer::sync: EINVAL (the 16-byte bo did not give back a short array, or sync less)
    rig = _Rig(tmp_path)
    with pytest.raises(SimulatorError, match="past buffer size|Invalid BO offset and size"):
        call(rig.a, Simulator.xclBOSyncDirection)


def test_a_non_contiguous_write_is_refused(tmp_path) -> None:
    # pyxrt's bo.write memcpys itemsize * size bytes from the buffer's pointer: a strided
    # view (every other byte here) would reach the device as the bytes it spans, in order
    rig = _Rig(tmp_path)
    with pytest.raises(SimulatorError, match="non-contiguous"):
        rig.a.write(np.arange(16, dtype=np.uint8)[::2], 0)
    rig.a.write(np.ascontiguousarray(np.arange(16, dtype=np.uint8)[::2]), 0)


def test_runlists_raise_their_failures_and_hide_their_runs_state(tmp_path) -> None:
    rig = _Rig(tmp_path)
    s = rig.s
    assert not hasattr(s.runlist(rig.ctx), "state")  # pyxrt binds no runlist.state
    rl = s.runlist(rig.ctx)
    r = rig.built_run()
    rl.add(r)
    with pytest.raises(SimulatorError, match="already in a runlist"):
        rl.add(r)
    s.faults.aborts = 1
    rl.execute()
    with pytest.raises(SimulatorError, match="state\\(\\) cannot be called"):
        r.state()
    with pytest.raises(RuntimeError, match="ERT_CMD_STATE_ABORT"):
        rl.wait()
    with pytest.raises(SimulatorError, match="started by the runlist"):
        r.start()


def test_versions_gate_the_elf_context_and_the_runlist(tmp_path) -> None:
    old = _Rig(tmp_path, version="2.22.0")
    with pytest.raises(TypeError, match="incompatible function arguments"):
        old.s.hw_context(old.dev, old.s.elf(old.elf_path))
    with pytest.raises(XRTError, match="need XRT 2.23 or newer; this is XRT 2.22.0"):
        XRT(old.s).elf_context(0, Path(old.elf_path))
    assert not XRT(Simulator(version="2.20.1")).has_runlist
    assert XRT(Simulator(version="2.21.0")).has_runlist
    assert not hasattr(Simulator(runlist=False), "runlist")


def test_xrt_version_comes_from_version_json_beside_pyxrt(tmp_path, monkeypatch) -> None:
    from types import SimpleNamespace

    from npu.xrt import adapter

    monkeypatch.setattr(adapter, "XRT_PYTHON", str(tmp_path / "none" / "python"))
    (tmp_path / "python").mkdir()
    module = SimpleNamespace(__file__=str(tmp_path / "python" / "pyxrt.so"))
    assert adapter.xrt_version(module) is None
    (tmp_path / "version.json").write_text(json.dumps({"BUILD_VERSION": "2.21.7"}))
    assert adapter.xrt_version(module) == (2, 21, 7)
