"""The NPU path on the pyxrt simulator: kernel directories (manifest v2) by generation, the
three launch modes against the CPU engine, what the simulated kernels do to numbers and
shapes, the timing model, and every fault ending in a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npu import ModelError, NumpyEngine, config_from_json, load_model
from npu.engine.protocol import Engine
from npu.load.loader import _quantizer
from npu.load.safetensors import load_weights
from npu.xrt import XRT, XRTError, XRTUnavailable, generation_of, import_pyxrt
from npu.xrt.engine import XRTEngine
from npu.xrt.sim import Simulator, SimulatorError, write_xclbin
from npu.xrt.sim_kernels import make_kernel_dir, simulator_for
from tests.shared import SHARED

TINY = SHARED / "models" / "tiny-random"
STORIES = SHARED / "models" / "stories260K" / "hf-f32"


def _config(folder: Path):
    return config_from_json(json.loads((folder / "config.json").read_text()))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from npu.load.tiny import ensure_tiny

    return ensure_tiny(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def kdir(tmp_path_factory, tiny: Path) -> Path:
    """bf16 kernels for flm-tiny (Qwen3), every op, one xclbin."""
    return make_kernel_dir(tmp_path_factory.mktemp("k") / "kernels", [_config(tiny)],
                           weights="bf16", ctx=256)


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _run(engine, ids: list[int], steps: list[int]) -> list[np.ndarray]:
    out = [engine.prefill("a", ids)]
    for t in steps:
        out.append(engine.decode(["a"], [t])[0])
    return out


# -- the three modes against the CPU engine -----------------------------------------------------
@pytest.mark.parametrize("mode,per_layer", [("linear", 4), ("block", 2), ("layer", 1)])
def test_modes_match_the_cpu_engine_and_count_launches(tiny, kdir, mode, per_layer) -> None:
    cfg = _config(tiny)
    sim = simulator_for(kdir, ["RyzenAI-npu4"])
    npu = XRTEngine(cfg, load_weights(tiny, progress=False), xrt=XRT(sim), device_index=0,
                    kernel_dir=kdir, mode=mode)
    ref = NumpyEngine(cfg, load_weights(tiny, progress=False), backend="reference")
    ids, steps = [5, 9, 14, 3, 7, 22, 40, 11], [17, 2, 30, 8]
    for got, want in zip(_run(npu, ids, steps), _run(ref, ids, steps)):
        assert _rel(got, want) < 0.03  # bf16 activations and weights against float32
    assert npu.mode == mode
    before = sim.clock.launches
    npu.decode(["a"], [4])
    assert sim.clock.launches - before == per_layer * cfg.num_layers + 1
    # a prompt's every row (its own logprobs): the logits after each of its tokens
    rows = npu.prefill_many([("p", ids)], every_row=True)
    assert rows.shape == (len(ids), cfg.vocab_size)
    assert max(_rel(rows[end - 1], ref.prefill(("s", end), ids[:end]))
               for end in (1, 4, len(ids))) < 0.03


@pytest.mark.parametrize("mode", ["linear", "layer"])
def test_the_model_summary_counts_the_weights_on_the_device(tiny, kdir, mode) -> None:
    # Ollama's /api/ps and /api/show showed SmolLM2-135M on the NPU as 28M parameters (the
    # embedding alone: the host drops the matrices it uploads), 134M on the CPU
    cfg = _config(tiny)
    npu = XRTEngine(cfg, load_weights(tiny, progress=False), xrt=XRT(simulator_for(
        kdir, ["RyzenAI-npu4"])), device_index=0, kernel_dir=kdir, mode=mode)
    cpu = NumpyEngine(cfg, load_weights(tiny, progress=False))
    assert npu.weight_summary() == cpu.weight_summary()


def test_linear_mode_embeds_as_the_cpu_engine_and_fused_modes_refuse(tiny, kdir) -> None:
    cfg = _config(tiny)
    items = [[5, 9, 14, 3], [7, 22, 40, 11, 17, 2]]
    ref = NumpyEngine(cfg, load_weights(tiny, progress=False), backend="reference")
    want = ref.embed(items)
    for mode in ("linear", "layer"):
        npu = XRTEngine(cfg, load_weights(tiny, progress=False),
                        xrt=XRT(simulator_for(kdir, ["RyzenAI-npu4"])), device_index=0,
                        kernel_dir=kdir, mode=mode)
        if mode == "linear":
            got = npu.embed(items)
            cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want,
                                                                                      axis=-1)
            assert cos.min() > 0.999  # bf16 products against float32
        else:
            with pytest.raises(ModelError, match="npu_mode 'linear'"):
                npu.embed(items)


def test_prompts_run_in_tiles_on_the_layer_ops(tiny, kdir) -> None:
    """A prompt goes through the layer op 32 rows a launch (one row at a time where a tile
    would pass the device cache's end); its logits agree with the linear ops'; the layer
    weights are on the device once (only the lm_head is on the linear ops)."""
    cfg = _config(tiny)
    engines = {}
    for mode in ("linear", "layer"):
        sim = simulator_for(kdir, ["npu4"])
        engines[mode] = (XRTEngine(cfg, load_weights(tiny, progress=False), xrt=XRT(sim),
                                   device_index=0, kernel_dir=kdir, mode=mode), sim)
    (lin, _), (lay, sim) = engines["linear"], engines["layer"]
    assert lay.linear_ops.weight_bytes < 0.5 * lin.linear_ops.weight_bytes  # the lm_head
    assert abs(lay.weight_bytes - lin.weight_bytes) < 0.01 * lin.weight_bytes
    prompt = [3 + i % 50 for i in range(40)]
    before = sim.clock.launches
    got = lay.prefill("a", prompt)
    assert sim.clock.launches - before == 2 * cfg.num_layers + 1  # tiles of 32 and 8 rows
    assert _rel(got, lin.prefill("a", prompt)) < 0.01
    tail = list(range(5, 5 + 200))  # to 240 tokens: tiles to 224, then a 16-row tile
    assert _rel(lay.prefill("a", tail), lin.prefill("a", tail)) < 0.01
    before = sim.clock.launches
    near_end = [7, 8, 9, 10]  # 240 + 32 > 256: one row at a time
    assert _rel(lay.prefill("a", near_end), lin.prefill("a", near_end)) < 0.01
    assert sim.clock.launches - before == 4 * cfg.num_layers + 1


def test_auto_mode_takes_the_most_fused_ops(tiny, tmp_path) -> None:
    cfg = _config(tiny)
    for ops, mode in [(("gemv", "gemm", "attn", "mlp", "layer"), "layer"),
                      (("gemv", "attn", "mlp"), "block"), (("gemv", "gemm"), "linear")]:
        kd = make_kernel_dir(tmp_path / "-".join(ops), [cfg], ops=ops, weights="bf16")
        model = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, ["npu4"])))
        assert model.engine.mode == mode
    with pytest.raises(ModelError, match="no layer op shapes"):
        load_model(tiny, "npu", kernel_dir=kd, npu_mode="layer",
                   xrt=XRT(simulator_for(kd, ["npu4"])))
    with pytest.raises(ModelError, match="kv_cache_type 'q8_0' is the CPU engine's"):
        load_model(tiny, "npu", kernel_dir=kd, kv_cache_type="q8_0",
                   xrt=XRT(simulator_for(kd, ["npu4"])))


def test_layer_mode_batches_forks_and_reuses_prefixes(tiny, kdir) -> None:
    """A batch runs each sequence's layers on its own device cache; prefix reuse and fork
    give the device the rows the host has; all agree with each sequence decoded alone."""
    cfg = _config(tiny)
    sim = simulator_for(kdir, ["RyzenAI-npu4"])
    npu = XRTEngine(cfg, load_weights(tiny, progress=False), xrt=XRT(sim), device_index=0,
                    kernel_dir=kdir, mode="layer")
    prompt = list(range(3, 40))
    alone = _run(npu, prompt, [7, 8, 9])[-1]
    npu.release("a")
    assert npu.reuse_prefix("b", prompt) == 32  # two whole blocks from the cache
    npu.prefill("b", prompt[32:])
    npu.prefill("c", [1, 2, 3])
    for t in (7, 8):
        npu.decode(["b", "c"], [t, 5])
    npu.fork("b", "d")
    both = npu.decode(["b", "d"], [9, 9])
    assert _rel(both[0], alone) < 0.01 and _rel(both[1], alone) < 0.01
    assert npu.max_context == 256  # the layer op's device cache


def test_runlist_or_not_gives_the_same_logits(tiny, kdir) -> None:
    cfg = _config(tiny)
    out = []
    for runlist in (True, False):
        sim = simulator_for(kdir, ["RyzenAI-npu4"], runlist=runlist)
        npu = XRTEngine(cfg, load_weights(tiny, progress=False), xrt=XRT(sim), device_index=0,
                        kernel_dir=kdir, mode="layer")
        out.append(_run(npu, [4, 5, 6], [7, 8]))
        assert hasattr(sim, "runlist") is runlist
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["linear", "layer"])
def test_elf_kernels_compute_what_xclbin_kernels_do(tiny, kdir, tmp_path, mode) -> None:
    """A full-ELF directory (a kernel per shape, buffers from argument 0) gives the same
    logits as the xclbin one, with a runlist or run by run."""
    cfg = _config(tiny)
    elf = make_kernel_dir(tmp_path / "elf", [cfg], weights="bf16", ctx=256,
                          instr_format="elf")
    manifest = json.loads((elf / "npu2" / "manifest.json").read_text())
    assert manifest["ops"]["layer"]["elf"] == "flm.elf"
    assert all(s["sequence"].startswith("main:") for s in manifest["ops"]["gemv"]["shapes"])
    out = []
    for folder, runlist in ((kdir, True), (elf, True), (elf, False)):
        sim = simulator_for(folder, ["npu4"], runlist=runlist)
        npu = XRTEngine(cfg, load_weights(tiny, progress=False), xrt=XRT(sim), device_index=0,
                        kernel_dir=folder, mode=mode)
        out.append(_run(npu, [4, 5, 6, 7], [8, 9]))
    for a, b, c in zip(*out):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.skipif(not TINY.exists(), reason=f"{TINY} is absent")
@pytest.mark.parametrize("arch", ["qwen3", "llama3", "gemma3", "lfm2"])
def test_q4g32_from_q4_1_matches_the_cpu_engine(tmp_path, arch: str) -> None:
    """A Q4_1 model's codes go to the device as they are (d, m as bf16): no re-quantising."""
    folder = TINY / arch
    cfg = _config(folder)
    kd = make_kernel_dir(tmp_path / "k", [cfg], weights="q4g32")

    def weights():
        return load_weights(folder, keep=_quantizer("q4_1"), progress=False)

    ref = NumpyEngine(cfg, weights(), backend="reference")
    npu = XRTEngine(cfg, weights(), xrt=XRT(simulator_for(kd, ["npu4"])), device_index=0,
                    kernel_dir=kd)
    assert npu.linear_ops.requantized == 0
    assert npu.mode == ("layer" if arch in ("qwen3", "llama3") else "linear")
    ids = np.load(folder / "input_ids.npy").tolist()
    for got, want in zip(_run(npu, ids[:6], ids[6:]), _run(ref, ids[:6], ids[6:])):
        assert _rel(got, want) < 0.1  # bf16 activations, bf16 d and m, on random weights


def test_q4_1_codes_go_to_the_device_as_they_are(tiny, tmp_path) -> None:
    from npu.engine.quant import QT
    from npu.xrt import packing

    kd = make_kernel_dir(tmp_path / "k", [_config(tiny)], weights="q4g32")
    sim = simulator_for(kd, ["npu4"])
    eng = load_model(tiny, "npu", quantize="q4_1", kernel_dir=kd, npu_mode="linear",
                     xrt=XRT(sim)).engine
    assert eng.linear_ops.requantized == 0
    w = load_model(tiny, quantize="q4_1").engine.layers[0].w_down.blocks()
    assert w.qtype == QT.Q4_1
    dev = eng._dev[(0, "w_down")]
    t = dev.tiling
    got = packing.unpack(dev.bo.dev, t)[: w.shape[0], : w.shape[1]]
    assert np.abs(got - w.dequantize()).max() < 0.05  # d and m in bf16
    tiles = dev.bo.dev[: t.nbytes].reshape(t.np_ // t.tn, t.kp // t.tk, t.tn, -1)
    groups = tiles.transpose(0, 2, 1, 3).reshape(t.np_, -1, 20)[: w.shape[0]]
    np.testing.assert_array_equal(groups[..., 4:], w.data.reshape(w.shape[0], -1, 20)[..., 4:])


@pytest.mark.skipif(not STORIES.exists(), reason=f"{STORIES} is absent")
def test_stories260k_greedy_is_the_same_through_the_npu_layers(tmp_path) -> None:
    kd = make_kernel_dir(tmp_path / "k", [_config(STORIES)], weights="bf16")
    model = load_model(STORIES, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, ["npu4"])))
    assert model.engine.mode == "layer"
    logits = model.engine.prefill("s", [1])
    out = []
    for _ in range(33):
        out.append(int(np.argmax(logits)))
        logits = model.engine.decode(["s"], [out[-1]])[0]
    det = model.tokenizer.detokenizer()
    assert "".join(det.push(t) for t in out).startswith("Once upon a time, there was a little")


