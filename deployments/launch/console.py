"""The console's start block: once the served apps are up, one block on stdout with the
version, the address (where a browser gets the chat page), each model with its file,
format, device, kernel path, batch and context (or why it could not load) and Ray's log
directory; then "ready in N s". A run in which no model could load stops, and the launcher
exits non-zero.

`StartWatch` does this from a thread of the launcher (`serve run` holds the main thread);
`start_block` is the text alone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

APP_IMPORT = "deployments.app:build_app"
DEFAULT_MODELS = [{"name": "smollm2-135m"}]  # deployments.app.AppConfig's default
READY_S = 600.0  # the longest the watch waits for the apps (a big model loads slowly)
TERMINAL = ("RUNNING", "DEPLOY_FAILED", "UNHEALTHY")


@dataclass(frozen=True)
class ServedApp:
    """An app of the Serve config that this project builds: its name, route prefix and
    the names of its models."""

    name: str
    prefix: str
    models: list[str]
    models_dir: str | None = None


def served_apps(config: dict[str, Any]) -> list[ServedApp]:
    out = []
    for app in config.get("applications") or []:
        if app.get("import_path") != APP_IMPORT:
            continue
        args = app.get("args") or {}
        models = args.get("models")
        if models is None and not args.get("models_dir"):
            models = DEFAULT_MODELS
        out.append(ServedApp(app.get("name") or "default", app.get("route_prefix") or "/",
                             [str(m.get("name")) for m in models or []],
                             args.get("models_dir")))
    return out


def none_loaded(models: dict[str, dict[str, Any]], libraries: list[str]) -> bool:
    """Whether nothing can be served: every configured model failed and no models_dir."""
    return not libraries and all(i.get("error") for i in models.values())


def _size(n: int | None) -> str:
    if not n:
        return "?"
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def model_lines(name: str, info: dict[str, Any]) -> list[str]:
    """A model in the start block: two lines, or one naming why it could not load."""
    if info.get("error"):
        return [f"  model    {name}: UNAVAILABLE", f"           {info['error']}"]
    kind = (info.get("file_format") or "").upper()
    quant = info.get("quantization") or ""
    details = (f"{kind} {quant} {_size(info.get('weight_bytes'))}, "
               f"{info.get('architecture', '?')}, chat format {info.get('format', '?')}; "
               f"{info.get('device', '?')} ({info.get('kernels', '?')}), "
               f"batch {info.get('max_batch', '?')}, context {info.get('context_length', '?')}")
    return [f"  model    {name}  {info.get('path', '?')}", f"           {details}"]


def start_block(*, version: str, urls: list[str], models: dict[str, dict[str, Any]],
                logs: str | None, seconds: float, libraries: tuple[str, ...] = ()) -> str:
    lines = [f"flm-serve {version}"]
    lines += [f"  API      {u}   (a browser gets the chat page there)" for u in urls]
    for name, info in models.items():
        lines += model_lines(name, info)
    lines += [f"  library  {d}   (each model loads on first use)" for d in libraries]
    if logs:
        lines.append(f"  logs     {logs}")
    if none_loaded(models, list(libraries)):
        lines.append("no model could be loaded: stopping")
    else:
        lines.append(f"ready in {seconds:.0f} s")
    return "\n".join(lines) + "\n"


def _version() -> str:
    try:
        return metadata.version("flm-serve")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def logs_dir() -> str | None:
    try:
        import ray

        return ray._private.worker._global_node.get_logs_dir_path()
    except Exception:
        return None


class StartWatch:
    """Waits for a Serve config's apps, then prints the start block; if no model could
    load, sets `failed`, calls `on_no_model` and sends this process SIGINT (the launcher's
    stop). It gives up once `stopping` is set: a Serve call after the launcher's
    `ray.shutdown()` would start a Ray cluster of its own (Ray's auto-init)."""

    def __init__(self, config_path: Path, started: float, *,
                 on_no_model: Callable[[], None] = lambda: None,
                 stopping: threading.Event | None = None) -> None:
        config = yaml.safe_load(config_path.read_text()) or {}
        http = config.get("http_options") or {}
        self.host = str(http.get("host") or "127.0.0.1")
        self.port = int(http.get("port") or 8000)
        self.apps = served_apps(config)
        self.started = started
        self.on_no_model = on_no_model
        self.failed = False
        self.broken = ""  # why an app could not be deployed
        self.stopping = stopping or threading.Event()

    def start(self) -> None:
        if self.apps:
            threading.Thread(target=self._run, name="flm-start-block", daemon=True).start()

    def _urls(self) -> list[str]:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return [f"http://{host}:{self.port}{a.prefix.rstrip('/')}/" for a in self.apps]

    def _run(self) -> None:
        try:
            models = self._wait_and_describe()
        except Exception as exc:  # the block is a courtesy: never a reason to stop
            print(f"flm-serve: no start block ({exc!r})", file=sys.stderr, flush=True)
            return
        if models is None:
            return
        if self.broken:  # an app Serve could not build: said, and the run stops
            print(f"flm-serve: {self.broken}", file=sys.stderr, flush=True)
            self.failed = True
            self.on_no_model()
            os.kill(os.getpid(), signal.SIGINT)
            return
        libraries = tuple(a.models_dir for a in self.apps if a.models_dir)
        print(start_block(version=_version(), urls=self._urls(), models=models,
                          logs=logs_dir(), seconds=time.monotonic() - self.started,
                          libraries=libraries), end="", flush=True)
        if none_loaded(models, list(libraries)):
            self.failed = True
            self.on_no_model()
            os.kill(os.getpid(), signal.SIGINT)

    def _wait_and_describe(self) -> dict[str, dict[str, Any]] | None:
        from ray import serve

        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.stopping.is_set():
                return None
            try:
                status = serve.status().applications
            except Exception:  # Serve's controller is not up yet
                status = {}
            states = [str(getattr(status.get(a.name), "status", "")) for a in self.apps]
            if all(s.split(".")[-1] in TERMINAL for s in states):
                failed = [a for a, s in zip(self.apps, states) if s.endswith("DEPLOY_FAILED")]
                if failed:
                    message = str(getattr(status.get(failed[0].name), "message", ""))
                    last = (message.strip().splitlines() or ["(no message)"])[-1]
                    self.broken = (f"the application {failed[0].name!r} could not be "
                                   f"deployed: {last}")
                    return {}
                break
            time.sleep(0.5)
        else:
            return None
        if self.stopping.is_set():
            return None
        models: dict[str, dict[str, Any]] = {}
        for app in self.apps:
            for name in app.models:
                handle = serve.get_deployment_handle(f"worker-{name}", app_name=app.name)
                try:
                    models[name] = handle.info.remote().result(timeout_s=60)
                except Exception as exc:
                    models[name] = {"error": f"its worker did not answer ({exc!r:.200})"}
        return models
