"""The compiled CPU kernels (cpu_kernels.c): built once per machine with the system's C
compiler into the cache directory, loaded with ctypes.

`kernels()` returns the loaded library or raises `KernelUnavailable` (no compiler, a failed
build); callers fall back to the numpy reference then. The build is keyed by the source and
the flags, so an edited source or another machine builds anew. Processes starting together
on a fresh cache (a server's workers) build it once: the others wait on a lock in the
folder, then load that build.

`FLM_KERNEL_FLAGS` adds compiler flags to the build `kernels()` loads: with
`FLM_KERNEL_FLAGS=-march=x86-64-v3` a machine with AVX-512 VNNI runs the AVX2 code paths (a
later -march wins), as an AVX2-only CPU does; `make test` then checks those paths.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

from npu.errors import ModelError
from npu.paths import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
# every C source built into the one library (cpu_convert.c: the k-quant conversion at load;
# cpu_spm.c: SentencePiece vocabularies, npu/load/spm.py)
SOURCES = [SOURCE, *(Path(__file__).with_name(n) for n in ("cpu_convert.c", "cpu_spm.c"))]
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
LIBS = ["-lm"]
COMPILE_SECONDS = 300  # a compiler still running after this long is given up on

# arrays pass as raw addresses (callers hand over C-contiguous arrays of the right dtype:
# numpy's checked pointer types cost more per call than a small product)
_F32P = _I64P = _U8 = ctypes.c_void_p
_I64 = ctypes.c_int64


class KernelUnavailable(ModelError):
    """The CPU kernels could not be built or loaded on this machine."""


def _compiler() -> list[str]:
    """The C compiler's command: `CC`'s words (as a shell splits it: "ccache gcc" too),
    else cc or gcc on the PATH."""
    try:
        words = shlex.split(os.environ.get("CC", ""))
    except ValueError as exc:  # an unclosed quote
        raise KernelUnavailable(f"CC cannot be read as a command: {exc}") from None
    cc = words or [shutil.which("cc") or shutil.which("gcc")]
    if not cc[0]:
        raise KernelUnavailable("no C compiler (cc or gcc) to build the CPU kernels")
    return cc


def build(out_dir: Path | None = None, extra: tuple[str, ...] = ()) -> Path:
    """The shared library's path, compiled first if this source and these flags (`extra`
    added) have no build in `out_dir` (default: the cache directory's kernels/)."""
    cc = _compiler()
    flags = [*FLAGS, *extra]
    sources = b"".join(s.read_bytes() for s in SOURCES)
    key = hashlib.sha256(sources + " ".join([*cc, *flags, *LIBS]).encode()).hexdigest()[:16]
    out_dir = out_dir or cache_dir() / "kernels"
    target = out_dir / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with _locked(out_dir):
        if not target.exists():  # a process that held the lock before may have built it
            _install(target, lambda tmp: _compile(cc, flags, tmp))
            log.info("built the CPU kernels: %s", target)
    return target


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One compiler at a time in `folder`, the others waiting; unlocked where the lock
    cannot be taken (another user's lock file, a file system without locks): installs are
    atomic, so that only costs a second compile."""
    try:
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        log.info("building the CPU kernels without a lock: %s", exc)
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            log.info("building the CPU kernels without a lock: %s", exc)
        yield
    finally:
        os.close(fd)


def _install(target: Path, write: Callable[[str], None]) -> None:
    """`write(tmp)` makes a file beside `target`, which then replaces `target` whole (a
    reader never sees half a file)."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=target.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile(cc: list[str], flags: list[str], out: str) -> None:
    try:
        done = subprocess.run([*cc, *flags, "-o", out, *map(str, SOURCES), *LIBS],
                              capture_output=True, text=True, timeout=COMPILE_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:  # no such file, not runnable, hung
        raise KernelUnavailable(f"cannot run the C compiler {shlex.join(cc)!r}: {exc}") from None
    if done.returncode:
        raise KernelUnavailable(f"building {', '.join(s.name for s in SOURCES)} failed: "
                                f"{done.stderr.strip()[:2000]}")


def seed_cache(cache: Path) -> Path | None:
    """This process's build (`kernels()`'s: FLM_KERNEL_FLAGS' flags added), built first
    where there is none, linked into the kernels folder of another cache directory, so
    processes using that one (a test's or a bench's fresh cache) load it rather than build
    their own. Returns the path there; None where the kernels cannot be built (those
    processes fall back to numpy as this one would)."""
    try:
        source = build(extra=env_flags())
    except KernelUnavailable:
        return None
    folder = cache / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    try:
        os.link(source, target)
    except FileExistsError:  # seeded already
        pass
    except OSError:  # another file system: a whole copy
        _install(target, lambda tmp: shutil.copyfile(source, tmp))
    return target


def env_flags() -> tuple[str, ...]:
    """The flags FLM_KERNEL_FLAGS adds to the build (none when unset)."""
    return tuple(shlex.split(os.environ.get("FLM_KERNEL_FLAGS", "")))


def kernels() -> ctypes.CDLL:
    """The loaded kernels (built on first use, with FLM_KERNEL_FLAGS' flags added).

    Raises:
        KernelUnavailable: they cannot be built or loaded here (once tried, the same
            answer for the rest of the process: a compiler that failed, or hung for
            COMPILE_SECONDS, is not run again by every caller).
    """
    got = _built()
    if isinstance(got, KernelUnavailable):
        raise KernelUnavailable(str(got))
    return got


@cache
def _built() -> ctypes.CDLL | KernelUnavailable:
    try:
        return load(build(extra=env_flags()))
    except KernelUnavailable as exc:
        return exc


def kernels_or_none() -> ctypes.CDLL | None:
    """`kernels()`, or None where they cannot be built (the caller's fallback then)."""
    try:
        return kernels()
    except KernelUnavailable:
        return None


def load(path: Path) -> ctypes.CDLL:
    """A build of the kernels, loaded and declared."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelUnavailable(f"cannot load the CPU kernels: {exc}") from None
    lib.fk_init.restype = None
    lib.fk_init()
    lib.fk_row_bytes.restype = _I64
    lib.fk_row_bytes.argtypes = [ctypes.c_int, _I64]
    lib.fk_matmul.restype = ctypes.c_int
    lib.fk_matmul.argtypes = [ctypes.c_int, _U8, _I64, _I64, _F32P, _I64, _F32P, ctypes.c_int]
    lib.fk_packed_rows.restype = ctypes.c_int
    lib.fk_packed_rows.argtypes = []
    lib.fk_packed_vnni.restype = ctypes.c_int
    lib.fk_packed_vnni.argtypes = []
    lib.fk_packed_bytes.restype = _I64
    lib.fk_packed_bytes.argtypes = [ctypes.c_int, _I64, _I64]
    lib.fk_pack_many.restype = ctypes.c_int
    lib.fk_pack_many.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_int]
    lib.fk_unpack.restype = ctypes.c_int
    lib.fk_unpack.argtypes = [ctypes.c_int, _U8, _I64, _I64, _U8]
    lib.fk_packed_lookup.restype = ctypes.c_int
    lib.fk_packed_lookup.argtypes = [ctypes.c_int, _U8, _I64, _I64, _I64P, _I64, _F32P]
    lib.fk_matmul_packed.restype = ctypes.c_int
    lib.fk_matmul_packed.argtypes = [ctypes.c_int, _U8, _I64, _I64, _F32P, _I64, _F32P,
                                     ctypes.c_int]
    lib.fk_rows.restype = ctypes.c_int
    lib.fk_rows.argtypes = [ctypes.c_int, _U8, _I64, _I64, _I64P, _I64, _F32P, ctypes.c_int]
    lib.fk_dequant.restype = ctypes.c_int
    lib.fk_dequant.argtypes = [ctypes.c_int, _U8, _I64, _I64, _I64, _F32P, ctypes.c_int]
    lib.fk_rms_norm.restype = None
    lib.fk_rms_norm.argtypes = [_F32P, _F32P, _I64, _I64, ctypes.c_float, _F32P]
    lib.fk_qk_rope.restype = None
    lib.fk_qk_rope.argtypes = [_F32P, _I64, _I64, _I64, _I64, _I64, _F32P, _F32P,
                               ctypes.c_float, _F32P, _F32P]
    lib.fk_gated.restype = None
    lib.fk_gated.argtypes = [_F32P, _I64, _I64, _F32P, ctypes.c_int]
    lib.fk_gelu.restype = None
    lib.fk_gelu.argtypes = [_F32P, _I64, _I64]
    lib.fk_kv_write.restype = None
    lib.fk_kv_write.argtypes = [_F32P, _I64, _I64, _I64, _I64, _I64, _F32P, _F32P, _I64,
                                _I64P, _I64, _I64P, ctypes.c_int]
    lib.fk_attend.restype = ctypes.c_int
    lib.fk_attend.argtypes = [_F32P, _I64, _I64, _I64, _I64, _I64, _F32P, _F32P, _I64, _I64P,
                              _I64, _I64P, _I64, _F32P, ctypes.c_float, _F32P, ctypes.c_int,
                              ctypes.c_int]
    lib.fk_attend_prompt.restype = ctypes.c_int
    lib.fk_attend_prompt.argtypes = [_F32P, _I64, _I64, _I64, _I64, _I64, _F32P, _F32P, _I64,
                                     _I64P, _I64, _I64, _F32P, ctypes.c_float, _F32P,
                                     ctypes.c_int, ctypes.c_int]
    lib.fk_attend_all.restype = ctypes.c_int
    lib.fk_attend_all.argtypes = [_F32P, _I64, _I64, _I64, _I64, _I64, _F32P, _F32P, _I64,
                                  _I64P, _I64, _F32P, ctypes.c_float, _F32P, ctypes.c_int,
                                  ctypes.c_int]
    lib.fk_forward.restype = ctypes.c_int  # structures and pointer arrays: npu.engine.fused
    lib.fk_forward.argtypes = [_U8, _U8, _I64, _U8, _F32P, _I64, _I64, _I64P, _I64P, _I64, _U8,
                               _U8, ctypes.c_int, _U8]
    return lib


if __name__ == "__main__":  # `make setup` builds them once, so a build error shows there
    print(build(extra=env_flags()))


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def kernel_path() -> str:
    """The matrix products' code path on this machine, in words ("packed VNNI x16",
    "packed VNNI x8", "packed AVX2 x8", "AVX2", "scalar"; "numpy reference" when the kernels
    cannot be built): what the start block shows, since the arithmetic, and so a greedy reply's
    near-ties, differ by path."""
    try:
        rows = kernels().fk_packed_rows()
    except KernelUnavailable:
        return "numpy reference"
    if rows:
        return f"packed {'VNNI' if kernels().fk_packed_vnni() else 'AVX2'} x{rows}"
    return "AVX2" if "avx2" in _cpu_flags() else "scalar"
