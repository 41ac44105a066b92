"""The private folders of a run (`flm-serve-*` in the temporary directory: HAProxy's files,
the command line's config): each marked with its launcher's process id, and those whose
launcher is gone removed when the next run starts. A launcher removes its own as it stops,
but not when it is killed first: Ray's core worker ends the process at once when its raylet
dies, before any cleanup runs."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "flm-serve-"
OWNER = "launcher.pid"


def private_folder(kind: str = "") -> str:
    """A new folder (mode 0700) of this run, marked as this process's."""
    folder = tempfile.mkdtemp(prefix=PREFIX + kind)
    (Path(folder) / OWNER).write_text(str(os.getpid()))
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def sweep(root: str | None = None) -> list[Path]:
    """Remove this user's run folders under `root` (the temporary directory) whose
    launcher is no longer running; the ones removed. A folder without the mark (another
    program's, or a run from before marks) is left alone."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            if not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
