"""The kernels' default thread count: one per physical core the process may use, at most its
container's CPU quota (on fake sysfs and cgroup trees, so any machine can run them)."""

from __future__ import annotations

from pathlib import Path

from npu.engine import cores


def _topology(root: Path, siblings: dict[int, str]) -> str:
    """A fake /sys/devices/system/cpu: cpu N lists `siblings[N]` as its hardware threads."""
    for cpu, text in siblings.items():
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text + "\n")
    return str(root)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_two_hardware_threads_of_a_core_count_once(tmp_path):
    # 4 cores with SMT, as Linux numbers them on Ryzen: cpu N and N+4 share a core
    sysfs = _topology(tmp_path, {n: f"{n % 4},{n % 4 + 4}" for n in range(8)})
    assert cores.physical_cores(set(range(8)), sysfs) == 4
    # an affinity mask of one thread of each of two cores, or of both threads of one
    assert cores.physical_cores({0, 1}, sysfs) == 2
    assert cores.physical_cores({2, 6}, sysfs) == 1


def test_cores_without_smt_and_unreadable_topology_count_each(tmp_path):
    sysfs = _topology(tmp_path, {0: "0", 1: "1"})
    assert cores.physical_cores({0, 1}, sysfs) == 2
    # cpu 5 has no topology here: counted as its own core, never dropped
    assert cores.physical_cores({0, 1, 5}, sysfs) == 3


def test_cgroup_v2_quota_of_the_process_or_an_ancestor(tmp_path):
    proc = tmp_path / "cgroup"
    _write(proc, "0::/user.slice/app.scope")
    root = tmp_path / "fs"
    _write(root / "user.slice" / "app.scope" / "cpu.max", "max 100000")
    assert cores.cgroup_cpu_limit(str(root), str(proc)) is None
    _write(root / "user.slice" / "cpu.max", "250000 100000")  # the parent's quota binds
    assert cores.cgroup_cpu_limit(str(root), str(proc)) == 2.5
    _write(root / "user.slice" / "app.scope" / "cpu.max", "100000 100000")
    assert cores.cgroup_cpu_limit(str(root), str(proc)) == 1.0


def test_cgroup_v1_quota_seen_from_inside_a_container(tmp_path):
    # without a cgroup namespace the path is the host's; the container's mount shows its own
    # cgroup at the mount's root, which the walk up reaches
    proc = tmp_path / "cgroup"
    _write(proc, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/")
    root = tmp_path / "fs"
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000")
    assert cores.cgroup_cpu_limit(str(root), str(proc)) is None
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "300000")
    assert cores.cgroup_cpu_limit(str(root), str(proc)) == 3.0


def test_no_cgroup_file_means_no_quota(tmp_path):
    assert cores.cgroup_cpu_limit(str(tmp_path), str(tmp_path / "missing")) is None
    _write(tmp_path / "cgroup", "0::/\n")
    assert cores.cgroup_cpu_limit(str(tmp_path / "fs"), str(tmp_path / "cgroup")) is None


def test_default_threads_is_the_physical_cores_within_the_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(cores, "allowed_cpus", lambda: set(range(16)))
    sysfs = _topology(tmp_path / "cpu", {n: f"{n % 8},{n % 8 + 8}" for n in range(16)})
    proc = tmp_path / "cgroup"
    _write(proc, "0::/")
    root = tmp_path / "fs"
    assert cores.default_threads(sysfs, str(root), str(proc)) == 8  # not 16 hardware threads
    _write(root / "cpu.max", "350000 100000")  # `docker run --cpus 3.5`
    assert cores.default_threads(sysfs, str(root), str(proc)) == 4
    _write(root / "cpu.max", "10000 100000")  # a tenth of a CPU still runs one thread
    assert cores.default_threads(sysfs, str(root), str(proc)) == 1

