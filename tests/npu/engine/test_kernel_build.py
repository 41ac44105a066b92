"""Building the CPU kernels: processes that start together on a fresh cache (a server's
workers) compile once, and a fresh cache seeded with this process's build compiles
nothing."""

from __future__ import annotations

import shlex
import stat
import threading
from pathlib import Path

import pytest

from npu.engine import cpu_kernels
from npu.engine.cpu_kernels import build, env_flags, seed_cache


def _counting_compiler(folder: Path) -> tuple[Path, Path]:
    """A stand-in C compiler that notes each run, takes a while, and writes an empty -o file."""
    runs = folder / "runs"
    cc = folder / "cc"
    cc.write_text(f"""#!/bin/sh
echo run >> "{runs}"
sleep 1
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then : > "$2"; fi
  shift
done
""")
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    return cc, runs


def test_builds_started_together_compile_once(tmp_path: Path, monkeypatch) -> None:
    cc, runs = _counting_compiler(tmp_path)
    monkeypatch.setenv("CC", str(cc))
    out = tmp_path / "kernels"
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(build(out))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and len(paths) == 3 and paths[0].exists()
    assert runs.read_text().splitlines() == ["run"]
    assert [p.name for p in out.iterdir() if p.suffix == ".so"] == [paths[0].name]


@pytest.fixture()
def own() -> Path:
    """This process's build (the tests below seed other caches with it)."""
    try:
        return build(extra=env_flags())
    except cpu_kernels.KernelUnavailable as exc:
        pytest.skip(f"the CPU kernels cannot be built here (no C compiler?): {exc}")


def test_a_seeded_cache_loads_this_processs_build(own: Path, tmp_path: Path,
                                                  monkeypatch) -> None:
    seeded = seed_cache(tmp_path)
    assert seeded == tmp_path / "kernels" / own.name
    assert seeded.read_bytes() == own.read_bytes()
    assert seed_cache(tmp_path) == seeded  # again: nothing to do

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled although the cache holds the build")

    monkeypatch.setenv("FLM_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_kernels.subprocess, "run", no_compile)
    assert build(extra=env_flags()) == seeded


def test_a_lock_that_cannot_be_taken_builds_without_it(tmp_path: Path, monkeypatch) -> None:
    cc, runs = _counting_compiler(tmp_path)
    monkeypatch.setenv("CC", str(cc))
    out = tmp_path / "kernels"
    (out / ".lock").mkdir(parents=True)  # not a file: cannot be opened as the lock
    path = build(out)
    assert path.exists() and runs.read_text().splitlines() == ["run"]


def test_seeding_copies_across_file_systems_and_is_none_without_a_compiler(
        own: Path, tmp_path: Path, monkeypatch) -> None:
    def cross_device(*args, **kwargs):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(cpu_kernels.os, "link", cross_device)
    seeded = seed_cache(tmp_path / "a")
    assert seeded is not None and seeded.read_bytes() == own.read_bytes()
    assert not seeded.samefile(own)
    assert [p.name for p in seeded.parent.iterdir() if p.suffix == ".so"] == [own.name]
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no cc, no gcc
    assert seed_cache(tmp_path / "b") is None


def test_a_compiler_that_cannot_run_is_unavailable_kernels(tmp_path: Path, monkeypatch) -> None:
    # the engine falls back to numpy on KernelUnavailable; any other error failed the load
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(cpu_kernels.KernelUnavailable, match="no-such-cc"):
        build(tmp_path / "kernels")
    (tmp_path / "not-executable").write_text("")
    monkeypatch.setenv("CC", str(tmp_path / "not-executable"))
    with pytest.raises(cpu_kernels.KernelUnavailable, match="not-executable"):
        build(tmp_path / "kernels")
    assert not [p for p in (tmp_path / "kernels").iterdir() if p.suffix == ".so"]


def test_cc_is_a_command_of_several_words(tmp_path: Path, monkeypatch) -> None:
    cc, runs = _counting_compiler(tmp_path)
    monkeypatch.setenv("CC", f"sh {shlex.quote(str(cc))}")  # as "ccache gcc" is
    assert build(tmp_path / "kernels").exists()
    assert runs.read_text().splitlines() == ["run"]
    monkeypatch.setenv("CC", "'unclosed")
    with pytest.raises(cpu_kernels.KernelUnavailable, match="CC cannot be read"):
        build(tmp_path / "other")


def test_a_compiler_that_hangs_is_given_up_on(tmp_path: Path, monkeypatch) -> None:
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\nsleep 30\n")
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setattr(cpu_kernels, "COMPILE_SECONDS", 0.5)
    with pytest.raises(cpu_kernels.KernelUnavailable, match="timed out"):
        build(tmp_path / "kernels")


def test_kernels_that_cannot_be_built_are_tried_once_a_process(monkeypatch) -> None:
    """Every user of the kernels (the linear layers, the conversion, the tokenizer's C)
    asks for them: a build that failed, or a compiler that hung for COMPILE_SECONDS, is
    not tried again by each."""
    calls = []

    def failing(*args, **kwargs):
        calls.append(args)
        raise cpu_kernels.KernelUnavailable("no C compiler here")

    cpu_kernels._built.cache_clear()
    monkeypatch.setattr(cpu_kernels, "build", failing)
    try:
        assert [cpu_kernels.kernels_or_none() for _ in range(3)] == [None] * 3
        with pytest.raises(cpu_kernels.KernelUnavailable, match="no C compiler here"):
            cpu_kernels.kernels()
        assert len(calls) == 1
    finally:
        cpu_kernels._built.cache_clear()  # this process's own build, loaded again after
