"""The NPU path on the pyxrt simulator: the XRT engine matches the numpy engine, weights
stay on the device, and every fault the simulator can inject ends in a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npu import ModelError, NumpyEngine, config_from_json, load_model
from npu.load.safetensors import load_weights
from npu.xrt import XRT, XRTError, XRTUnavailable, generation_of, import_pyxrt
from npu.xrt.engine import XRTEngine
from npu.xrt.sim import Simulator, gemm_kernel, write_xclbin
from tests.shared import SHARED

TINY = SHARED / "models" / "tiny-random"
STORIES = SHARED / "models" / "stories260K" / "hf-f32"
MANIFEST = {"xclbin": "gemm.xclbin", "insts": "insts.bin", "kernel": "MLIR_AIE",
            "tile": {"m": 8, "k": 32, "n": 32}, "dtype": {"a": "f32", "b": "f32", "c": "f32"},
            "args": ["a", "b", "c", "sizes"], "instr_length": "words"}


def make_kernel_dir(folder: Path, sim: Simulator, manifest: dict = MANIFEST) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    xuuid = write_xclbin(folder / manifest["xclbin"], ["MLIR_AIE"])
    insts = np.random.default_rng(1).integers(0, 2**32, 64, dtype=np.uint32)
    insts.tofile(folder / manifest["insts"])
    (folder / "manifest.json").write_text(json.dumps(manifest))
    sim.register_kernel(xuuid, "MLIR_AIE", 3 + len(manifest["args"]),
                        gemm_kernel(manifest, insts))
    return folder


@pytest.fixture()
def sim(tmp_path) -> tuple[Simulator, Path]:
    s = Simulator(["RyzenAI-npu4", "RyzenAI-npu4"])
    return s, make_kernel_dir(tmp_path / "kernel", s)


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _engines(folder: Path, sim: Simulator, kdir: Path):
    cfg = config_from_json(json.loads((folder / "config.json").read_text()))
    return (NumpyEngine(cfg, load_weights(folder)),
            XRTEngine(cfg, load_weights(folder), xrt=XRT(sim), device_index=0, kernel_dir=kdir))


@pytest.mark.skipif(not TINY.exists(), reason=f"{TINY} is absent")
@pytest.mark.parametrize("arch", ["qwen3", "llama3", "gemma3", "lfm2"])
def test_xrt_engine_matches_numpy_engine(sim, arch: str) -> None:
    s, kdir = sim
    ref, npu = _engines(TINY / arch, s, kdir)
    ids = np.load(TINY / arch / "input_ids.npy").tolist()
    assert _rel(npu.prefill("a", ids[:6]), ref.prefill("a", ids[:6])) < 1e-4
    for t in ids[6:]:
        assert _rel(npu.decode(["a"], [t])[0], ref.decode(["a"], [t])[0]) < 1e-4
    runs_per_token = 4 * sum(k != "conv" for k in ref.config.layer_types) + 4 * sum(
        k == "conv" for k in ref.config.layer_types) + 1
    before = npu.gemm.runs
    npu.decode(["a"], [1])
    assert npu.gemm.runs - before == runs_per_token


def test_weights_stay_on_the_device(sim, tiny_dir: Path) -> None:
    s, kdir = sim
    model = load_model(tiny_dir, "npu", kernel_dir=kdir, xrt=XRT(s))
    eng = model.engine
    assert all(getattr(L, "w_gate_up") is None for L in eng.layers)
    eng.prefill("x", [1, 2, 3])
    in0, out0 = eng.gemm.bytes_in, eng.gemm.bytes_out
    eng.decode(["x"], [4])
    moved = (eng.gemm.bytes_in - in0) + (eng.gemm.bytes_out - out0)
    assert moved < 0.1 * eng.weight_bytes  # activations only


@pytest.mark.skipif(not STORIES.exists(), reason=f"{STORIES} is absent")
def test_stories260k_greedy_is_the_same_through_the_npu(sim) -> None:
    s, kdir = sim
    model = load_model(STORIES, "npu", kernel_dir=kdir, xrt=XRT(s))
    logits = model.engine.prefill("s", [1])
    out = []
    for _ in range(33):
        out.append(int(np.argmax(logits)))
        logits = model.engine.decode(["s"], [out[-1]])[0]
    det = model.tokenizer.detokenizer()
    assert "".join(det.push(t) for t in out).startswith("Once upon a time, there was a little")


# -- devices ------------------------------------------------------------------------------
def test_enumerate_devices_and_generations() -> None:
    xrt = XRT(Simulator(["NPU Phoenix npu1", "RyzenAI-npu5"]))
    devices = xrt.enumerate_devices()
    assert [(d.index, d.generation) for d in devices] == [(0, "XDNA1"), (1, "XDNA2")]
    assert generation_of("something") == "unknown"


def test_failed_opens_are_retried_then_reported() -> None:
    s = Simulator()
    s.faults.fail_opens = 2
    assert XRT(s, backoff_s=0.0).device(0) is not None  # third try opens
    s2 = Simulator()
    s2.faults.fail_opens = 5
    with pytest.raises(XRTError, match="cannot open NPU 0 after 3 tries"):
        XRT(s2, backoff_s=0.0).device(0)


def test_pyxrt_absent_is_a_clear_error() -> None:
    try:
        import pyxrt  # noqa: F401
    except ImportError:
        with pytest.raises(XRTUnavailable, match="install AMD's XRT"):
            import_pyxrt()
    else:  # on an NPU host this test checks nothing to fail on
        assert import_pyxrt() is not None


# -- faults -------------------------------------------------------------------------------
@pytest.mark.parametrize("fault,message", [
    ("timeouts", "ERT_CMD_STATE_TIMEOUT"),
    ("errors", "ERT_CMD_STATE_ERROR"),
])
def test_run_faults_are_errors(sim, tiny_dir: Path, fault: str, message: str) -> None:
    s, kdir = sim
    model = load_model(tiny_dir, "npu", kernel_dir=kdir, xrt=XRT(s))
    setattr(s.faults, fault, 1)
    with pytest.raises(XRTError, match=message):
        model.engine.prefill("f", [1, 2])


def test_lost_device_is_an_error(sim, tiny_dir: Path) -> None:
    s, kdir = sim
    model = load_model(tiny_dir, "npu", kernel_dir=kdir, xrt=XRT(s))
    s.lose_device(0)
    with pytest.raises(XRTError):
        model.engine.prefill("f", [1, 2])


def test_context_limit_is_enforced(tmp_path) -> None:
    s = Simulator(["NPU Phoenix npu1"])
    xrt = XRT(s, max_contexts=100)
    paths = []
    for i in range(7):
        xb = tmp_path / f"k{i}.xclbin"
        write_xclbin(xb, ["MLIR_AIE"])
        paths.append(xb)
    for p in paths[:6]:
        xrt.hw_context(0, p)
    with pytest.raises(XRTError, match="No free hardware context"):
        xrt.hw_context(0, paths[6])


def test_missing_sync_gives_stale_device_memory() -> None:
    s = Simulator()
    dev = s.device(0)
    bo = s.bo(dev, 8, s.bo.host_only, 3)
    bo.write(b"\x01" * 8, 0)
    assert not bo.dev.any()  # written on the host only
    bo.sync(s.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
    assert bo.dev.all()


def test_kernel_checks_arguments(sim) -> None:
    s, kdir = sim
    xrt = XRT(s)
    ctx, xb = xrt.hw_context(0, kdir / "gemm.xclbin")
    k = xrt.kernel(ctx, xb, "MLIR_AIE")
    bad = s.bo(s.device(0), 8, s.bo.host_only, 5)
    with pytest.raises(XRTError, match="takes 7 arguments"):
        xrt.run(k, 3, bad)
    instr = s.bo(s.device(0), 8, s.bo.cacheable, 1)
    with pytest.raises(XRTError, match="group"):
        xrt.run(k, 3, instr, 2, bad, bad, bad, bad)
    with pytest.raises(XRTError, match="is not in the xclbin"):
        xrt.kernel(ctx, xb, "OTHER")


def test_bad_kernel_directories_are_named(tmp_path, tiny_dir: Path) -> None:
    s = Simulator()
    with pytest.raises(ModelError, match="manifest.json"):
        load_model(tiny_dir, "npu", kernel_dir=tmp_path, xrt=XRT(s))
    with pytest.raises(ModelError, match="kernel_dir"):
        load_model(tiny_dir, "npu")
    kdir = make_kernel_dir(tmp_path / "bf16", s, {**MANIFEST, "dtype": {"a": "bf16",
                                                                        "b": "bf16",
                                                                        "c": "f32"}})
    with pytest.raises(ModelError, match="only f32"):
        load_model(tiny_dir, "npu", kernel_dir=kdir, xrt=XRT(s))


def test_health_check_sees_a_lost_device(sim, tiny_dir: Path) -> None:
    s, kdir = sim
    model = load_model(tiny_dir, "npu", kernel_dir=kdir, xrt=XRT(s))
    model.engine.check_device()  # answers
    s.lose_device(0)
    with pytest.raises(XRTError, match="not answering"):
        model.engine.check_device()
