"""A worker's thread count: what the config names, else one thread for weights that stay in
the caches, else the machine's default (its physical cores, npu.engine.cores)."""

from __future__ import annotations

from actors import blas


def test_threads_for_a_worker(monkeypatch):
    monkeypatch.setattr(blas, "default_threads", lambda: 6)
    assert blas.blas_threads_for(blas.CACHE_RESIDENT_BYTES) == 1
    assert blas.blas_threads_for(blas.CACHE_RESIDENT_BYTES + 1) == 6
    assert blas.blas_threads_for(1 << 30, configured=3) == 3
    assert blas.blas_threads_for(1 << 10, configured=2) == 2
    assert blas.start_threads() == 6 and blas.start_threads(2) == 2
