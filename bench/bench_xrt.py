"""What a decoded token would cost on an NPU, by the simulator's timing model.

For the Llama-3.2-1B and Qwen3-0.6B shapes (random weights), in each launch mode (linear:
4L+1 launches a token, block: 2L+1, layer: L+1 with the KV cache on the device) and weight
format (bf16, bfp16ebs8, q4g32; and `iron`: linear mode on kernels shaped as amd/IRON's
published GEMV / GEMM, bf16 row-major weights, one GEMV xclbin per K, 27 GB/s), the XRT engine runs on the pyxrt simulator after a 128-token
prompt and the bench reports: launches per token, bytes the kernels read per token (weights,
KV), bytes crossing between host and device per token (target: <= 1% of what the kernels
read), and the modelled tokens/s at the timing model's bandwidth beside FastFlowLM's published
figures (64.5 tok/s Llama-3.2-1B, 66.5 Qwen3-0.6B, Krackan), with the bandwidth at which the
modelled figure equals FastFlowLM's.

Every layer of a model has the same shapes, so the bench builds each model with 1 and 2
layers and extrapolates the per-token figures to the full depth exactly (the model's cost is
linear in its layers); the simulator's wall time means nothing (numpy).

Then the real SmolLM2-135M-Instruct (its Q4_1 GGUF: the 4-bit codes go to q4g32 kernels as
they are) answers a question greedily in layer mode on the simulator, beside the CPU engine.

    python bench/bench_xrt.py           # both shapes, every mode and format; SmolLM2
    python bench/bench_xrt.py shapes    # the shapes only; `smollm2`: SmolLM2 only
    python bench/bench_xrt.py --quick   # small shapes, q4g32 and iron (CI)
    python bench/bench_xrt.py shapes --weights iron   # one format
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import QUICK, QWEN3_06B, random_weights  # noqa: E402
from npu import config_from_json  # noqa: E402
from npu.xrt import XRT  # noqa: E402
from npu.xrt.engine import XRTEngine  # noqa: E402
from npu.xrt.sim_kernels import (make_iron_kernel_dir, make_kernel_dir,  # noqa: E402
                                 simulator_for)
from npu.xrt.timing import TimingModel  # noqa: E402

LLAMA_1B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
            "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
            "tie_word_embeddings": True}
FASTFLOWLM = {"llama-3.2-1b": 64.5, "qwen3-0.6b": 66.5}  # tok/s, published (Krackan)
PROMPT = 128


@dataclass
class Step:
    seconds: float
    launches: int
    switches: int
    read: int
    crossing: int
    device: int
    overhead: float  # seconds not spent reading memory
    wall: float  # the simulator's own time (numpy: means nothing for hardware)

    def __sub__(self, o: "Step") -> "Step":
        return Step(*(a - b for a, b in zip(vars(self).values(), vars(o).values())))

    def __add__(self, o: "Step") -> "Step":
        return Step(*(a + b for a, b in zip(vars(self).values(), vars(o).values())))

    def times(self, k: int) -> "Step":
        return Step(*(a * k for a in vars(self).values()))


FORMATS = ("q4g32", "bfp16ebs8", "bf16", "iron")


def one_step(raw: dict, layers: int, weights: str, mode: str, timing: TimingModel,
             folder: Path) -> Step:
    """One decode step's figures after the prompt, for the model with `layers` layers."""
    raw = {**raw, "num_hidden_layers": layers}
    config = config_from_json(raw)
    if weights == "iron":  # IRON's GEMV / GEMM: linear mode, their granules
        kd = make_iron_kernel_dir(folder / f"{weights}-{layers}", [config])
    else:
        kd = make_kernel_dir(folder / f"{weights}-{layers}", [config], weights=weights,
                             ctx=1024)
    sim = simulator_for(kd, ["RyzenAI-npu5"], timing=timing)
    engine = XRTEngine(config, random_weights(raw, np.random.default_rng(0)), xrt=XRT(sim),
                       device_index=0, kernel_dir=kd, mode=mode)
    engine.prefill("s", list(range(1, PROMPT + 1)))
    engine.decode(["s"], [1])  # the first step also uploads the prompt's KV: not a token's cost
    c, ops = sim.clock, engine.linear_ops

    def now() -> Step:
        return Step(c.seconds, c.launches, c.switches, c.bytes_read,
                    ops.bytes_in + ops.bytes_out, engine.weight_bytes,
                    c.seconds - c.bytes_read / (timing.gbps * 1e9), time.perf_counter())

    before = now()
    engine.decode(["s"], [2])
    step = now() - before
    step.device = engine.weight_bytes
    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="*", choices=["shapes", "smollm2", []],
                    help="what to run (default: both)")
    ap.add_argument("--quick", action="store_true", help="small shapes, q4g32 (CI)")
    ap.add_argument("--weights", nargs="*", choices=FORMATS,
                    help="the weight formats to run (default: every one; --quick: q4g32, iron)")
    ap.add_argument("--gbps", type=float, default=TimingModel.gbps,
                    help="the memory bandwidth the NPU reaches (default: %(default)s GB/s)")
    args = ap.parse_args()
    parts = args.parts or (["shapes"] if args.quick else ["shapes", "smollm2"])
    timing = TimingModel(gbps=args.gbps)
    if "shapes" in parts:
        shapes(args, timing)
    if "smollm2" in parts:
        smollm2(timing)
    return 0


