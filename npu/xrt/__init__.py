"""npu.xrt: the NPU path. `adapter` (the pyxrt calls), `manifest` (kernel directories,
version 2), `bf16` (bfloat16 bits), `packing` and `layer_pack` (weight layouts), `iron_pack`
and `q4nx` (the weight orders IRON's flm.GEMM and FastFlowLM's Q4NX kernels read),
`kernels` (ops on a device), `engine` (the XRT engine), `check` (npu-check: each linear
kernel shape against numpy), and for CI and development without an NPU, `sim` (a simulator
of the pyxrt calls), `sim_kernels` (what the manifest's kernels compute) and `timing`
(launch costs)."""

from npu.xrt.adapter import XRT, DeviceInfo, XRTError, XRTUnavailable, generation_of, import_pyxrt

__all__ = ["XRT", "DeviceInfo", "XRTError", "XRTUnavailable", "generation_of", "import_pyxrt"]