def test_weights_stay_on_the_device(tiny, kdir) -> None:
    model = load_model(tiny, "npu", kernel_dir=kdir, npu_mode="linear",
                       xrt=XRT(simulator_for(kdir, ["npu4"])))
    eng = model.engine
    assert isinstance(eng, Engine)
    assert all(L.w_gate_up is None for L in eng.layers) and eng.lm_head is None
    eng.prefill("x", [1, 2, 3])
    ops = eng.linear_ops
    in0, out0 = ops.bytes_in, ops.bytes_out
    eng.decode(["x"], [4])
    assert (ops.bytes_in - in0) + (ops.bytes_out - out0) < 0.1 * eng.weight_bytes


# -- kernel directories ---------------------------------------------------------------------
def test_the_directory_for_the_device_generation_is_taken(tiny, tmp_path) -> None:
    kd = make_kernel_dir(tmp_path / "k", [_config(tiny)], generations=("npu1", "npu2"),
                         weights="bf16", ops=("gemv",))
    for name, gen in [("NPU Phoenix npu1", "npu1"), ("RyzenAI-npu5", "npu2")]:
        m = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, [name])))
        assert m.engine.manifest.generation == gen
    only2 = make_kernel_dir(tmp_path / "k2", [_config(tiny)], weights="bf16", ops=("gemv",))
    with pytest.raises(ModelError, match="kernels for npu2 but the device .* is npu1"):
        load_model(tiny, "npu", kernel_dir=only2,
                   xrt=XRT(simulator_for(only2, ["NPU Phoenix npu1"])))
    with pytest.raises(ModelError, match="cannot tell the NPU generation"):
        load_model(tiny, "npu", kernel_dir=only2, xrt=XRT(simulator_for(only2, ["mystery"])))