def smollm2(timing: TimingModel) -> None:
    from npu import load_model

    question = "What is the capital of France?"
    cpu = load_model("smollm2-135m")
    kd = make_kernel_dir(Path(tempfile.mkdtemp()) / "k", [cpu.config], weights="q4g32",
                         ctx=512)
    sim = simulator_for(kd, ["RyzenAI-npu5"], timing=timing)
    npu = load_model("smollm2-135m", "npu", kernel_dir=kd, xrt=XRT(sim))
    ids = cpu.prompt_ids(cpu.render([{"role": "user", "content": question}]))
    print(f"\nSmolLM2-135M-Instruct (Q4_1 GGUF) on the simulator: {npu.engine.mode} mode, "
          f"{npu.engine.weight_bytes / 1e6:.1f} MB on the device, "
          f"{npu.engine.linear_ops.requantized} matrix re-quantised to q4g32 (the lm_head, "
          "tied to the Q8_0 embedding)")
    replies = {}
    for name, model in (("cpu", cpu), ("npu", npu)):
        logits = model.engine.prefill("q", ids)
        out = []
        before = sim.clock.seconds, sim.clock.launches
        steps = 0
        for _ in range(24):
            out.append(int(np.argmax(logits)))
            if out[-1] in model.eos_token_ids:
                break
            logits = model.engine.decode(["q"], [out[-1]])[0]
            steps += 1
        replies[name] = out
        extra = ""
        if name == "npu":
            secs, launches = sim.clock.seconds - before[0], sim.clock.launches - before[1]
            extra = (f"  (modelled {steps / secs:.0f} tok/s, {launches / steps:.0f} "
                     "launches a token)")
        print(f"  {name}: {model.tokenizer.decode(out)!r}{extra}")
    same = next((i for i, (a, b) in enumerate(zip(*replies.values())) if a != b),
                min(map(len, replies.values())))
    print(f"  greedy tokens identical: the first {same} (bf16 activations on the NPU against "
          "the CPU's 8-bit ones: a near-tie can go either way)")


def shapes(args: argparse.Namespace, timing: TimingModel) -> None:
    models = ({"quick": (QUICK, None)} if args.quick else
              {"llama-3.2-1b": (LLAMA_1B, FASTFLOWLM["llama-3.2-1b"]),
               "qwen3-0.6b": (QWEN3_06B, FASTFLOWLM["qwen3-0.6b"])})
    formats = args.weights or (("q4g32", "iron") if args.quick else FORMATS)
    print(f"timing model: {timing.launch_us:.0f} us a launch, {timing.runlist_launch_us:.0f} us "
          f"in a runlist, {timing.context_switch_us:.0f} us a context switch, "
          f"{timing.gbps:.0f} GB/s; decode after a {PROMPT}-token prompt")
    print(f"{'model':14} {'weights':10} {'mode':6} {'launch':>6} {'read MB':>8} "
          f"{'cross KB':>8} {'cross %':>7} {'device MB':>9} {'ms/tok':>7} {'tok/s':>6} "
          f"{'ratio':>7} {'even GB/s':>9} {'sim s':>6}")
    folder = Path(tempfile.mkdtemp())
    for name, (raw, fflm) in models.items():
        depth = raw["num_hidden_layers"]
        for weights in formats:
            for mode in ("linear",) if weights == "iron" else ("layer", "block", "linear"):
                one = one_step(raw, 1, weights, mode, timing, folder)
                two = one_step(raw, 2, weights, mode, timing, folder)
                full = one + (two - one).times(depth - 1)
                full.wall = two.wall  # (too noisy to extrapolate: the 2-layer model's)
                tok_s = 1 / full.seconds
                vs = f"{tok_s / fflm:7.2f}" if fflm else "      -"
                if fflm and 1 / fflm > full.overhead:
                    even = f"{full.read / (1 / fflm - full.overhead) / 1e9:9.1f}"
                else:
                    even = "        -"
                print(f"{name:14} {weights:10} {mode:6} {full.launches:6d} "
                      f"{full.read / 1e6:8.1f} {full.crossing / 1e3:8.1f} "
                      f"{100 * full.crossing / full.read:7.3f} {full.device / 1e6:9.1f} "
                      f"{1e3 * full.seconds:7.2f} {tok_s:6.1f} {vs} {even} {full.wall:6.1f}",
                      flush=True)
    print("read: weights, activations and KV the kernels read per token; cross: host <-> "
          "device per token; device: weight bytes on the device; ratio: "
          "modelled tok/s / FastFlowLM's published tok/s; even: the bandwidth at which the "
          "modelled tok/s equals FastFlowLM's; sim s: the simulator's own wall time for a token of "
          "the 2-layer model (numpy: not a hardware figure)")
    print("iron: IRON's GEMV per K (its own xclbin: a context switch between K's) at its "
          "published 20-35 GB/s (27 modelled), bf16 weights")
    print("targets: layer mode with q4g32 weights >= 1.0x FastFlowLM at the same bandwidth; "
          "cross <= 1% of read")


if __name__ == "__main__":
    raise SystemExit(main())
