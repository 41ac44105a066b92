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