def _edit_manifest(kd: Path, edit) -> None:
    path = kd / "npu2" / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


@pytest.mark.parametrize("edit,message", [
    (lambda m: m.update(version=1), "version 1"),
    (lambda m: m["ops"]["gemv"].update(instr_format="elf"), "elf needs an elf"),
    (lambda m: m["ops"]["gemv"].update(instr_format="cdo"), "not bin or elf"),
    (lambda m: m["ops"]["gemv"]["dtype"].update(acc="bf16"), "f32 accumulation"),
    (lambda m: m["ops"]["gemv"].update(args=["x", "w", "y", "a", "b", "c"]), "at most 5"),
    (lambda m: m["ops"]["gemv"]["dtype"].update(x="f32"), "x must be bf16"),
    (lambda m: m["ops"]["gemv"].update(layout="bf16.v1"), "weight dtype"),
    (lambda m: m["ops"]["gemv"].update(rounding="up"), "rounding"),
    (lambda m: m["ops"]["gemv"]["shapes"].pop(), "missing gemv"),
    (lambda m: m["ops"].pop("gemv"), "no gemv op"),
    (lambda m: m["ops"]["gemv"].update(sizes="sizes.bin"), "sizes"),
])
def test_bad_manifests_are_named(tiny, tmp_path, edit, message: str) -> None:
    kd = make_kernel_dir(tmp_path / "k", [_config(tiny)], weights="q4g32", ops=("gemv",))
    sim = simulator_for(kd, ["npu4"])
    _edit_manifest(kd, edit)
    with pytest.raises(ModelError, match=message):
        load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(sim))


