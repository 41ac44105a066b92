"""BLAS threads for a worker process (OpenBLAS's setting is process-wide)."""

from __future__ import annotations

from npu.engine.cores import default_threads

# Weights up to this size stay in the CPU's caches: one BLAS thread computes them about as
# fast as several, and leaves the other cores to the serving processes.
CACHE_RESIDENT_BYTES = 32 << 20


def blas_threads_for(weight_bytes: int, configured: int | None = None) -> int:
    """BLAS threads for a worker: `configured`, else 1 for a model whose weights fit in
    cache, else one per physical core (npu.engine.cores)."""
    if configured:
        return configured
    return 1 if weight_bytes <= CACHE_RESIDENT_BYTES else default_threads()


def start_threads(configured: int | None = None) -> int:
    """The BLAS threads a worker process starts with, before its weights are known:
    `configured`, else one per physical core."""
    return configured or default_threads()


def set_blas_threads(n: int) -> None:
    """Set the process's BLAS thread count (OpenBLAS's setting is process-wide)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n, user_api="blas")
