"""A run's private folders: marked with the launcher's process id; those of a launcher that
is gone (killed before its cleanup, found probing live: Ray's core worker ends the launcher
when its raylet dies, and a folder holding the command line's config, API key included,
stayed in /tmp) are removed when the next run starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deployments.launch import folders


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_gone_launchers_folders_are_swept_and_no_others(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(folders.tempfile, "tempdir", str(tmp_path))
    mine = Path(folders.private_folder("cli-"))
    assert mine.parent == tmp_path and mine.name.startswith("flm-serve-cli-")
    assert (mine / folders.OWNER).read_text() == str(os.getpid())
    assert oct(mine.stat().st_mode & 0o777) == "0o700"
    gone = tmp_path / "flm-serve-abc"
    gone.mkdir()
    (gone / folders.OWNER).write_text(str(_dead_pid()))
    (gone / "serve.yaml").write_text("api_key: secret")
    unmarked = tmp_path / "flm-serve-old"  # a folder without the mark: not ours to judge
    unmarked.mkdir()
    alive = tmp_path / "flm-serve-other"  # another run's, still going
    alive.mkdir()
    (alive / folders.OWNER).write_text(str(os.getppid()))
    other = tmp_path / "something-else"
    other.mkdir()
    (other / folders.OWNER).write_text(str(_dead_pid()))
    assert folders.sweep() == [gone]
    assert not gone.exists()
    assert mine.exists() and unmarked.exists() and alive.exists() and other.exists()