def test_instruction_length_in_words_or_bytes(tiny, tmp_path) -> None:
    """The n_instr argument is in the unit the manifest declares (drivers differ)."""
    out = []
    for unit in ("words", "bytes"):
        kd = make_kernel_dir(tmp_path / unit, [_config(tiny)], weights="bf16")
        _edit_manifest(kd, lambda m: [op.update(instr_length=unit) for op in m["ops"].values()])
        model = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(simulator_for(kd, ["npu4"])))
        out.append(_run(model.engine, [3, 4, 5], [6]))
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)
    sim = simulator_for(kd, ["npu4"])  # kernels that count bytes, a manifest that says words
    _edit_manifest(kd, lambda m: m["ops"]["gemv"].update(instr_length="words"))
    model = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(sim), npu_mode="linear")
    with pytest.raises(XRTError, match="not one this kernel was built for"):
        model.engine.prefill("a", [1])


def test_missing_kernel_dir_is_named(tiny, tmp_path) -> None:
    with pytest.raises(ModelError, match="kernel_dir"):
        load_model(tiny, "npu")
    with pytest.raises(ModelError, match="no generation"):
        load_model(tiny, "npu", kernel_dir=tmp_path, xrt=XRT(Simulator()))


# -- what a simulated kernel does -------------------------------------------------------------
class _Gemv:
    """A gemv op of a small kernel directory, opened on a simulator."""

    def __init__(self, tmp_path: Path, **kw) -> None:
        from npu.xrt.kernels import LinearOps, OpKernel
        from npu.xrt.manifest import load_manifest

        cfg = config_from_json({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                "intermediate_size": 96, "num_hidden_layers": 1,
                                "num_attention_heads": 2, "num_key_value_heads": 1,
                                "vocab_size": 100, "max_position_embeddings": 64})
        kd = make_kernel_dir(tmp_path / "k", [cfg], ops=("gemv", "gemm"), gemm_m=4,
                             granule_k=32, **kw)
        self.sim = simulator_for(kd, ["npu4"])
        xrt = XRT(self.sim)
        m = load_manifest(kd / "npu2")
        self.gemv = OpKernel(xrt, 0, kd / "npu2", "gemv", m.ops["gemv"])
        self.gemm = OpKernel(xrt, 0, kd / "npu2", "gemm", m.ops["gemm"])
        self.ops = LinearOps(self.gemv, self.gemm)
        self.xrt = xrt


