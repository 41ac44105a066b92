"""XRTEngine: the numpy engine with its linear layers, or whole decoder layers, on an NPU.

The kernel directory (`npu.xrt.manifest`, version 2) has a sub-directory per NPU generation;
the engine opens the one for its device and refuses a mismatch. Modes (launches per decoded
token for L layers):

- "linear": attention projections, MLP, LFM2's projections and the lm_head on `gemv` (one
  row) / `gemm` (prompts and batches, M rows a launch); 4L + 1 launches. Norms, RoPE,
  attention and sampling on the host.
- "block": the `attn` and `mlp` ops (2L + 1), "layer": the `layer` op (L + 1): a sequence's
  tokens run their layers on the device with its KV cache resident there (bf16): a decoded
  token as one launch per op and layer, a prompt in tiles of the op's prompt shape (m rows;
  one row at a time where a tile would pass the device cache's end), submitted as one
  runlist per tile when pyxrt has `runlist`. The host mirrors each new key / value (the
  kernel returns them) into its paged cache, so prefix reuse and forks work as on the CPU;
  rows the device lacks are uploaded before a sequence's launches. Only the lm_head is on
  the linear ops. A batch runs its sequences' layers one sequence after another (no
  published NPU kernel takes a batch of sequences: that needs a skinny GEMM) and its lm_head
  as one `gemm`.
- "auto" (default): the most fused mode the directory has shapes for.

Weights are packed once at load by the manifest's packer (`npu.xrt.packing`) and are on the
device once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npu.config import ModelConfig
from npu.engine.kv_cache import BLOCK
from npu.engine.numpy_engine import Layer, NumpyEngine, Seq
from npu.engine.pooling import Pooling
from npu.engine.steps import Steps
from npu.errors import ModelError
from npu.xrt import layer_pack, packing
from npu.xrt.adapter import XRT, XRTError, generation_of
from npu.xrt.kernels import LinearOps, OpKernel, pack_weight
from npu.xrt.manifest import generation_dir, load_manifest
from npu.xrt.shapes import layer_dims, layer_support, linear_shapes

log = logging.getLogger(__name__)

LINEAR = ("wqkv", "wo", "w_gate_up", "w_down", "in_proj", "out_proj")
MODES = ("auto", "linear", "block", "layer")


class _Slot:
    """A sequence's state on the device: its KV cache per layer, position buffer, and per
    tile size the residual stream and the new keys / values each layer returns."""

    def __init__(self, kv: list[Any], rtp: Any) -> None:
        self.kv, self.rtp = kv, rtp
        self.io: dict[int, tuple[Any, list[Any]]] = {}
        self.rows = 0  # positions of the sequence the device's KV holds


class XRTEngine(NumpyEngine):
    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray], *, xrt: XRT,
                 device_index: int, kernel_dir: Path, mode: str = "auto",
                 kv_cache_bytes: int | None = None, prefix_cache: bool = True,
                 pooling: Pooling | None = None) -> None:
        if mode not in MODES:
            raise XRTError(f"npu mode {mode!r} is not one of {', '.join(MODES)}")
        super().__init__(config, weights, kv_cache_bytes=kv_cache_bytes,
                         prefix_cache=prefix_cache, pooling=pooling)
        self.xrt, self.device_index = xrt, device_index
        name = str(xrt.device(device_index).get_info(xrt.x.xrt_info_device.name))
        folder = generation_dir(Path(kernel_dir), generation_of(name), name)
        self.manifest = m = load_manifest(folder)
        ops = {n: OpKernel(xrt, device_index, folder, n, op) for n, op in m.ops.items()}
        self.linear_ops = LinearOps(ops["gemv"], ops.get("gemm"))
        self.mode = self._choose(mode, ops, folder)
        c = config
        wanted = linear_shapes(c) if self.mode == "linear" else [(c.vocab_size, c.hidden_size)]
        missing = self.linear_ops.missing(wanted)
        if missing:
            raise XRTError(f"{folder}: the kernels were not built for {c.arch}'s shapes; "
                           f"missing {', '.join(missing)}")
        self._dev = {}
        self.layer_bytes = 0
        self._slots: dict[int, _Slot] = {}
        # the model's parameters and format, as loaded (the host drops what it uploads)
        self._summary = super().weight_summary()
        if self.mode == "linear":
            for L in self.layers:
                for lname in LINEAR:
                    w = getattr(L, lname)
                    if w is not None:
                        self._dev[(L.index, lname)] = self.linear_ops.upload(w)
        else:
            self._upload_layers(ops)
        self._dev[(-1, "lm_head")] = self.linear_ops.upload(self.lm_head)
        self.lm_head = None
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
        """The mode, and for the layer modes each op's decode shape (m = 1) and prompt shape
        (the largest m) for this model's layers."""
        why = layer_support(self.config)
        want = {k: v for k, v in layer_dims(self.config, 0).__dict__.items()
                if k not in ("ctx", "m")}
        shapes: dict[str, list] = {}
        for name in ("layer", "attn", "mlp"):
            op = ops.get(name)
            fits = [] if op is None or why is not None else [
                s for s in op.op.shapes if all(getattr(s, k) == v for k, v in want.items())]
            one = [s for s in fits if s.m == 1]
            shapes[name] = [one[0], max(fits, key=lambda s: (s.ctx == one[0].ctx, s.m))] \
                if one else []
        have = {"layer": bool(shapes["layer"]),
                "block": bool(shapes["attn"]) and bool(shapes["mlp"])}
        if mode == "auto":
            mode = "layer" if have["layer"] else "block" if have["block"] else "linear"
        elif mode != "linear" and not have[mode]:
            raise XRTError(f"npu mode {mode!r}: "
                           + (why or f"{folder} has no {mode} op shapes (m = 1 at least) for "
                              f"{self.config.arch}'s layer dimensions"))
        if mode != "linear":
            names = ["layer"] if mode == "layer" else ["attn", "mlp"]
            self._ops = [ops[n] for n in names]
            self._shapes = {n: shapes[n] for n in names}  # [decode shape, prompt shape]
            if len({self._shapes[n][1].m for n in names}) > 1:  # attn and mlp must agree
                self._shapes = {n: [s[0], s[0]] for n, s in self._shapes.items()}
            ctx = shapes[names[0]][0].ctx
            self._dims = layer_dims(self.config, ctx)
            self.max_context = min(self.max_context, ctx)
        return mode

    def _upload_layers(self, ops: dict[str, OpKernel]) -> None:
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

    def _pack(self, op: OpKernel, L: Layer) -> np.ndarray:
        c, d = self.config, self._dims
        layout, tn, tk = op.op.layout, op.op.granule["n"], op.op.granule["k"]

        def packer(linear):
            def pack(t):
                data, requantized = pack_weight(linear, t)
                self.linear_ops.requantized += requantized
                return data
            return pack

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
    def weight_bytes(self) -> int:
        return self.linear_ops.weight_bytes + self.layer_bytes

    def weight_summary(self) -> dict[str, Any]:
        """The loaded model's (the CPU engine's): its matrices are on the device now."""
        return dict(self._summary)

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

    def _mm(self, x: np.ndarray, layer: Layer | None, name: str) -> np.ndarray:
        key = (-1, name) if layer is None else (layer.index, name)
        return self.linear_ops.matmul(np.ascontiguousarray(x, dtype=np.float32),
                                      self._dev[key])

    @property
    def can_rewind(self) -> bool:
        """Only in "linear" mode: the fused modes keep the KV cache on the device."""
        return self.mode == "linear" and super().can_rewind

    def verify(self, items: Sequence[tuple[object, Sequence[int]]]) -> np.ndarray:
        """NumpyEngine's, in "linear" mode only (the fused modes keep the KV cache on the
        device, where it cannot be rewound)."""
        if self.mode != "linear":
            raise ModelError(f"npu_mode {self.mode!r} cannot verify drafted tokens")
        return super().verify(items)

    def _forward(self, ids: np.ndarray, segments: list[tuple[Seq, int]], *,
                 every_row: bool = False) -> np.ndarray:
        if self.mode == "linear":
            return super()._forward(ids, segments, every_row=every_row)
        x = self.embed_tokens(ids)
        start = 0
        ends = []
        for seq, n in segments:
            x[start : start + n] = self._on_device(seq, x[start : start + n])
            self.kv.written(seq.kv, ids[start : start + n])
            start += n
            ends.append(start - 1)
        last = self.ops.rms_norm(x if every_row else x[ends], self.final_norm,
                                 self.config.rms_eps)
        return np.ascontiguousarray(self._mm(last, None, "lm_head"), dtype=np.float32)

    def _embed_hidden(self, ids: np.ndarray, lengths: list[int],
                      positions: np.ndarray) -> Steps[np.ndarray]:
        """"linear" mode: `embed`'s layers as the CPU runs them, their products on the NPU.
        The fused modes' kernels attend over the device's KV cache only (no cache-free
        attention): no embeddings there."""
        if self.mode != "linear":
            raise ModelError(f"embeddings on the NPU need npu_mode 'linear' (this engine runs "
                             f"in {self.mode!r} mode, whose kernels attend over the device's "
                             "KV cache only)")
        return (yield from super()._embed_hidden(ids, lengths, positions))

    # -- layers on the device --------------------------------------------------------------
    def _slot(self, seq: Seq) -> _Slot:
        slot = self._slots.get(id(seq))
        if slot is None:
            d, op = self._dims, self._ops[0]
            slot = _Slot([op.bo("kv", layer_pack.kv_bytes(d)) for _ in self.layers],
                         op.bo("rtp", 16) if "rtp" in op.op.args else None)
            self._slots[id(seq)] = slot
        return slot

    def _io(self, slot: _Slot, m: int) -> tuple[Any, list[Any]]:
        """The slot's x buffer and per-layer kvnew buffers for tiles of m rows."""
        have = slot.io.get(m)
        if have is None:
            op = self._ops[0]
            d = dataclasses.replace(self._dims, m=m)
            size = 2 if op.op.dtype["x"] == "bf16" else 4
            have = slot.io[m] = (op.bo("x", m * d.hidden * size),
                                 [op.bo("kvnew", layer_pack.kvnew_bytes(d))
                                  for _ in self.layers])
        return have

    def _upload_rows(self, seq: Seq, slot: _Slot) -> None:
        """The host cache's rows [slot.rows, pos) of every layer to the device's cache."""
        start, stop = slot.rows, seq.pos
        if start >= stop:
            return
        d = self._dims
        table = np.asarray(seq.kv.table, dtype=np.int64)
        positions = np.arange(start, stop)
        blocks, offs = table[positions // BLOCK], positions % BLOCK
        to_device = self.xrt.x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        try:
            for li, bo in enumerate(slot.kv):
                for which, store in enumerate((self.kv.k[li], self.kv.v[li])):
                    rows = store[blocks, :, offs].astype(np.float32)  # [T, kv_heads, dim]
                    bits = packing.to_bf16(rows.transpose(1, 0, 2))
                    for h in range(d.kv_heads):
                        offset = ((which * d.kv_heads + h) * d.ctx + start) * d.head_dim * 2
                        data = np.ascontiguousarray(bits[h]).view(np.uint8).ravel()
                        bo.write(data, offset)
                        bo.sync(to_device, data.nbytes, offset)
                        self.linear_ops.bytes_in += data.nbytes
        except Exception as exc:
            raise XRTError(f"copy to the NPU failed: {exc}") from None
        slot.rows = stop

    def _on_device(self, seq: Seq, x: np.ndarray) -> np.ndarray:
        """The residual stream x [n, hidden] of the sequence's next n tokens through every
        layer on the device: tiles of the prompt shape's m rows, single rows where a tile
        would pass the device cache's end (or n is 1)."""
        slot = self._slot(seq)
        self._upload_rows(seq, slot)
        prompt_m = self._shapes[self._ops[0].name][1].m
        out = np.empty_like(x)
        done = 0
        while done < len(x):
            left = len(x) - done
            pos = seq.pos + done
            m = prompt_m if left > 1 and pos + prompt_m <= self._dims.ctx else 1
            rows = min(m, left)
            out[done : done + rows] = self._tile(seq, slot, x[done : done + rows], pos, m)
            done += rows
        slot.rows = seq.pos + len(x)
        return out

    def _tile(self, seq: Seq, slot: _Slot, x: np.ndarray, pos: int, m: int) -> np.ndarray:
        """One launch per op and layer for the tokens at pos.. (x: their rows, at most m)."""
        d, op0 = self._dims, self._ops[0]
        x_bo, kvnew = self._io(slot, m)
        x_bf16 = op0.op.dtype["x"] == "bf16"
        tile = np.zeros((m, d.hidden), dtype=np.float32)
        tile[: len(x)] = x
        xin = packing.to_bf16(tile) if x_bf16 else tile
        self.xrt.to_device(x_bo, xin)
        index = 0 if m == 1 else 1
        if slot.rtp is not None:
            self.xrt.to_device(slot.rtp, np.array([pos, 0, 0, 0], dtype=np.int32))
        for op in self._ops:  # ops that take them in the instruction stream
            if op.op.scalars == "insts":
                op.set_scalars(self._shapes[op.name][index], pos=pos, len=pos + len(x))
        launches = []
        for li in range(len(self.layers)):
            for op, w in zip(self._ops, self._packs[li]):
                shape = self._shapes[op.name][index]
                launches.append((op.context(shape), *op.call(shape, {
                    "x": x_bo, "w": w, "kv": slot.kv[li], "rtp": slot.rtp,
                    "kvnew": kvnew[li]}, pos=pos, len=pos + len(x))))
        self.xrt.run_all(launches)
        self.linear_ops.runs += len(launches)
        n = len(x)
        size = 2 if x_bf16 else 4
        raw = self.xrt.from_device(x_bo, n * d.hidden * size)
        out = packing.from_bf16(raw.view(np.uint16)) if x_bf16 else raw.view(np.float32)
        new_bytes = n * 2 * d.kv_heads * d.head_dim * 2
        table = np.asarray(seq.kv.table, dtype=np.int64)
        positions = np.arange(pos, pos + n)
        blocks, offs = table[positions // BLOCK], positions % BLOCK
        for li, bo in enumerate(kvnew):
            kv = packing.from_bf16(self.xrt.from_device(bo, new_bytes).view(np.uint16))
            kv = kv.reshape(n, 2, d.kv_heads, d.head_dim)
            self.kv.k[li][blocks, :, offs] = kv[:, 0]
            self.kv.v[li][blocks, :, offs] = kv[:, 1]
            self.linear_ops.bytes_out += new_bytes
        self.linear_ops.bytes_in += xin.nbytes + (16 if slot.rtp is not None else 0)
        self.linear_ops.bytes_out += raw.nbytes
        return out.reshape(n, d.hidden)
