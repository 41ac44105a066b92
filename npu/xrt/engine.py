"""XRTEngine: the numpy engine with its linear layers, or whole decoder layers, on an NPU.

The kernel directory (`npu.xrt.manifest`, version 2) has a sub-directory per NPU generation;
the engine opens the one for its device and refuses a mismatch. Modes (launches per decoded
token for L layers):

- "linear": attention projections, MLP, LFM2's projections and the lm_head on `gemv` (one
  row) / `gemm` (prompts and batches, M rows a launch); 4L + 1 launches. Norms, RoPE,
  attention and sampling on the host.
- "block": the `attn` and `mlp` ops (2L + 1), "layer": the `layer` op (L + 1): each decoded
  token runs its layers on the device with the sequence's KV cache resident there (bf16),
  submitted as one runlist per token when pyxrt has `runlist`. The host mirrors each new
  key / value (the kernel returns them) into its paged cache, so prompts, prefix reuse and
  forks work as on the CPU; rows the device lacks are uploaded before a sequence's step.
  Prompts run on the linear ops. A batch runs its sequences' layer launches one sequence
  after another (no published NPU kernel takes a batch: a skinny GEMM would be needed) and
  its lm_head as one `gemm`.
- "auto" (default): the most fused mode the directory has shapes for.

Weights are packed once at load by the manifest's packer (`npu.xrt.packing`); in "block" and
"layer" modes each layer's weights are on the device twice (the layer pack and the linear
ops' copy for prompts: a kernel taking sub-buffers of one pack would remove this).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from npu.engine.kv_cache import BLOCK
from npu.engine.numpy_engine import NumpyEngine, _Layer, _Seq
from npu.load.config import ModelConfig
from npu.xrt import layer_pack, packing
from npu.xrt.adapter import XRT, XRTError
from npu.xrt.kernels import LinearOps, OpKernel, pack_weight
from npu.xrt.manifest import generation_dir, load_manifest
from npu.xrt.shapes import layer_dims, layer_support, linear_shapes
from npu.xrt.adapter import generation_of

log = logging.getLogger(__name__)

LINEAR = ("wqkv", "wo", "w_gate_up", "w_down", "in_proj", "out_proj")
MODES = ("auto", "linear", "block", "layer")


class _Slot:
    """A sequence's state on the device: its KV cache per layer, residual stream, position,
    and the new key / value each layer returns."""

    def __init__(self, kv: list[Any], x: Any, rtp: Any, kvnew: list[Any]) -> None:
        self.kv, self.x, self.rtp, self.kvnew = kv, x, rtp, kvnew
        self.rows = 0  # positions of the sequence the device's KV holds


class XRTEngine(NumpyEngine):
    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray], *, xrt: XRT,
                 device_index: int, kernel_dir: Path, mode: str = "auto",
                 kv_cache_bytes: int | None = None, prefix_cache: bool = True) -> None:
        if mode not in MODES:
            raise XRTError(f"npu mode {mode!r} is not one of {', '.join(MODES)}")
        super().__init__(config, weights, kv_cache_bytes=kv_cache_bytes,
                         prefix_cache=prefix_cache)
        self.xrt, self.device_index = xrt, device_index
        name = str(xrt.device(device_index).get_info(xrt.x.xrt_info_device.name))
        folder = generation_dir(Path(kernel_dir), generation_of(name), name)
        self.manifest = m = load_manifest(folder)
        ops = {n: OpKernel(xrt, device_index, folder, n, op) for n, op in m.ops.items()}
        self.linear_ops = LinearOps(ops["gemv"], ops.get("gemm"))
        missing = self.linear_ops.missing(linear_shapes(config))
        if missing:
            raise XRTError(f"{folder}: the kernels were not built for {config.arch}'s shapes; "
                           f"missing {', '.join(missing)}")
        self.mode = self._choose(mode, ops, folder)
        self._dev = {}
        for L in self.layers:
            for lname in LINEAR:
                w = getattr(L, lname)
                if w is not None:
                    self._dev[(L.index, lname)] = self.linear_ops.upload(w)
        self._dev[(-1, "lm_head")] = self.linear_ops.upload(self.lm_head)
        self.lm_head = None
        self.layer_bytes = 0
        self._slots: dict[int, _Slot] = {}
        if self.mode != "linear":
            self._upload_layers(ops)
        for L in self.layers:  # the device holds them now
            for lname in LINEAR:
                setattr(L, lname, None)
        if self.linear_ops.requantized:
            log.info("%d weights were re-quantised to %s (their format is not the kernels')",
                     self.linear_ops.requantized, self.linear_ops.layout)
        log.info("NPU %d (%s, %s): %s mode, %.1f MB of weights on the device", device_index,
                 name, m.generation, self.mode, self.weight_bytes / 1e6)

    # -- setup ------------------------------------------------------------------------------
    def _choose(self, mode: str, ops: dict[str, OpKernel], folder: Path) -> str:
        why = layer_support(self.config)
        dims = {}
        for name in ("layer", "attn", "mlp"):
            op = ops.get(name)
            s = None
            if op is not None and why is None:
                want = layer_dims(self.config, 0).__dict__
                s = next((s for s in op.op.shapes if all(
                    getattr(s, k) == v for k, v in want.items() if k != "ctx")), None)
            dims[name] = s
        have = {"layer": dims["layer"] is not None,
                "block": dims["attn"] is not None and dims["mlp"] is not None}
        if mode == "auto":
            mode = "layer" if have["layer"] else "block" if have["block"] else "linear"
        elif mode != "linear" and not have[mode]:
            raise XRTError(f"npu mode {mode!r}: "
                           + (why or f"{folder} has no {mode} op shapes for "
                              f"{self.config.arch}'s layer dimensions"))
        if mode != "linear":
            first = "layer" if mode == "layer" else "attn"
            self._layer_shape = dims[first]
            self._mlp_shape = dims["mlp"]
            self.max_context = min(self.max_context, self._layer_shape.ctx)
        return mode

    def _upload_layers(self, ops: dict[str, OpKernel]) -> None:
        c = self.config
        s = self._layer_shape
        self._dims = layer_dims(c, s.ctx)
        names = ["layer"] if self.mode == "layer" else ["attn", "mlp"]
        self._ops = [ops[n] for n in names]
        self._packs: list[list[Any]] = []
        for L in self.layers:
            bos = []
            for op in self._ops:
                data = self._pack(op, L)
                bo = op.bo("w", data.nbytes)
                self.xrt.to_device(bo, data)
                self.layer_bytes += data.nbytes
                bos.append(bo)
            self._packs.append(bos)

    def _pack(self, op: OpKernel, L: _Layer) -> np.ndarray:
        c, d = self.config, self._dims
        layout, tn, tk = op.op.layout, op.op.granule["n"], op.op.granule["k"]

        def packer(linear):
            return lambda t: pack_weight(linear, t)[0]

        parts = []
        if op.name in ("attn", "layer"):
            parts.append(layer_pack.pack_attn(
                d, layout, tn, tk, norm_in=L.norm_in, q_norm=L.q_norm, k_norm=L.k_norm,
                inv_freq=L.inv_freq, rope_scale=L.rope_scale, scale=float(self.scale),
                eps=c.rms_eps, wqkv=packer(L.wqkv), wo=packer(L.wo)))
        if op.name in ("mlp", "layer"):
            parts.append(layer_pack.pack_mlp(
                d, layout, tn, tk, norm_pre_ff=L.norm_pre_ff, eps=c.rms_eps,
                w_gate_up=packer(L.w_gate_up), w_down=packer(L.w_down)))
        return np.concatenate(parts)

    # -- the interface ----------------------------------------------------------------------
    @property
    def gemm(self) -> LinearOps:
        return self.linear_ops

    @property
    def weight_bytes(self) -> int:
        return self.linear_ops.weight_bytes + self.layer_bytes

    def check_device(self) -> None:
        """Raise XRTError when the NPU is gone (for health checks)."""
        xrt = self.xrt
        try:
            xrt.device(self.device_index).get_info(xrt.x.xrt_info_device.name)
        except Exception as exc:
            raise XRTError(f"NPU {self.device_index} is not answering: {exc}") from None

    def release(self, seq_id: object) -> None:
        seq = self._seqs.get(seq_id)
        if seq is not None:
            self._slots.pop(id(seq), None)
        super().release(seq_id)

    def _mm(self, x: np.ndarray, layer: _Layer | None, name: str) -> np.ndarray:
        key = (-1, name) if layer is None else (layer.index, name)
        return self.linear_ops.matmul(np.ascontiguousarray(x, dtype=np.float32),
                                      self._dev[key])

    def _forward(self, ids: np.ndarray, segments: list[tuple[_Seq, int]]) -> np.ndarray:
        if self.mode == "linear" or len(segments) != len(ids):
            return super()._forward(ids, segments)
        x = self.embed(ids)
        for b, (seq, _) in enumerate(segments):
            x[b] = self._decode_on_device(seq, x[b])
        for b, (seq, _) in enumerate(segments):
            self.kv.written(seq.kv, ids[b : b + 1])
        last = self.ops.rms_norm(x, self.final_norm, self.config.rms_eps)
        return np.ascontiguousarray(self._mm(last, None, "lm_head"), dtype=np.float32)

    # -- decode on the device ---------------------------------------------------------------
    def _slot(self, seq: _Seq) -> _Slot:
        slot = self._slots.get(id(seq))
        if slot is None:
            d, op = self._dims, self._ops[0]
            n = len(self.layers)
            x_bytes = d.hidden * (2 if op.op.dtype["x"] == "bf16" else 4)
            slot = _Slot([op.bo("kv", layer_pack.kv_bytes(d)) for _ in range(n)],
                         op.bo("x", x_bytes), op.bo("rtp", 16),
                         [op.bo("kvnew", layer_pack.kvnew_bytes(d)) for _ in range(n)])
            self._slots[id(seq)] = slot
        return slot

    def _upload_rows(self, seq: _Seq, slot: _Slot) -> None:
        """The host cache's rows [slot.rows, pos) of every layer to the device's cache."""
        start, stop = slot.rows, seq.pos
        if start >= stop:
            return
        d = self._dims
        table = np.asarray(seq.kv.table, dtype=np.int64)
        positions = np.arange(start, stop)
        blocks, offs = table[positions // BLOCK], positions % BLOCK
        for li, bo in enumerate(slot.kv):
            for which, store in enumerate((self.kv.k[li], self.kv.v[li])):
                rows = store[blocks, :, offs].astype(np.float32)  # [T, kv_heads, head_dim]
                bits = packing.to_bf16(rows.transpose(1, 0, 2))
                for h in range(d.kv_heads):
                    offset = ((which * d.kv_heads + h) * d.ctx + start) * d.head_dim * 2
                    data = np.ascontiguousarray(bits[h]).view(np.uint8).ravel()
                    bo.write(data, offset)
                    bo.sync(self.xrt.x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE,
                            data.nbytes, offset)
                    self.linear_ops.bytes_in += data.nbytes
        slot.rows = stop

    def _decode_on_device(self, seq: _Seq, x: np.ndarray) -> np.ndarray:
        d, op0 = self._dims, self._ops[0]
        slot = self._slot(seq)
        try:
            self._upload_rows(seq, slot)
        except Exception as exc:
            raise XRTError(f"copy to the NPU failed: {exc}") from None
        pos = seq.pos
        x_bf16 = op0.op.dtype["x"] == "bf16"
        xin = packing.to_bf16(x) if x_bf16 else np.ascontiguousarray(x, dtype=np.float32)
        self.xrt.to_device(slot.x, xin)
        self.xrt.to_device(slot.rtp, np.array([pos, 0, 0, 0], dtype=np.int32))
        launches = []
        for li in range(len(self.layers)):
            for op, w in zip(self._ops, self._packs[li]):
                shape = self._layer_shape if op.name != "mlp" else self._mlp_shape
                launches.append(op.call(shape, {
                    "x": slot.x, "w": w, "kv": slot.kv[li], "rtp": slot.rtp,
                    "kvnew": slot.kvnew[li]}))
        self.xrt.run_all(op0.ctx, launches)
        self.linear_ops.runs += len(launches)
        raw = self.xrt.from_device(slot.x, xin.nbytes)
        out = packing.from_bf16(raw.view(np.uint16)) if x_bf16 else raw.view(np.float32)
        new_bytes = layer_pack.kvnew_bytes(d)
        table = seq.kv.table
        block, off = table[pos // BLOCK], pos % BLOCK
        for li, bo in enumerate(slot.kvnew):
            kv = packing.from_bf16(self.xrt.from_device(bo, new_bytes).view(np.uint16))
            kv = kv.reshape(2, d.kv_heads, d.head_dim)
            self.kv.k[li][block, :, off] = kv[0]
            self.kv.v[li][block, :, off] = kv[1]
            self.linear_ops.bytes_out += new_bytes
        self.linear_ops.bytes_in += xin.nbytes + 16
        self.linear_ops.bytes_out += xin.nbytes
        slot.rows = pos + 1
        return out.astype(np.float32)
