"""MappedFile: a model file mapped read-only into memory; its tensors' bytes as numpy views
of the mapping (no copy: pages come from the page cache as they are first read).

The views stay valid as long as anything holds them (the mapping closes with the last).
Pages handed back (`release`, `npu.engine.quant.release_pages`) leave the process's
resident memory and fault back in from the file if read again. A file truncated while
mapped would fault on read (SIGBUS), as with llama.cpp's own mapping: model files are not
edited under a running server.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from npu.engine.quant import release_pages
from npu.errors import ModelError


class MappedFile:
    """The file `path`, mapped (read only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # ValueError: an empty file
            raise ModelError(f"{path}: cannot map the file ({exc})") from None
        self.bytes = np.frombuffer(self._map, dtype=np.uint8)

    @property
    def size(self) -> int:
        return self.bytes.size

    def view(self, offset: int, n: int, what: str) -> np.ndarray:
        """Bytes offset .. offset + n, a view (`what` names them in the error).

        Raises:
            ModelError: the file ends before them (a truncated file).
        """
        if offset + n > self.size:
            raise ModelError(f"{self.path}: {what} is cut short (truncated file)")
        return self.bytes[offset : offset + n]

    def prefetch(self, offset: int, n: int) -> None:
        """Ask the kernel to read bytes offset .. offset + n ahead (they are read while the
        caller works on what it has)."""
        if n <= 0 or not hasattr(mmap, "MADV_WILLNEED"):
            return
        start = offset // mmap.PAGESIZE * mmap.PAGESIZE
        stop = min(self.size, offset + n)
        if stop > start:
            self._map.madvise(mmap.MADV_WILLNEED, start, stop - start)

    def release(self) -> None:
        """Hand every resident page back (views stay readable)."""
        release_pages(self.bytes)
