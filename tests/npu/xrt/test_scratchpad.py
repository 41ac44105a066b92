"""Per-launch scalars in a full ELF's control scratchpad (op scalars "scratchpad"): aiecc's
params.txt read as mlir-aie's ParameterScratchpad reads it (runtime_lib/test_lib/
parameter_scratchpad.h at 978fc1bc), core values written shifted by 2 as deltas against the
run handle's last write, addr values as they are; the simulator's cores read what the
firmware's increments add up to, so a host that encodes wrongly computes wrongly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npu import ModelError, config_from_json, load_model
from npu.xrt import XRT, XRTError
from npu.xrt.scratchpad import Scratchpad, parse_params, read_value
from npu.xrt.sim import Simulator, SimulatorError, write_xclbin
from npu.xrt.sim_kernels import make_kernel_dir, simulator_for

PARAMS = "3\npos 0 i32 core\nlen 1 i32\nkv_off 2 i32 addr\n"


def test_params_txt_is_read_with_its_kinds() -> None:
    p = parse_params(PARAMS)
    assert [(n, q.index, q.kind) for n, q in p.items()] == [
        ("pos", 0, "core"), ("len", 1, "core"), ("kv_off", 2, "addr")]  # core by default
    for text, message in [("pos 0 i32\n", "parameter count"), ("2\npos 0 i32\n", "lists 1"),
                          ("1\npos 3 i32\n", "past the 1 words"),
                          ("1\npos 0 i32 reg\n", "not core or addr"),
                          ("1\npos x i32\n", "is not")]:
        with pytest.raises(XRTError, match=message):
            parse_params(text)


def test_core_values_are_deltas_of_the_value_shifted_by_2() -> None:
    pad = Scratchpad(parse_params(PARAMS))
    pad.write("pos", 5)
    pad.write("kv_off", 96)
    assert pad.words.tolist() == [20, 0, 96]  # 5 << 2; the addr raw
    pad.write("pos", 7)
    assert pad.words[0] == 8  # (7 << 2) - (5 << 2)
    pad.write("pos", 7)
    assert pad.words[0] == 0  # the same value again: no increment
    pad.write("pos", 6)
    assert pad.words[0] == 0xFFFFFFFC  # -4 modulo 2^32
    with pytest.raises(XRTError, match="no parameter 'ctx'"):
        pad.write("ctx", 1)


def test_a_core_reads_what_the_increments_add_up_to() -> None:
    p = parse_params(PARAMS)
    registers = np.zeros(3, dtype=np.uint32)
    pad = Scratchpad(p)
    for value in (5, 7, 7, 6, 1000):
        pad.write("pos", value)
        pad.write("kv_off", value * 2)
        registers = (registers + pad.words).astype(np.uint32)
        assert read_value(p["pos"], pad.words, registers) == value
        assert read_value(p["kv_off"], pad.words, registers) == 2 * value
    # a host that wrote the value itself instead of the delta: the core reads a sum
    registers = (registers + np.array([1000 << 2, 0, 0], dtype=np.uint32)).astype(np.uint32)
    assert read_value(p["pos"], pad.words, registers) == 2000


def _rig(tmp_path: Path, **kwargs):
    sim = Simulator(**kwargs)
    seen = []
    elf = write_xclbin(tmp_path / "k.elf", ["main:k", "main:plain"])
    sim.register_kernel(elf, "main:k", 1, lambda *a, ctrl: seen.append(ctrl) or 0, elf=True,
                        scratchpad_words=3)
    sim.register_kernel(elf, "main:plain", 1, lambda *a: 0, elf=True)
    dev = sim.device(0)
    ctx = sim.hw_context(dev, sim.elf(str(tmp_path / "k.elf")))
    return sim, dev, ctx, seen


def test_the_simulator_applies_a_runs_scratchpad_as_it_starts(tmp_path) -> None:
    sim, dev, ctx, seen = _rig(tmp_path)
    k = sim.ext.kernel(ctx, "main:k")
    buf = sim.bo(dev, 16, sim.bo.host_only, k.group_id(0))
    run = sim.run(k)
    run.set_arg(0, buf)
    pad = run.get_ctrl_scratchpad_bo()
    assert pad is run.get_ctrl_scratchpad_bo() and pad.size() == 12
    words = np.array([20, 0, 0], dtype=np.uint32)
    pad.write(words, 0)
    run.start()  # not synced: the device's words are still zero
    pad.sync(sim.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
    run.start()
    run.start()  # the same delta applied again: the register goes on adding
    assert [r.tolist() for _, r in seen] == [[0, 0, 0], [20, 0, 0], [40, 0, 0]]
    with pytest.raises(SimulatorError, match="no scratchpad section"):
        sim.run(sim.ext.kernel(ctx, "main:plain")).get_ctrl_scratchpad_bo()


def test_an_xrt_without_the_binding_is_refused_naming_the_version(tmp_path) -> None:
    sim, _, ctx, _ = _rig(tmp_path, scratchpad=False, version="2.24.0")
    with pytest.raises(XRTError, match=r"need XRT 2\.25 or newer; this is XRT 2\.24"):
        XRT(sim).scratchpad_run(sim.ext.kernel(ctx, "main:k"))
    sim, _, ctx, _ = _rig(tmp_path)
    with pytest.raises(XRTError, match="no control scratchpad"):
        XRT(sim).scratchpad_run(sim.ext.kernel(ctx, "main:plain"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from npu.load.tiny import ensure_tiny

    return ensure_tiny(tmp_path_factory.mktemp("cache"))


def _kdir(tiny: Path, folder: Path, **kwargs) -> Path:
    cfg = config_from_json(json.loads((tiny / "config.json").read_text()))
    return make_kernel_dir(folder, [cfg], weights="bf16", ctx=64,
                           ops=("gemv", "gemm", "attn", "mlp", "layer"), **kwargs)


def _logits(tiny: Path, kd: Path, mode: str, **sim) -> list[np.ndarray]:
    xrt = XRT(simulator_for(kd, ["npu4"], **sim))
    engine = load_model(tiny, "npu", kernel_dir=kd, xrt=xrt, npu_mode=mode).engine
    return [engine.prefill("a", [1, 2, 3, 4, 5]), engine.decode(["a"], [6])[0],
            engine.decode(["a"], [7])[0]]


@pytest.mark.parametrize("mode,runlist", [("layer", True), ("block", False)])
def test_scratchpad_scalars_compute_what_the_rtp_buffer_does(tiny, tmp_path, mode,
                                                              runlist) -> None:
    want = _logits(tiny, _kdir(tiny, tmp_path / "rtp", instr_format="elf"), mode)
    kd = _kdir(tiny, tmp_path / "sp", instr_format="elf", scalars="scratchpad")
    manifest = json.loads((kd / "npu2" / "manifest.json").read_text())
    assert "rtp" not in manifest["ops"]["layer"]["args"]
    for a, b in zip(_logits(tiny, kd, mode, runlist=runlist), want):
        np.testing.assert_array_equal(a, b)


def test_scratchpad_ops_are_checked_at_load(tiny, tmp_path) -> None:
    kd = _kdir(tiny, tmp_path / "sp", instr_format="elf", scalars="scratchpad")
    with pytest.raises(ModelError, match=r"need XRT 2\.25"):
        _logits(tiny, kd, "layer", scratchpad=False)
    path = kd / "npu2" / "manifest.json"
    good = json.loads(path.read_text())
    for edit, message in [
        (lambda m: m["ops"]["layer"].update(scalar_symbols={"pos": "position"}),
         "has no parameter position"),
        (lambda m: m["ops"]["layer"].update(scalar_symbols={"ctx": "pos"}), "the scalars are"),
        (lambda m: m["ops"]["layer"].pop("params"), "with the ELF's params file"),
    ]:
        m = json.loads(json.dumps(good))
        edit(m)
        path.write_text(json.dumps(m))
        with pytest.raises(ModelError, match=message):
            load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, ["npu4"])))
