"""XRTEngine: the numpy engine with its linear layers on an NPU GEMM kernel.

Attention projections, MLP, LFM2's projections and the lm_head run through `GemmKernel`;
their weights are tiled and uploaded once at load and the host copies dropped, so per step
only activations cross. Norms, RoPE, attention softmax, the short convolution and sampling
stay in numpy. Same interface as `NumpyEngine`, so workers, batching and constraints work
unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npu.load.config import ModelConfig
from npu.engine.numpy_engine import NumpyEngine, _Layer
from npu.xrt.adapter import XRT, GemmKernel

LINEAR = ("wqkv", "wo", "w_gate_up", "w_down", "in_proj", "out_proj")


class XRTEngine(NumpyEngine):
    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray], *, xrt: XRT,
                 device_index: int, kernel_dir: Path, kv_cache_bytes: int | None = None,
                 prefix_cache: bool = True) -> None:
        super().__init__(config, weights, kv_cache_bytes=kv_cache_bytes,
                         prefix_cache=prefix_cache)
        self.gemm = GemmKernel(xrt, device_index, kernel_dir)
        self.device_index = device_index
        self._dev = {}
        for L in self.layers:
            for name in LINEAR:
                w = getattr(L, name)
                if w is not None:
                    self._dev[(L.index, name)] = self.gemm.upload(w.dequantize())
                    setattr(L, name, None)  # the device holds it now
        self._dev[(-1, "lm_head")] = self.gemm.upload(self.lm_head.dequantize())
        self.lm_head = None

    @property
    def weight_bytes(self) -> int:
        return self.gemm.weight_bytes

    def check_device(self) -> None:
        """Raise XRTError when the NPU is gone (for health checks)."""
        xrt = self.gemm.xrt
        try:
            xrt.device(self.device_index).get_info(xrt.x.xrt_info_device.name)
        except Exception as exc:
            from npu.xrt.adapter import XRTError

            raise XRTError(f"NPU {self.device_index} is not answering: {exc}") from None

    def _mm(self, x: np.ndarray, layer: _Layer | None, name: str) -> np.ndarray:
        key = (-1, name) if layer is None else (layer.index, name)
        return self.gemm.matmul(np.ascontiguousarray(x, dtype=np.float32), self._dev[key])