def test_kernels_round_as_declared(tmp_path) -> None:
    """bf16 output: floor rounds toward minus infinity, conv_even to nearest even; per-K-tile
    rounding rounds the running sum after every tile."""
    from npu.xrt import packing

    rng = np.random.default_rng(0)
    w = rng.standard_normal((100, 64)).astype(np.float32)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    exact = packing.round_bf16(x) @ packing.round_bf16(w).T
    outs = {}
    for name, kw in [("f32", {"y": "f32"}), ("even", {"y": "bf16"}),
                     ("floor", {"y": "bf16", "rounding": "floor"}),
                     ("tiles", {"y": "bf16", "round_per_k_tile": True})]:
        g = _Gemv(tmp_path / name, weights="bf16", **kw)
        outs[name] = g.ops.matmul(x, g.ops.upload(w))
    np.testing.assert_allclose(outs["f32"], exact, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(outs["even"], packing.round_bf16(outs["f32"]))
    np.testing.assert_array_equal(outs["floor"], packing.round_bf16(outs["f32"], "floor"))
    assert np.all(outs["floor"] <= outs["f32"])  # toward minus infinity
    assert not np.array_equal(outs["tiles"], outs["even"])


def test_q4g32_dequantises_to_bf16_and_bfp16_blocks_share_an_exponent(tmp_path) -> None:
    from npu.engine.quant import QMatrix, QT
    from npu.xrt import packing

    rng = np.random.default_rng(1)
    w = rng.standard_normal((40, 64)).astype(np.float32)
    q = QMatrix.from_float(w, QT.Q4_1)
    t = packing.tiling("q4g32.v1", 40, 64, 32, 32)
    got = packing.unpack(packing.from_q4_1(q.data, q.shape, t), t)[:40, :64]
    # the Q4_1 value with d and m in bf16, rounded to bf16: within a bf16 step or two
    assert np.abs(got - q.dequantize()).max() < 0.05
    np.testing.assert_array_equal(got, packing.round_bf16(got))
    t8 = packing.tiling("bfp16ebs8.v1", 40, 64, 32, 32)
    blocks = packing.unpack(packing.pack(w, t8), t8)[:40, :64].reshape(40, 8, 8)
    peak = np.abs(w.reshape(40, 8, 8)).max(axis=-1, keepdims=True)
    assert np.all(np.abs(blocks - w.reshape(40, 8, 8)) <= peak / 64)


def test_bf16_rounding_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    from npu.xrt import packing

    x = np.random.default_rng(2).standard_normal(4096).astype(np.float32) * 1e3
    x[:4] = [1.00390625, 1.01171875, -1.00390625, 0.0]  # ties
    want = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(packing.round_bf16(x), want)


def test_a_launch_runs_the_shape_of_its_instruction_stream(tmp_path) -> None:
    g = _Gemv(tmp_path, weights="bf16")
    w = g.ops.upload(np.ones((100, 64), dtype=np.float32))
    shape = g.gemv.find(m=1, k=64, n=100)
    x_bo = g.gemv.bo("x", 64 * 2)
    y_bo = g.gemv.bo("y", 128 * 4)
    g.xrt.to_device(x_bo, np.zeros(64, dtype=np.uint16))
    g.gemv.launch(shape, {"x": x_bo, "w": w.bo, "y": y_bo})  # its own shape runs
    other = g.gemv.find(m=1, k=96, n=64)  # the down projection's stream
    with pytest.raises(XRTError, match="weight buffer holds"):
        g.gemv.launch(other, {"x": x_bo, "w": w.bo, "y": y_bo})
    garbage = g.sim.bo(g.sim.device(0), 64, g.sim.bo.cacheable, 1)
    with pytest.raises(XRTError, match="not one this kernel was built for"):
        g.xrt.run(g.gemv.kernel, 3, garbage, 16, x_bo, w.bo, y_bo)


def test_rows_the_host_did_not_write_are_undefined(tmp_path) -> None:
    from npu.xrt import packing

    g = _Gemv(tmp_path, weights="bf16")
    w = g.ops.upload(np.ones((100, 64), dtype=np.float32))
    x = np.ones((3, 64), dtype=np.float32)
    out = g.ops.matmul(x, w)  # gemm: 3 real rows of its 4; the 4th is never read
    np.testing.assert_array_equal(out, np.full((3, 100), 64.0, dtype=np.float32))
    shape = g.gemm.find(k=64, n=100)
    x_bo, y_bo = g.ops._io(g.gemm, shape, w.tiling, 4)
    a = np.zeros((3, 64), dtype=np.uint16)
    a[:] = packing.to_bf16(np.ones((3, 64), dtype=np.float32))
    g.xrt.to_device(x_bo, a)
    g.gemm.launch(shape, {"x": x_bo, "w": w.bo, "y": y_bo})
    y = g.xrt.from_device(y_bo, 4 * 128 * 4).view(np.float32).reshape(4, 128)
    assert np.isnan(y[3]).all() and not np.isnan(y[:3]).any()  # row 4: not written


def test_k_padding_must_be_zero(tmp_path) -> None:
    from npu.xrt import packing

    cfg = config_from_json({"architectures": ["LlamaForCausalLM"], "hidden_size": 40,
                            "intermediate_size": 64, "num_hidden_layers": 1,
                            "num_attention_heads": 2, "num_key_value_heads": 1,
                            "head_dim": 20, "vocab_size": 100,
                            "max_position_embeddings": 64})
    kd = make_kernel_dir(tmp_path / "k", [cfg], ops=("gemv",), weights="bf16", granule_k=32)
    from npu.xrt.kernels import LinearOps, OpKernel
    from npu.xrt.manifest import load_manifest

    xrt = XRT(simulator_for(kd, ["npu4"]))
    op = OpKernel(xrt, 0, kd / "npu2", "gemv", load_manifest(kd / "npu2").ops["gemv"])
    ops = LinearOps(op, None)
    w = ops.upload(np.ones((100, 40), dtype=np.float32))
    assert w.tiling.kp == 64
    np.testing.assert_array_equal(ops.matmul(np.ones((1, 40), np.float32), w), 40.0)
    shape = op.find(m=1, k=40, n=100)
    x_bo, y_bo = ops._io(op, shape, w.tiling, 1)
    xrt.to_device(x_bo, packing.to_bf16(np.ones(64, dtype=np.float32)))
    with pytest.raises(XRTError, match="K padding"):
        op.launch(shape, {"x": x_bo, "w": w.bo, "y": y_bo})


def test_at_most_five_buffers_and_one_context_per_runlist(tmp_path) -> None:
    s = Simulator()
    with pytest.raises(SimulatorError, match="at most 5"):
        s.register_kernel("u", "K", 9, lambda *a: 0)
    dev = s.device(0)
    contexts = []
    for i in range(2):
        uuid = write_xclbin(tmp_path / f"{i}.xclbin", ["K"])
        s.register_kernel(uuid, "K", 3, lambda *a: 0)
        contexts.append(s.hw_context(dev, dev.register_xclbin(
            s.xclbin(str(tmp_path / f"{i}.xclbin")))))
    k1 = s.kernel(contexts[1], "K")
    with pytest.raises(SimulatorError, match="own hardware context"):
        s.runlist(contexts[0]).add(s.run(k1))


# -- timing ---------------------------------------------------------------------------------
def test_timing_model_counts_launches_switches_and_bytes(tiny, tmp_path) -> None:
    from npu.xrt.timing import TimingModel

    cfg = _config(tiny)
    out = {}
    for xclbins in ("one", "per_op"):
        kd = make_kernel_dir(tmp_path / xclbins, [cfg], weights="q4g32", xclbins=xclbins)
        timing = TimingModel(launch_us=100, runlist_launch_us=70, context_switch_us=450,
                             gbps=50)
        sim = simulator_for(kd, ["npu4"], timing=timing)
        eng = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(sim)).engine
        eng.prefill("a", [1, 2, 3])
        c = sim.clock
        s0, l0, sw0, b0 = c.seconds, c.launches, c.switches, c.bytes_read
        eng.decode(["a"], [4])
        out[xclbins] = (c.seconds - s0, c.launches - l0, c.switches - sw0, c.bytes_read - b0)
    for xclbins in ("one", "per_op"):  # block mode's attn and mlp in two contexts
        kd = tmp_path / xclbins
        sim = simulator_for(kd, ["npu4"])
        eng = load_model(tiny, "npu", kernel_dir=kd, xrt=XRT(sim), npu_mode="block").engine
        eng.prefill("a", [1, 2, 3])
        s0 = sim.clock.switches
        eng.decode(["a"], [4])
        out[xclbins, "block"] = sim.clock.switches - s0
    assert out["one", "block"] == 0
    assert out["per_op", "block"] == 2 * cfg.num_layers + 1  # gemv -> attn <-> mlp -> gemv
    secs, launches, switches, nbytes = out["one"]
    assert launches == cfg.num_layers + 1 and switches == 0
    # layers in one runlist (70 us each), the lm_head alone (100 us), bytes at 50 GB/s
    assert secs == pytest.approx(cfg.num_layers * 70e-6 + 100e-6 + nbytes / 50e9)
    assert out["per_op"][2] == 2  # to the layer op's context and back to gemv's
    assert out["per_op"][0] == pytest.approx(secs + 2 * 450e-6)


