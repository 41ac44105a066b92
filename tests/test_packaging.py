"""`pip install .` (not editable) installs every module and data file the server needs: the
wheel built from this tree holds each package under the four roots, their Python files and
their package data (the chat page, the kernels' C source, the tokenizer data)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOTS = ("chat", "npu", "actors", "deployments")
DATA = ("deployments/page/static", "npu/load/data")


def _tree_files() -> set[str]:
    files: set[str] = set()
    for root in ROOTS:
        for path in (ROOT / root).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix in (".py", ".c") or rel.startswith(DATA):
                files.add(rel)
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("setuptools")
    # built from a copy: setuptools keeps a build/ folder in the source tree, whose files
    # would hide a package the configuration leaves out
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for root in ROOTS:
        shutil.copytree(ROOT / root, src / root, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), str(src)],
        check=True, capture_output=True, timeout=300,
    )
    (built,) = out.glob("flm_serve-*.whl")
    return built


def test_the_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_tree_files() - names)
    assert not missing, f"not in the wheel: {missing}"


def test_the_wheel_names_the_command_and_its_module(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    (entry,) = [n for n in archive.namelist() if n.endswith("entry_points.txt")]
    text = archive.read(entry).decode()
    assert "flm-serve = deployments.launch.cli:main" in text
    assert "deployments/launch/cli.py" in archive.namelist()
