"""Per-launch scalars where real kernels take them: with op scalars "insts" the layer ops'
position and length are words of their instruction stream, set before each launch (no rtp
buffer), and the simulated kernels read them from there."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npu import ModelError, config_from_json, load_model
from npu.xrt import XRT, XRTError
from npu.xrt.sim_kernels import make_kernel_dir, simulator_for


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from npu.load.tiny import ensure_tiny

    return ensure_tiny(tmp_path_factory.mktemp("cache"))


def _kdir(tiny: Path, folder: Path, scalars: str) -> Path:
    cfg = config_from_json(json.loads((tiny / "config.json").read_text()))
    return make_kernel_dir(folder, [cfg], weights="bf16", ctx=64, scalars=scalars,
                           ops=("gemv", "gemm", "attn", "mlp", "layer"))


def _logits(tiny: Path, kd: Path, mode: str) -> list[np.ndarray]:
    engine = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, ["npu4"])),
                        npu_mode=mode).engine
    return [engine.prefill("a", [1, 2, 3, 4, 5]), engine.decode(["a"], [6])[0],
            engine.decode(["a"], [7])[0]]


@pytest.mark.parametrize("mode", ["layer", "block"])
def test_scalars_in_the_stream_compute_what_the_rtp_buffer_does(tiny, tmp_path, mode) -> None:
    want = _logits(tiny, _kdir(tiny, tmp_path / "rtp", "rtp"), mode)
    kd = _kdir(tiny, tmp_path / "insts", "insts")
    manifest = json.loads((kd / "npu2" / "manifest.json").read_text())
    assert "rtp" not in manifest["ops"]["layer"]["args"]
    for a, b in zip(_logits(tiny, kd, mode), want):
        np.testing.assert_array_equal(a, b)


def test_a_stream_left_unset_is_refused(tiny, tmp_path) -> None:
    from npu.xrt.kernels import OpKernel

    kd = _kdir(tiny, tmp_path / "k", "insts")
    model = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, ["npu4"])),
                       npu_mode="layer")
    original = OpKernel.set_scalars
    try:  # the host forgets to set the length: the stream says 0 rows
        OpKernel.set_scalars = lambda self, shape, **v: original(self, shape, pos=v["pos"],
                                                                 len=0)
        with pytest.raises(XRTError, match="length 0 does not cover"):
            model.engine.prefill("a", [1, 2])
    finally:
        OpKernel.set_scalars = original


def test_scalars_in_the_stream_are_checked_in_the_manifest(tiny, tmp_path) -> None:
    kd = _kdir(tiny, tmp_path / "k", "insts")
    path = kd / "npu2" / "manifest.json"
    good = json.loads(path.read_text())
    for edit, message in [
        (lambda m: m["ops"]["gemv"].update(scalars="insts"), "for the attn and layer ops"),
        (lambda m: m["ops"]["layer"]["shapes"][0].pop("scalar_words"), "scalar_words"),
        (lambda m: m["ops"]["layer"]["args"].append("rtp"), "must name"),
        (lambda m: m["ops"]["layer"].update(scalars="patched"), "not rtp, insts or scratch"),
        (lambda m: m["ops"]["layer"].update(scalars="scratchpad"), "of instr_format elf"),
    ]:
        m = json.loads(json.dumps(good))
        edit(m)
        path.write_text(json.dumps(m))
        with pytest.raises(ModelError, match=message):
            load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, ["npu4"])))
