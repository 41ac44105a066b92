"""The KV cache: fixed-size blocks of keys and values, shared between sequences and kept after
they end, keyed by the tokens they cover (automatic prefix caching, vLLM's design).

Per attention layer one array [blocks, kv_heads, BLOCK, row] for K and one for V (a row:
head_dim floats, or a Q8_0 cache's bytes, `kv_row`). A
sequence holds a block table (the blocks of its positions, in order). A full block is named by
a digest of every token up to its end (its own and all before it: a hash chain over blocks),
so a new sequence whose prompt starts with the same tokens takes those blocks as they are
(reference-counted, never copied) and computes only the rest. Blocks no sequence holds stay
cached until their memory is needed: the least recently used go first, a sequence's later
blocks before its earlier ones.

The pool grows (by doubling) up to its budget of bytes; past it, allocation evicts, and when
nothing is evictable it raises `KVCacheFull`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from npu.errors import KVCacheFull

BLOCK = 16  # tokens per block
KV_TYPES = ("f16", "q8_0")  # the KV cache's formats a LoadOptions names (the CPU kernels')


def kv_row(dtype, head_dim: int) -> int:
    """A cached row's elements: head_dim values, or a Q8_0 cache's (uint8) bytes: for each 32
    values an f16 scale and 32 signed codes, 34 bytes."""
    return head_dim // 32 * 34 if np.dtype(dtype) == np.uint8 else head_dim


def kv_head_dim(K: np.ndarray) -> int:
    """The head size of a layer's cache array (`kv_row`'s inverse)."""
    return K.shape[3] // 34 * 32 if K.dtype == np.uint8 else K.shape[3]


def block_digests(tokens: Sequence[int], parent: bytes = b"") -> list[bytes]:
    """The names of the full blocks of `tokens`: each block's digest covers its tokens and,
    through the digest before it (`parent` for the first: the digest of the block before
    `tokens`, b"" at a sequence's start), every token before them."""
    raw = np.asarray(tokens[: len(tokens) // BLOCK * BLOCK], dtype=np.int64).tobytes()
    step = 8 * BLOCK
    out = []
    for at in range(0, len(raw), step):
        parent = hashlib.blake2b(parent + raw[at : at + step], digest_size=16).digest()
        out.append(parent)
    return out


class SeqBlocks:
    """One sequence's cache: its block table, the tokens written so far, and the digests of
    its full blocks."""

    __slots__ = ("table", "tokens", "digests")

    def __init__(self) -> None:
        self.table: list[int] = []
        self.tokens: list[int] = []
        self.digests: list[bytes] = []

    @property
    def pos(self) -> int:
        return len(self.tokens)


class BlockPool:
    """The blocks of every attention layer, their reference counts and the prefix index.

    Args:
        layers: the indices of the attention layers (the others hold no KV).
        n_layers: all layers.
        budget_bytes: the most the pool may hold (K and V of every layer).
        caching: keep and share full blocks by their tokens (off: blocks are freed when
            their sequence ends; for a model whose state is not all in its KV).
    """

    def __init__(self, layers: list[int], n_layers: int, kv_heads: int, head_dim: int,
                 budget_bytes: int, dtype=np.float32, caching: bool = True) -> None:
        self.layers, self.n_layers = layers, n_layers
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, np.dtype(dtype)
        self.row = kv_row(self.dtype, head_dim)
        self.block_bytes = 2 * len(layers) * kv_heads * BLOCK * self.row * self.dtype.itemsize
        self.max_blocks = max(1, budget_bytes // max(1, self.block_bytes)) if layers else 1 << 40
        self.caching = caching and bool(layers)
        self.k: list[np.ndarray | None] = [None] * n_layers
        self.v: list[np.ndarray | None] = [None] * n_layers
        self.capacity = 0  # blocks allocated
        self.refs: list[int] = []
        self.free: list[int] = []  # unnamed, held by nobody
        self.lru: OrderedDict[int, None] = OrderedDict()  # named, held by nobody: evictable
        self.digest_of: dict[int, bytes] = {}
        self.block_of: dict[bytes, int] = {}

    # -- blocks ------------------------------------------------------------------------------
    def available(self) -> int:
        """Blocks a sequence could still get: free, evictable, or not allocated yet."""
        return len(self.free) + len(self.lru) + self.max_blocks - self.capacity

    def held(self) -> int:
        """Blocks some sequence holds."""
        return self.capacity - len(self.free) - len(self.lru)

    def _grow(self) -> None:
        new_cap = min(self.max_blocks, max(16, 2 * self.capacity))
        for li in self.layers:
            for store in (self.k, self.v):
                # zeros, not empty: attention may read (and weigh by 0) positions of a block
                # no token was written to, and 0 * NaN would be NaN
                new = np.zeros((new_cap, self.kv_heads, BLOCK, self.row), self.dtype)
                if store[li] is not None:
                    new[: self.capacity] = store[li]
                store[li] = new
        self.free.extend(range(new_cap - 1, self.capacity - 1, -1))  # lowest handed out first
        self.refs.extend([0] * (new_cap - self.capacity))
        self.capacity = new_cap

    def allocate(self) -> int:
        """A block for one sequence (reference count 1), unnamed."""
        if not self.free:
            if self.capacity < self.max_blocks:
                self._grow()
            elif self.lru:
                self._evict()
            else:
                raise KVCacheFull(
                    f"the KV cache is full: all {self.max_blocks} blocks "
                    f"({self.max_blocks * self.block_bytes >> 20} MiB) are held by running "
                    "sequences")
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def _evict(self) -> None:
        """The least recently used cached block becomes free (and unnamed)."""
        block, _ = self.lru.popitem(last=False)
        del self.block_of[self.digest_of.pop(block)]
        self.free.append(block)

    def _take(self, block: int) -> None:
        if self.refs[block] == 0:
            self.lru.pop(block, None)
        self.refs[block] += 1

    def _drop(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if block in self.digest_of:
                self.lru[block] = None
            else:
                self.free.append(block)

    # -- sequences ---------------------------------------------------------------------------
    def reserve(self, seq: SeqBlocks, positions: int) -> None:
        """Blocks for `seq`'s first `positions` positions."""
        while len(seq.table) * BLOCK < positions:
            seq.table.append(self.allocate())

    def blocks_needed(self, seq: SeqBlocks, positions: int) -> int:
        return max(0, -(-positions // BLOCK) - len(seq.table))

    def written(self, seq: SeqBlocks, tokens: Sequence[int]) -> None:
        """`tokens` joined the cache at `seq`'s next positions: name the blocks they fill."""
        seq.tokens.extend(map(int, tokens))
        if not self.caching or len(seq.tokens) < (len(seq.digests) + 1) * BLOCK:
            return
        first = len(seq.digests)
        seq.digests += block_digests(seq.tokens[first * BLOCK :],
                                     seq.digests[-1] if seq.digests else b"")
        for digest, block in zip(seq.digests[first:], seq.table[first:]):
            if digest not in self.block_of and block not in self.digest_of:
                self.block_of[digest] = block
                self.digest_of[block] = digest

    def _cached_chain(self, ids: Sequence[int]) -> list[tuple[bytes, int]]:
        """(digest, block) of the cached blocks that start `ids`, leaving at least one
        token of it uncovered."""
        chain: list[tuple[bytes, int]] = []
        if not self.caching:
            return chain
        for digest in block_digests(ids[: len(ids) - 1]):
            block = self.block_of.get(digest)
            if block is None:
                break
            chain.append((digest, block))
        return chain

    def cached(self, ids: Sequence[int]) -> int:
        """How many tokens of `ids` `adopt` would take from the cache now."""
        return len(self._cached_chain(ids)) * BLOCK

    def adopt(self, seq: SeqBlocks, ids: Sequence[int]) -> int:
        """Start an empty `seq` on the longest cached prefix of `ids` that leaves at least
        one token to compute; returns the tokens it covers (whole blocks)."""
        if seq.tokens:
            return 0
        for digest, block in self._cached_chain(ids):
            self._take(block)
            seq.table.append(block)
            seq.digests.append(digest)
        seq.tokens = [int(t) for t in ids[: len(seq.table) * BLOCK]]
        return len(seq.tokens)

    def fork(self, src: SeqBlocks) -> SeqBlocks:
        """A copy of `src` that shares its full blocks and copies its partial last one."""
        dst = SeqBlocks()
        full = len(src.tokens) // BLOCK
        for block in src.table[:full]:
            self._take(block)
        dst.table = src.table[:full]
        if len(src.tokens) > full * BLOCK:
            block = self.allocate()
            for li in self.layers:
                for store in (self.k, self.v):
                    store[li][block] = store[li][src.table[full]]
            dst.table.append(block)
        dst.tokens = list(src.tokens)
        dst.digests = list(src.digests)
        return dst

    def truncate(self, seq: SeqBlocks, length: int) -> None:
        """Keep `seq`'s first `length` tokens (taking back tokens written past them): the
        blocks past them go back, and a block the kept tokens end inside stops being named
        by the tokens it held, since the sequence will write others over its rest (only a
        block the sequence holds alone can end partly kept: shared blocks are full and
        before the tokens written since)."""
        if length >= len(seq.tokens):
            return
        keep = -(-length // BLOCK)
        for block in reversed(seq.table[keep:]):
            self._drop(block)
        del seq.table[keep:]
        if length % BLOCK:
            block = seq.table[-1]
            digest = self.digest_of.pop(block, None)
            if digest is not None:
                del self.block_of[digest]
        del seq.tokens[length:]
        del seq.digests[length // BLOCK :]

    def release(self, seq: SeqBlocks) -> None:
        """`seq` ended: its blocks go back, named ones kept for reuse (its last block is
        the first to be evicted, its first the last)."""
        for block in reversed(seq.table):
            self._drop(block)
        seq.table = []
        self._return_memory()

    def _return_memory(self) -> None:
        """Nothing held, nothing cached: the arrays go back."""
        if self.capacity and not self.lru and len(self.free) == self.capacity:
            self.k = [None] * self.n_layers
            self.v = [None] * self.n_layers
            self.capacity, self.refs, self.free = 0, [], []

    def tables(self, seqs: Sequence[SeqBlocks]) -> np.ndarray:
        """The sequences' block tables as rows [len(seqs), longest] (short rows padded with
        block 0: positions past a row's length are never weighed)."""
        width = max(len(s.table) for s in seqs)
        out = np.zeros((len(seqs), width), dtype=np.int64)
        for row, s in enumerate(seqs):
            out[row, : len(s.table)] = s.table
        return out

    def usage(self) -> dict[str, int]:
        return {"kv_blocks": self.held(), "cached_blocks": len(self.lru),
                "kv_bytes": self.capacity * self.block_bytes if self.layers else 0}

    def clear(self) -> None:
        """Forget every cached block (held ones stay)."""
        while self.lru:
            self._evict()
        self._return_memory()
