"""The threads the CPU kernels run on by default: one per physical core this process may use.

llama.cpp and Ollama count the same way. A core's second hardware thread (SMT) shares its
vector units and caches, so a product that keeps them busy gains little from it, while every
barrier of a step then waits for twice the threads, each running at about half speed. A
container's CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`) bounds the count too:
threads past the quota wait out whole scheduler periods at a barrier.

Read at call time, never at import (`chat/` and `npu/` do no I/O at import).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

SYSFS_CPU = "/sys/devices/system/cpu"
CGROUP_ROOT = "/sys/fs/cgroup"


def allowed_cpus() -> set[int]:
    """The logical CPUs this process may run on (its affinity mask)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def physical_cores(cpus: set[int], sysfs: str = SYSFS_CPU) -> int:
    """How many physical cores `cpus` span: CPUs that list the same hardware-thread
    siblings are one core. A CPU whose topology cannot be read counts as its own core."""
    cores = set()
    for cpu in cpus:
        try:
            siblings = Path(sysfs, f"cpu{cpu}", "topology", "thread_siblings_list").read_text()
        except OSError:
            siblings = f"cpu{cpu}"
        cores.add(siblings.strip())
    return len(cores)


def cgroup_cpu_limit(root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup"
                     ) -> float | None:
    """The CPUs this process's cgroup (or an ancestor's) may use per period, or None without
    a quota. cgroup v2's `cpu.max` ("max 100000" or "200000 100000"), else v1's
    `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one unified hierarchy
            limits += _v2_limits(Path(root), path)
        elif "cpu" in controllers.split(","):
            limits += _v1_limits(Path(root), controllers, path)
    return min(limits) if limits else None


def _ancestors(path: str) -> list[str]:
    """`path` and every cgroup above it, innermost first ("/a/b" -> "a/b", "a", "")."""
    parts = [p for p in path.strip().split("/") if p]
    return ["/".join(parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_limits(root: Path, path: str) -> list[float]:
    out = []
    for rel in _ancestors(path):
        try:
            quota, period = Path(root, rel, "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max" and float(period) > 0:
            out.append(float(quota) / float(period))
    return out


def _v1_limits(root: Path, controllers: str, path: str) -> list[float]:
    out = []
    for mount in (controllers, "cpu", "cpu,cpuacct"):
        for rel in _ancestors(path):
            d = Path(root, mount, rel)
            try:
                quota = float(Path(d, "cpu.cfs_quota_us").read_text())
                period = float(Path(d, "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            if quota > 0 and period > 0:
                out.append(quota / period)
        if out:
            break
    return out


def default_threads(sysfs: str = SYSFS_CPU, cgroup_root: str = CGROUP_ROOT,
                    proc_cgroup: str = "/proc/self/cgroup") -> int:
    """The CPU kernels' (and BLAS's) threads when the config names none: the physical cores
    of this process's affinity mask, at most its cgroup's CPU quota (rounded up), at least 1.
    """
    n = physical_cores(allowed_cpus(), sysfs)
    limit = cgroup_cpu_limit(cgroup_root, proc_cgroup)
    if limit is not None:
        n = min(n, math.ceil(limit))
    return max(1, n)
