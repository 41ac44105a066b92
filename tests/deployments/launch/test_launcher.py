"""The launcher (deployments/launch/launcher.py) without Serve: what a person sees when Ray
itself cannot start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deployments.launch.serve_env import free_port

ROOT = Path(__file__).resolve().parents[3]


def test_ray_failing_to_start_is_one_line_not_a_traceback(tmp_path) -> None:
    # seen on a 2-core host under load: ray.init's raylet timed out, and `serve run` lost its
    # proxy; each ended the run with a traceback
    config = tmp_path / "serve.yaml"
    config.write_text(f"http_options: {{host: 127.0.0.1, port: {free_port()}}}\n"
                      "applications: []\n")
    script = ("import sys, ray\n"
              "def init(*a, **k):\n"
              "    raise Exception('The current node timed out during startup. This could\\n'\n"
              "                    'happen because some of the raylet failed to startup.')\n"
              "ray.init = init\n"
              "from deployments.launch import launcher\n"
              f"sys.exit(launcher.main([{str(config)!r}]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("flm-serve: Ray")]
    assert lines == ["flm-serve: Ray or Serve failed: Exception: The current node timed out "
                     "during startup. This could; happen because some of the raylet failed "
                     "to startup."]


def test_a_forced_stop_removes_the_private_folders_before_ending_ray(tmp_path,
                                                                     monkeypatch) -> None:
    # seen on a loaded host: a SIGTERM'd run whose Serve shutdown outlasted FORCE_AT_S ended
    # its raylet, Ray's core worker then ended the launcher at once, and its folders
    # (HAProxy's files, the command line's config) stayed in /tmp until the next run
    import threading
    import time

    from deployments.launch import launcher

    private = tmp_path / "flm-serve-x"
    private.mkdir()
    seen: dict[str, bool] = {}
    exited = threading.Event()

    class Processes:
        def record(self) -> None: ...

        def alive(self) -> list[int]:
            return []  # no gcs_server: Serve has nothing left to shut down

        def end(self, deadline: float, *, done) -> list[int]:
            seen["folder_at_end"] = private.exists()
            return []

    monkeypatch.setattr(launcher.os, "_exit", lambda code: exited.set())
    stop = launcher._Stop(Processes(), "127.0.0.1", free_port(), (str(private),))
    stop.begin()
    assert exited.wait(10)
    time.sleep(0.1)
    assert seen == {"folder_at_end": False}
    assert not private.exists()
