"""RunProcesses: the processes one `deployments.launch` run started, found again to end them.

Two ways, because each misses some: a process whose environment carries the run's id
(HAProxy, which Serve may spawn during its own shutdown and leave to init), and every
descendant of the launcher seen while the run went on (Ray's agents overwrite their
environment with their process title, and outlive their raylet ignoring SIGTERM). A pid
seen earlier counts only while its start time is the same, so a reused pid is left alone.
Linux only (/proc).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

RUN_ID_VAR = "FLM_SERVE_RUN_ID"


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a process, or None when it is gone (a zombie, which
    only waits for its parent to collect its status, is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        if fields[0] in ("Z", "X"):
            return None
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def pids() -> list[int]:
    """Every process's pid."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def descendants(roots: list[int]) -> dict[int, int]:
    """The processes alive now under `roots` (roots included when alive): pid -> start
    time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for pid in pids():
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[0], []).append(pid)
            starts[pid] = st[1]
    found = {r: starts[r] for r in roots if r in starts}
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found[child] = starts[child]
                todo.append(child)
    return found


def ancestors() -> set[int]:
    """This process and its ancestors (`make`, a shell: what started the run)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        st = _stat(pid)
        if st is None:
            break
        pid = st[0]
    return pids


class RunProcesses:
    def __init__(self, run_id: str) -> None:
        self.marker = f"{RUN_ID_VAR}={run_id}".encode()
        self.seen: dict[int, int] = {}  # pid -> start time
        self._lock = threading.Lock()

    def watch(self, interval_s: float = 2.0) -> None:
        """Record the launcher's descendants every `interval_s` (a daemon thread; what
        needs it lives long: Ray's agents start with Ray)."""
        def loop() -> None:
            while True:
                self.record()
                time.sleep(interval_s)

        threading.Thread(target=loop, name="flm-processes", daemon=True).start()

    def record(self) -> None:
        """Add the launcher's descendants alive now to those seen."""
        found = descendants([os.getpid()])
        found.pop(os.getpid(), None)
        with self._lock:
            self.seen.update(found)

    def alive(self) -> list[int]:
        """The run's processes alive now (never this one or its ancestors)."""
        mine = ancestors()
        with self._lock:
            seen = dict(self.seen)
        out = []
        for pid in pids():
            if pid in mine:
                continue
            if pid in seen:
                st = _stat(pid)
                if st is not None and st[1] == seen[pid]:
                    out.append(pid)
                    continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if self.marker in f.read().split(b"\0") and _stat(pid) is not None:
                        out.append(pid)
            except OSError:  # gone, or not ours to read
                continue
        return out

    def end(self, deadline: float, *, grace_s: float = 2.0,
            done: Callable[[], bool] = lambda: True,
            before_raylet: Callable[[list[int]], None] = lambda ended: None) -> list[int]:
        """SIGTERM what is left of the run, SIGKILL what is still there after `grace_s`,
        then wait (until `deadline`, a time.monotonic() value) for it to go and for `done`.
        The raylet goes last, after `before_raylet(the pids ended so far)`: its end can end
        this process at once (Ray's core worker exits when its raylet dies), and whatever
        this process still had to end (Ray's agents, which ignore SIGTERM) would stay.

        Returns:
            The pids that were still alive and had to be ended.
        """
        left = self.alive()
        raylets = {pid for pid in left if comm(pid) == "raylet"}
        self._end(lambda: [pid for pid in self.alive() if pid not in raylets], deadline,
                  grace_s, lambda: True)
        before_raylet([pid for pid in left if pid not in raylets])
        self._end(self.alive, deadline, grace_s, done)
        return left

    @staticmethod
    def _end(targets: Callable[[], list[int]], deadline: float, grace_s: float,
             done: Callable[[], bool]) -> None:
        for pid in targets():
            _signal(pid, signal.SIGTERM)
        kill_at = min(deadline, time.monotonic() + grace_s)
        while targets() and time.monotonic() < kill_at:
            time.sleep(0.05)
        for pid in targets():
            _signal(pid, signal.SIGKILL)
        while (targets() or not done()) and time.monotonic() < deadline:
            time.sleep(0.05)


def comm(pid: int) -> str:
    """A process's command name ("raylet", "gcs_server"); "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
