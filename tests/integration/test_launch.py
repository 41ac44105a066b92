"""`make serve` itself, as a user runs it: a busy port is one line before Ray starts;
nothing listens beyond the API's host; however it is stopped (SIGTERM or Ctrl-C to its
process group, also after `serve shutdown`, or SIGTERM to the launcher alone) it returns
within 10 s leaving no process and no bound port, and `make serve` right after answers.

Each run is `make serve CONFIG=...` in a session of its own, on a free port, with the
generated test model."""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from deployments.launch.launcher import port_in_use
from deployments.launch.processes import RunProcesses
from deployments.launch.serve_env import free_port
from npu.engine.cpu_kernels import seed_cache

ROOT = Path(__file__).resolve().parents[2]
STOP_S = 10.0
START_S = 180.0
pytestmark = pytest.mark.timeout(600)


def _session(sid: int) -> list[int]:
    """Live (not zombie) processes of a session."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out


def _listening(pids: list[int]) -> set[tuple[str, int]]:
    """The (address, port) TCP sockets these processes listen on."""
    inodes: dict[str, tuple[str, int]] = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] != "0A":  # LISTEN
                    continue
                hex_addr, hex_port = parts[1].split(":")
                raw = bytes.fromhex(hex_addr)
                # the kernel prints each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                addr = ipaddress.IPv6Address(raw) if v6 else ipaddress.IPv4Address(raw)
                inodes[parts[9]] = (str(addr), int(hex_port, 16))
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                found.add(inodes[link[8:-1]])
    return found


def _loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> tuple[Path, int, dict]:
    port = free_port()
    path = tmp_path_factory.mktemp("launch") / "tiny.yaml"
    path.write_text((ROOT / "configs" / "tiny.yaml").read_text()
                    .replace("port: 8000", f"port: {port}"))
    # the Ray settings the test session's own Serve instance put in os.environ stay out
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["FLM_CACHE"] = str(tmp_path_factory.mktemp("launch-cache"))
    seed_cache(Path(env["FLM_CACHE"]))  # the server loads this process's kernel build
    return path, port, env


def _make_serve(config: tuple[Path, int, dict], log: Path) -> tuple[subprocess.Popen, str]:
    path, _, env = config
    run_id = uuid.uuid4().hex
    proc = subprocess.Popen(["make", "serve", f"CONFIG={path}"], cwd=ROOT,
                            env={**env, "FLM_SERVE_RUN_ID": run_id}, start_new_session=True,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, run_id


def _wait_ready(proc: subprocess.Popen, port: int, log: Path) -> None:
    end = time.monotonic() + START_S
    while time.monotonic() < end:
        assert proc.poll() is None, f"make serve exited early:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"not ready in {START_S} s:\n{log.read_text()[-3000:]}")


def _wait_printed(proc: subprocess.Popen, log: Path, text: str) -> None:
    end = time.monotonic() + START_S
    while time.monotonic() < end:
        assert proc.poll() is None, f"make serve exited early:\n{log.read_text()[-3000:]}"
        if text in log.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not printed in {START_S} s:\n{log.read_text()[-3000:]}")


def _kill_run(proc: subprocess.Popen, run_id: str) -> None:
    for pid in set(_session(proc.pid)) | set(RunProcesses(run_id).alive()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _launcher(proc: subprocess.Popen) -> int:
    out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def test_a_busy_port_is_one_line_before_ray_starts(config, tmp_path) -> None:
    _, port, _ = config
    log = tmp_path / "busy.log"
    with __import__("socket").socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        proc, run_id = _make_serve(config, log)
        assert proc.wait(timeout=120) != 0
    text = log.read_text()
    assert f"127.0.0.1:{port} is already in use" in text
    assert "Traceback" not in text and "Ray instance" not in text
    assert RunProcesses(run_id).alive() == []


def test_a_bad_config_value_is_one_line_and_the_run_ends(config, tmp_path) -> None:
    """A value the app cannot take is said in one line and the run exits 1 (before Serve
    builds, and retries, the app): not tracebacks, then "ready", then 404s for ever."""
    path, port, env = config
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("args:", f"args:\n      models_dir: {tmp_path}\n"
                                            "      keep_alive: 5 minutes", 1))
    log = tmp_path / "bad.log"
    proc, run_id = _make_serve((bad, port, env), log)
    try:
        assert proc.wait(timeout=120) != 0
    finally:
        _kill_run(proc, run_id)
    text = log.read_text()
    assert "$.keep_alive" in text and "Traceback" not in text and "ready in" not in text
    assert RunProcesses(run_id).alive() == [] and not port_in_use("127.0.0.1", port)


# (the third way, `serve shutdown` then Ctrl-C to the group, is the command line's test's)
@pytest.mark.parametrize("how", ["group-SIGTERM", "launcher-SIGTERM"])
def test_a_stop_leaves_nothing_and_a_restart_answers(config, tmp_path, how: str) -> None:
    """Each case starts right after the previous one stopped (the restart check)."""
    _, port, _ = config
    log = tmp_path / "serve.log"
    proc, run_id = _make_serve(config, log)
    try:
        _wait_ready(proc, port, log)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": "flm-tiny", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200
        exposed = {(a, p) for a, p in _listening(_session(proc.pid)) if not _loopback(a)}
        assert exposed == set(), "listening beyond the API's host (127.0.0.1)"
        target, sig = how.split("-")
        t0 = time.monotonic()
        if target == "group":
            os.killpg(proc.pid, getattr(signal, sig))
        else:
            os.kill(_launcher(proc), getattr(signal, sig))
        proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:  # a failed check: do not leave the run behind
            _kill_run(proc, run_id)
    assert took <= STOP_S, f"make serve took {took:.1f} s to stop"
    assert _session(proc.pid) == [] and RunProcesses(run_id).alive() == []
    assert not port_in_use("127.0.0.1", port)
    assert "Traceback" not in log.read_text()


def test_the_command_line_serves_one_model(config, tmp_path) -> None:
    """`flm-serve serve flm-tiny --port P`: the same app as the configs, without one,
    listening on the API's host only; `serve shutdown`, then Ctrl-C to its group, stops it
    like `make serve`, leaving no process and no bound port."""
    _, port, env = config
    log = tmp_path / "cli.log"
    run_id = uuid.uuid4().hex
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "flm-serve"), "serve", "flm-tiny",
                             "--port", str(port), "--name", "tiny"], cwd=tmp_path,
                            env={**env, "FLM_SERVE_RUN_ID": run_id}, start_new_session=True,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, port, log)
        _wait_printed(proc, log, "ready in ")  # the start block (deployments/launch/console)
        block = log.read_text()
        assert f"API      http://127.0.0.1:{port}/" in block and "model    tiny  " in block
        models = httpx.get(f"http://127.0.0.1:{port}/api/tags", timeout=30).json()
        assert [m["model"] for m in models["models"]] == ["tiny:latest"]
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200
        # its access line, and none of Ray's INFO lines: those are in the logs directory
        _wait_printed(proc, log, "| POST /v1/chat/completions | tiny | ")
        text = log.read_text()
        assert not re.search(r"^(\(\S+ pid=\d+\) )?(INFO|DEBUG) \d{4}-", text, re.M), text
        assert "Started a local Ray instance" not in text and "Deploying" not in text
        logs = Path(re.search(r"^  logs     (\S+)$", text, re.M).group(1))
        assert any("INFO" in f.read_text() for f in (logs / "serve").glob("controller_*.log"))
        exposed = {(a, p) for a, p in _listening(_session(proc.pid)) if not _loopback(a)}
        assert exposed == set(), "listening beyond the API's host (127.0.0.1)"
        done = subprocess.run([str(ROOT / ".venv" / "bin" / "serve"), "shutdown", "-y"],
                              env=env, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            _kill_run(proc, run_id)
    assert took <= STOP_S
    assert _session(proc.pid) == [] and RunProcesses(run_id).alive() == []
    assert not port_in_use("127.0.0.1", port)
    assert "Traceback" not in log.read_text()
