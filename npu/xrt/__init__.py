"""npu.xrt: the NPU path: the pyxrt adapter and GEMM kernel (`adapter`), the engine that runs
linear layers on it (`engine`), and the simulator of the pyxrt calls it makes (`sim`)."""

from npu.xrt.adapter import (XRT, DeviceInfo, DeviceWeight, GemmKernel, Manifest, XRTError,
                             XRTUnavailable, generation_of, import_pyxrt)

__all__ = ["XRT", "DeviceInfo", "DeviceWeight", "GemmKernel", "Manifest", "XRTError",
           "XRTUnavailable", "generation_of", "import_pyxrt"]