# -- devices and faults ---------------------------------------------------------------------
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


@pytest.mark.parametrize("mode", ["linear", "layer"])
@pytest.mark.parametrize("fault,message", [
    ("timeouts", "ERT_CMD_STATE_TIMEOUT"),
    ("hangs", "ERT_CMD_STATE_TIMEOUT|did not complete within 200 ms"),
    ("aborts", "ERT_CMD_STATE_ABORT"),
    ("errors", "ERT_CMD_STATE_ERROR"),
])
def test_run_faults_are_errors(tiny, kdir, mode: str, fault: str, message: str) -> None:
    """A single run's wait returns its failed state; a runlist's wait raises it (layer mode),
    and a hung runlist is given up by the watchdog."""
    sim = simulator_for(kdir, ["npu4"])
    model = load_model(tiny, "npu", kernel_dir=kdir, xrt=XRT(sim, run_timeout_ms=200),
                       npu_mode=mode)
    model.engine.prefill("f", [1, 2])
    setattr(sim.faults, fault, 1)
    before = sim.clock.seconds
    try:
        with pytest.raises(XRTError, match=message):
            model.engine.decode(["f"], [3])
    finally:
        sim.release()  # the hung wait's thread returns
    if fault == "hangs" and mode == "linear":  # the run's wait(200) timed out
        assert sim.clock.seconds - before >= 0.2


