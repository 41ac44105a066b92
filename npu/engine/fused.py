"""A forward's decoder layers in one call of the compiled kernels (cpu_kernels.c's
`fk_forward`): the threads stay up across every layer of a step and go from one phase to the
next at a barrier (a small decode step's norms, gates and roundings each thread does whole,
on its own copies, with none after them), instead of ~4 ctypes calls and OpenMP regions per
layer.

`FusedLayers.of(engine)` describes the engine's layers to the kernels once (weights' and
norms' addresses, shapes), or is None where the call does not apply: no kernels, a matrix
not in an integer format (float checkpoints keep BLAS), convolution or expert layers, an
activation other than SiLU or Gemma's tanh GELU. Its result is the
per-call kernels' bit for bit (the same arithmetic in the same order), so the Python path
stays the reference: `engine.fused = None` takes it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from npu.engine import rope as rope_mod
from npu.engine.kv_cache import BLOCK
from npu.engine.linear import CpuLinear, PackedMatrix, SplitLinear
from npu.engine.ops import GATED, KV_KINDS, KernelOps
from npu.engine.quant import INTEGER

_I32, _I64, _P, _F = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
MAX_PARTS = 3
MAX_PIECES = 64  # prompt pieces in one call (more: the Python path)
ROPE_ROWS = 1024  # positions a rope's cos/sin table holds at first


class FkPart(ctypes.Structure):
    _fields_ = [("type", _I32), ("packed", _I32), ("w", _P), ("n", _I64)]


class FkLin(ctypes.Structure):
    _fields_ = [("nparts", _I64), ("n", _I64), ("k", _I64), ("part", FkPart * MAX_PARTS)]


class FkLayer(ctypes.Structure):
    _fields_ = [(n, _P) for n in ("norm_in", "norm_ff", "q_norm", "k_norm", "bqkv", "bo",
                                  "sinks", "norm_post_attn", "norm_post_ff")] + [
        ("window", _I64), ("rope", _I64), ("qkv", FkLin), ("o", FkLin), ("gu", FkLin),
        ("down", FkLin)]


class FkModel(ctypes.Structure):
    _fields_ = [("hidden", _I64), ("nq", _I64), ("nkv", _I64), ("hd", _I64), ("inter", _I64),
                ("bs", _I64), ("eps", _F), ("scale", _F), ("half", _I32), ("act", _I32),
                ("final_norm", _P)]


def _lin(linear, cols: int) -> FkLin | None:
    parts = linear.parts if isinstance(linear, SplitLinear) else [linear]
    if not 1 <= len(parts) <= MAX_PARTS:
        return None
    out = FkLin(nparts=len(parts), n=sum(p.shape[0] for p in parts), k=cols)
    for i, p in enumerate(parts):
        if not isinstance(p, CpuLinear) or p.matrix.qtype not in INTEGER or p.shape[1] != cols:
            return None
        out.part[i] = FkPart(type=int(p.matrix.qtype),
                             packed=int(isinstance(p.matrix, PackedMatrix)),
                             w=p.matrix.data.ctypes.data, n=p.shape[0])
    return out


def _addr(a: np.ndarray | None) -> int | None:
    if a is None:
        return None
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError("fused layers take contiguous float32 vectors")
    return a.ctypes.data


class FusedLayers:
    """The engine's layers as fk_forward takes them."""

    def __init__(self, engine, lib, layers: ctypes.Array, model: FkModel,
                 ropes: list[tuple[np.ndarray, float]]) -> None:
        self._engine, self._lib = engine, lib
        self._layers, self._model = layers, model
        self._ropes = ropes
        self._rope_tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._kv_arrays: list[np.ndarray] = []
        self._kv = np.zeros(2 * len(layers), dtype=np.uint64)
        self.seconds = np.zeros(3)  # time in the products, attention, the rest (thread 0)
        self._cos = np.zeros(len(ropes), dtype=np.uint64)
        self._sin = np.zeros(len(ropes), dtype=np.uint64)
        # what a step passes unchanged, looked up once (ctypes' lookups cost a step ~10 us)
        self._kv_address, self._cos_at, self._sin_at, self._seconds_at = (
            a.ctypes.data for a in (self._kv, self._cos, self._sin, self.seconds))
        self._model_at, self._layers_at = ctypes.addressof(model), ctypes.addressof(layers)
        self._held: list[np.ndarray] = []  # arrays whose addresses the layers hold

    @classmethod
    def of(cls, engine) -> FusedLayers | None:
        c, ops = engine.config, engine.ops
        lib = getattr(ops, "_lib", None)
        if not isinstance(ops, KernelOps) or lib is None or not hasattr(lib, "fk_forward"):
            return None
        if engine.activation not in GATED or c.num_heads % c.num_kv_heads:
            return None
        held, ropes, rope_index = [], [], {}
        layers = (FkLayer * len(engine.layers))()
        qkv_cols = c.hidden_size
        for i, L in enumerate(engine.layers):
            if L.kind == "conv" or L.router_w is not None or L.wqkv is None:
                return None
            lins = [_lin(L.wqkv, qkv_cols), _lin(L.wo, c.num_heads * c.head_dim),
                    _lin(L.w_gate_up, c.hidden_size), _lin(L.w_down, c.intermediate_size)]
            if any(x is None for x in lins):
                return None
            if (lins[0].n != (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
                    or lins[2].n != 2 * c.intermediate_size or lins[3].n != c.hidden_size
                    or lins[1].n != c.hidden_size):
                return None
            key = (id(L.inv_freq), L.rope_scale)
            if key not in rope_index:
                rope_index[key] = len(ropes)
                ropes.append((L.inv_freq, L.rope_scale))
            vecs = [L.norm_in, L.norm_pre_ff, L.q_norm, L.k_norm, L.bqkv, L.bo, L.sinks,
                    L.norm_post_attn, L.norm_post_ff]
            vecs = [None if v is None else np.ascontiguousarray(v, dtype=np.float32)
                    for v in vecs]
            held += [v for v in vecs if v is not None]
            layers[i] = FkLayer(*(_addr(v) for v in vecs), L.window, rope_index[key], *lins)
        final = np.ascontiguousarray(engine.final_norm, dtype=np.float32)
        held.append(final)
        model = FkModel(hidden=c.hidden_size, nq=c.num_heads, nkv=c.num_kv_heads,
                        hd=c.head_dim, inter=c.intermediate_size, bs=BLOCK, eps=c.rms_eps,
                        scale=float(engine.scale), half=KV_KINDS[engine.kv.dtype],
                        act=GATED[engine.activation],
                        final_norm=final.ctypes.data)
        fused = cls(engine, lib, layers, model, ropes)
        fused._held = held
        return fused

    def _kv_pointers(self) -> int:
        """The caches' addresses (looked up again only when the pool has replaced its
        arrays: it replaces every layer's at once, so the first layer's keys tell)."""
        kv = self._engine.kv
        if not self._kv_arrays or kv.k[0] is not self._kv_arrays[0]:
            arrays = [a for li in range(len(self._layers)) for a in (kv.k[li], kv.v[li])]
            self._kv_arrays = arrays
            self._kv[:] = [a.ctypes.data for a in arrays]
        return self._kv_address

    def _rope_cover(self, top: int) -> None:
        """Every rope table (`rope.cos_sin`'s values, the same bits) holding positions
        0 .. top - 1 at least: a table of the positions up to the highest seen, grown by
        doubling, which the kernels index by position (a step computes none of them)."""
        held = len(self._rope_tables[0][0]) if self._rope_tables else 0
        if top <= held:
            return
        n = max(ROPE_ROWS, top, 2 * held)
        for r, (inv, scale) in enumerate(self._ropes):
            c, s = rope_mod.cos_sin(inv, np.arange(n), scale)
            self._rope_tables[r] = (np.ascontiguousarray(c, dtype=np.float32),
                                    np.ascontiguousarray(s, dtype=np.float32))
        self._cos[:] = [self._rope_tables[r][0].ctypes.data for r in range(len(self._ropes))]
        self._sin[:] = [self._rope_tables[r][1].ctypes.data for r in range(len(self._ropes))]

    def run(self, x: np.ndarray, pieces: Sequence[tuple[int, int, int]],
            tables: Sequence[np.ndarray] | np.ndarray, top: int,
            decoding: bool) -> np.ndarray | None:
        """The layers over x [T, hidden] (a new array: the last layer's output normed by
        the model's final norm, as `ops.rms_norm` norms it), the
        pieces (first row, rows, position of the first row) with their block tables (rows
        of a 2-D array for a decode step, else one per piece), `top` one past the highest
        position; None where fk_forward does not take this call (the caller runs the Python
        path, nothing having changed)."""
        if not decoding and len(pieces) > MAX_PIECES:
            return None
        x = np.array(x, dtype=np.float32, order="C", copy=True)
        seg = np.asarray(pieces, dtype=np.int64).reshape(-1, 3)
        if decoding:
            tab = np.ascontiguousarray(tables, dtype=np.int64)
        else:
            width = max(len(t) for t in tables)
            tab = np.zeros((len(tables), width), dtype=np.int64)
            for row, t in enumerate(tables):
                tab[row, : len(t)] = t
        self._rope_cover(top)
        rc = self._lib.fk_forward(self._model_at, self._layers_at, len(self._layers),
                                  self._kv_pointers(), x.ctypes.data, len(x), len(seg),
                                  seg.ctypes.data, tab.ctypes.data, tab.shape[1],
                                  self._cos_at, self._sin_at, self._engine.linears.threads.n,
                                  self._seconds_at)
        if rc == -2:
            raise MemoryError("fk_forward could not allocate its buffers")
        return None if rc else x
