"""bf16 floor rounding as the AIE cores do it (toward minus infinity), the instruction-length
unit and format a manifest declares, and the device names a generation is read from."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from npu.xrt import XRTError, generation_of
from npu.xrt.manifest import Op, load_manifest
from npu.xrt.packing import from_bf16, to_bf16


def _bits(values: list[float]) -> np.ndarray:
    return to_bf16(np.array(values, dtype=np.float32), "floor")


def test_floor_rounds_negative_values_down_one_bf16_step() -> None:
    # -1.0039 (f32 0xBF808000) lies between the bf16 values -1.0 (0xBF80) and -1.0078125
    # (0xBF81): toward minus infinity is 0xBF81, as IRON's f32_to_bf16_floor gives on hardware
    assert _bits([-1.00390625]).tolist() == [0xBF81]
    assert from_bf16(_bits([-1.00390625]))[0] == -1.0078125
    # a positive inexact value drops its low bits (down, toward minus infinity too)
    assert _bits([1.00390625]).tolist() == [0x3F80]
    # exact values, signed zeros and infinities are kept as they are
    assert _bits([-1.0, -0.0, 0.0, -np.inf, np.inf]).tolist() == [
        0xBF80, 0x8000, 0x0000, 0xFF80, 0x7F80]
    # the smallest inexact step below a negative value: -(1 + 2**-23) -> -(1 + 2**-7)
    assert _bits([np.float32(-1.0000001)]).tolist() == [0xBF81]
    # the most negative finite f32 with low bits set rounds to minus infinity
    assert _bits([np.frombuffer(np.uint32(0xFF7FFFFF).tobytes(), np.float32)[0]]).tolist() \
        == [0xFF80]
    assert _bits([np.nan]).tolist() == [0x7FC0]


def test_floor_is_never_above_the_value_and_within_one_step() -> None:
    x = np.random.default_rng(3).standard_normal(10_000).astype(np.float32) * 100
    got = from_bf16(to_bf16(x, "floor"))
    assert np.all(got <= x)
    up = from_bf16(to_bf16(x, "floor") + np.where(x < 0, -1, 1).astype(np.uint16))
    assert np.all((got == x) | (np.abs(up - got) >= np.abs(x - got)))


def _op(**kw) -> dict:
    return {"xclbin": "k.xclbin", "dtype": {"x": "bf16", "w": "bf16", "y": "bf16"},
            "layout": "bf16.v1", "granule": {"n": 32, "k": 32}, "args": ["x", "w", "y"],
            "shapes": [{"insts": "gemv.bin", "m": 1, "k": 32, "n": 32}], **kw}


def test_instruction_length_is_in_bytes_unless_the_manifest_says_words() -> None:
    op = msgspec.convert(_op(), Op)
    assert op.instr_length == "bytes"
    assert msgspec.convert(_op(instr_length="words"), Op).instr_length == "words"


def test_text_instruction_streams_are_refused(tmp_path) -> None:
    folder = tmp_path / "npu2"
    folder.mkdir()
    op = _op(shapes=[{"insts": "insts.txt", "m": 1, "k": 32, "n": 32}])
    (folder / "manifest.json").write_text(json.dumps(
        {"version": 2, "generation": "npu2", "ops": {"gemv": op}}))
    with pytest.raises(XRTError, match="insts.txt is a text listing"):
        load_manifest(folder)


@pytest.mark.parametrize("name,generation", [
    ("NPU Gorgon Point", "XDNA2"), ("NPU Strix", "XDNA2"), ("NPU Krackan", "XDNA2"),
    ("RyzenAI-npu4", "XDNA2"), ("NPU Phoenix", "XDNA1"), ("RyzenAI-npu1", "XDNA1"),
    ("Alveo U250", "unknown"),
])
def test_device_names_give_their_generation(name: str, generation: str) -> None:
    assert generation_of(name) == generation


def test_instruction_stream_headers_are_checked_at_load(tmp_path) -> None:
    from npu import config_from_json
    from npu.xrt import XRT
    from npu.xrt.kernels import OpKernel
    from npu.xrt.sim_kernels import make_kernel_dir, simulator_for

    cfg = config_from_json({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                            "intermediate_size": 96, "num_hidden_layers": 1,
                            "num_attention_heads": 2, "num_key_value_heads": 1,
                            "vocab_size": 100, "max_position_embeddings": 64})
    kd = make_kernel_dir(tmp_path / "k", [cfg], ops=("gemv",), weights="bf16",
                         generations=("npu1",))
    folder = kd / "npu1"
    op = load_manifest(folder).ops["gemv"]
    OpKernel(XRT(simulator_for(kd, ["npu1"])), 0, folder, "gemv", op)  # as built: opens
    stream = folder / op.shapes[0].insts
    words = np.fromfile(stream, dtype=np.uint32)
    for edit, message in [(lambda w: w[:-1], "header gives 128 bytes, the file holds 124"),
                          (lambda w: np.concatenate([w[:1], [8], w[2:]]).astype(np.uint32),
                           "built for 8 columns; npu1 has 4"),
                          (lambda w: w[:3], "shorter than a stream's header")]:
        edit(words).tofile(stream)
        with pytest.raises(XRTError, match=message):
            OpKernel(XRT(simulator_for(kd, ["npu1"])), 0, folder, "gemv", op)