def test_lost_device_is_an_error(tiny, kdir) -> None:
    sim = simulator_for(kdir, ["npu4"])
    model = load_model(tiny, "npu", kernel_dir=kdir, xrt=XRT(sim))
    sim.lose_device(0)
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


def test_kernel_checks_arguments(kdir) -> None:
    sim = simulator_for(kdir, ["npu4"])
    xrt = XRT(sim)
    ctx, xb = xrt.hw_context(0, kdir / "npu2" / "flm.xclbin")
    with pytest.raises(XRTError, match="declares 6 arguments; the manifest gives it 3 \\+ 4"):
        xrt.kernel(ctx, xb, "GEMV", buffers=4)
    k = xrt.kernel(ctx, xb, "GEMV", buffers=3)
    bad = sim.bo(sim.device(0), 8, sim.bo.host_only, 5)
    instr = sim.bo(sim.device(0), 8, sim.bo.cacheable, 1)
    runs = sim.runs
    with pytest.raises(XRTError, match="declares 6 arguments; this launch passes 7"):
        xrt.run(k, 3, instr, 2, bad, bad, bad, bad)
    with pytest.raises(XRTError, match="argument 2 is a float"):
        xrt.run(k, 3, instr, 2.0, bad, bad, bad)
    assert sim.runs == runs  # refused before any launch
    with pytest.raises(XRTError, match="group"):
        xrt.run(k, 3, instr, 2, bad, bad, bad)
    with pytest.raises(XRTError, match="is not in the xclbin"):
        xrt.kernel(ctx, xb, "OTHER", buffers=3)


def test_health_check_sees_a_lost_device(tiny, kdir) -> None:
    sim = simulator_for(kdir, ["npu4"])
    model = load_model(tiny, "npu", kernel_dir=kdir, xrt=XRT(sim))
    model.engine.check_device()  # answers
    sim.lose_device(0)
    with pytest.raises(XRTError, match="not answering"):
        model.engine.check_device()
