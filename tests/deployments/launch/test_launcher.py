"""The launcher (deployments/launch/launcher.py) without Serve: what a person sees when Ray
itself cannot start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.launch.serve_env import free_port

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("slow_cleanup", [False, True])
def test_ray_failing_to_start_is_one_line_not_a_traceback(tmp_path, slow_cleanup) -> None:
    # seen on a 2-core host under load: ray.init's raylet timed out, and `serve run` lost its
    # proxy; each ended the run with a traceback. And under more load the cleanup after it
    # outlasted FORCE_AT_S: the forced end exited with status 0
    config = tmp_path / "serve.yaml"
    config.write_text(f"http_options: {{host: 127.0.0.1, port: {free_port()}}}\n"
                      "applications: []\n")
    script = ("import sys, time, ray\n"
              "def init(*a, **k):\n"
              "    raise Exception('The current node timed out during startup. This could\\n'\n"
              "                    'happen because some of the raylet failed to startup.')\n"
              "ray.init = init\n"
              "from deployments.launch import launcher\n"
              + ("launcher._Stop.FORCE_AT_S = 0.2\n"
                 "ray.shutdown = lambda: time.sleep(3)\n" if slow_cleanup else "")
              + f"sys.exit(launcher.main([{str(config)!r}]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if "stopped" in line] == [
        "flm-serve: stopped"]
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

        def end(self, deadline: float, *, done, before_raylet) -> list[int]:
            seen["folder_at_end"] = private.exists()
            before_raylet([])  # the stop's line, before the end of the raylet ends this process
            return []

    monkeypatch.setattr(launcher.os, "_exit", lambda code: exited.set())
    printed: list[list[int]] = []
    monkeypatch.setattr(launcher, "_say_stopped", printed.append)
    stop = launcher._Stop(Processes(), "127.0.0.1", free_port(), (str(private),))
    stop.begin()
    assert exited.wait(10)
    time.sleep(0.1)
    assert seen == {"folder_at_end": False}
    assert not private.exists()
    assert printed == [[]]


def test_the_raylet_is_ended_after_the_rest_of_the_run(tmp_path) -> None:
    # its end can end the launcher at once (Ray's core worker exits when its raylet dies):
    # what was still to end then (Ray's agents, which ignore SIGTERM) stayed behind
    import shutil
    import signal
    import time
    import uuid

    from deployments.launch.processes import RUN_ID_VAR, RunProcesses

    run_id = uuid.uuid4().hex
    raylet = tmp_path / "raylet"
    raylet.symlink_to(shutil.which("sleep"))
    env = {**os.environ, RUN_ID_VAR: run_id}
    procs = [subprocess.Popen([str(raylet), "60"], env=env),
             subprocess.Popen(["sleep", "60"], env=env,
                              preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))]
    try:
        time.sleep(0.2)
        run = RunProcesses(run_id)
        order: dict[str, object] = {}

        def before_raylet(ended: list[int]) -> None:
            for p in procs:
                p.poll()
            order["agent_gone"] = procs[1].returncode is not None
            order["raylet_alive"] = procs[0].returncode is None
            order["ended"] = ended

        ended = run.end(time.monotonic() + 8, grace_s=0.5, before_raylet=before_raylet)
        for p in procs:
            p.wait(5)
        assert order == {"agent_gone": True, "raylet_alive": True, "ended": [procs[1].pid]}
        assert sorted(ended) == sorted(p.pid for p in procs)
    finally:
        for p in procs:
            p.kill()


def _npu_config(tmp_path: Path, model: str) -> Path:
    config = tmp_path / "serve.yaml"
    config.write_text(f"http_options: {{host: 127.0.0.1, port: {free_port()}}}\n"
                      "applications:\n  - name: flm\n    import_path: deployments.app:build_app\n"
                      f"    args: {{models: [{model}]}}\n")
    return config


def test_the_ray_a_run_starts_declares_the_npus_its_workers_claim(tmp_path, monkeypatch) -> None:
    # `flm-serve serve MODEL --device npu --kernel-dir DIR` on one machine: Ray detects no
    # NPU there (its own "NPU" is Ascend's), so the worker's {"NPU": 1} waited for ever
    from deployments.launch import launcher

    monkeypatch.setitem(sys.modules, "pyxrt", None)  # no XRT here: none seen
    npu = "{name: m, path: flm-tiny, device: npu, kernel_dir: /k, replicas: 2}"
    assert launcher.npu_count(_npu_config(tmp_path, npu)) == 2
    sim = "{name: m, path: flm-tiny, device: npu, simulator_devices: [a, b, c]}"
    assert launcher.npu_count(_npu_config(tmp_path, sim)) == 3
    assert launcher.npu_count(_npu_config(tmp_path, "{name: m, path: flm-tiny}")) == 0
    script = ("import sys, ray\n"
              "def init(*a, **k):\n"
              "    print('resources', k.get('resources'), file=sys.stderr)\n"
              "    raise Exception('stop here')\n"
              "ray.init = init\n"
              "sys.modules['pyxrt'] = None\n"
              "from deployments.launch import launcher\n"
              "launcher.joins_cluster = lambda: False\n"
              f"sys.exit(launcher.main([{str(_npu_config(tmp_path, npu))!r}]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "resources {'NPU': 2}" in done.stderr.splitlines(), done.stderr


def test_rays_ascend_npu_type_traceback_stays_off_the_console(monkeypatch) -> None:
    # with {"NPU": n} declared, ray.init asks Ascend's `acl` for the NPU's type and logs
    # "Failed to detect NPU type." with an ImportError traceback on the console
    import logging

    from ray.autoscaler._private.cli_logger import cli_logger

    from deployments.launch import console_filter

    npu_log = logging.getLogger("ray._private.accelerators.npu")
    for name in ("print", "success", "info"):  # put back after the test
        monkeypatch.setattr(cli_logger, name, getattr(cli_logger, name))
    for log in (npu_log, logging.getLogger(console_filter._TOKEN_LOGGER)):
        monkeypatch.setattr(log, "filters", [])
    for name in ("ray", "ray.serve"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    console_filter.quiet_driver(False)
    record = npu_log.makeRecord(npu_log.name, logging.ERROR, __file__, 1,
                                "Failed to detect NPU type.", (), None)
    assert not npu_log.filter(record)
    other = npu_log.makeRecord(npu_log.name, logging.ERROR, __file__, 1, "other", (), None)
    assert npu_log.filter(other)
