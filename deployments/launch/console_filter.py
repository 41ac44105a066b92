"""What the console shows of the lines Ray streams to the driver from its processes: every
line but Ray's and Serve's own INFO and DEBUG records, which stay in Ray's log files (the
start block names the directory). So the console has the start block, load progress, one
access line per request, and every warning and error, wherever it comes from.

A replica's lines (ours: access lines, load progress, our loggers' warnings) are shown
without Ray's "(ServeReplica:flm:Ingress pid=...)" prefix; a kept line of Ray's own
processes (the controller's warnings, the raylet's) keeps it, so its source stays named.

Once the run is stopping, Ray's own processes print nothing more on the console: Serve takes
its parts down one by one, and a part still running may log that another has gone (Ray
2.60's HAProxy manager logs a traceback when its metrics loop finds HAProxy already
killed). Those lines stay in the log files; a replica's lines still show.

`--verbose` or `FLM_VERBOSE=1` (in the environment or configs/serve.env) leaves Ray's
printing as Ray has it.

Ray has no public switch for this: `ray.init(log_to_driver=False)` drops every worker line
(warnings and our access lines too) and `RAY_SERVE_LOG_TO_STDERR=0` drops Serve's warnings
and sends a replica's prints to its log file only. So `install` swaps the handler
`ray.init` registers on Ray's driver-side dispatcher of worker lines (Ray 2.60:
`ray._private.ray_logging.global_worker_stdstream_dispatcher`, handler "ray_print_logs")
for one that filters, then prints through Ray's own printer (its deduplication, colours
and prefixes); if that internal moves, the console is left as Ray has it, with a warning.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

VERBOSE_VAR = "FLM_VERBOSE"
RAY_HANDLER = "ray_print_logs"  # the name ray.init gives its printer of worker lines

# the first line of a Ray or Serve record below WARNING
_QUIET = re.compile(
    r"(?:INFO|DEBUG) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "  # Serve's components
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(?:INFO|DEBUG) "  # Ray's Python loggers
    r"|(?:INFO|DEBUG):\s"  # uvicorn (Serve's proxy)
    r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [ID] \d+ \d+\] "  # Ray's C++ core
)

# warnings Ray gives on every run about this launcher's own deliberate settings: a loopback
# API (so no HAProxy of another node reaches it), the token Ray protects its clusters
# with, and the NPUs it declares (Ray then asks Ascend's `acl` for their type, and logs a
# traceback: ours are AMD's); nothing to act on, so they stay in the log files
EXPECTED = ("won't accept connections from HAProxy on other nodes",
            "Token authentication is enabled for this Ray cluster",
            "Failed to detect NPU type")
_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
_NPU_LOGGER = "ray._private.accelerators.npu"


def is_verbose(environ: Mapping[str, str]) -> bool:
    """Whether `environ` asks for Ray's own lines on the console (FLM_VERBOSE=1/true/yes)."""
    return environ.get(VERBOSE_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def is_quiet(line: str) -> bool:
    """Whether a line stays in the log files only: a Ray or Serve record below WARNING, or
    a warning in EXPECTED."""
    return _QUIET.match(line) is not None or any(e in line for e in EXPECTED)


def filtered(data: dict[str, Any]) -> dict[str, Any] | None:
    """A batch of Ray's worker lines (`lines`, `pid`, `actor_name`, ...) without its quiet
    lines, or None when none is left."""
    lines = [line for line in data.get("lines") or [] if not is_quiet(line)]
    if not lines:
        return None
    return {**data, "lines": lines}


def is_replica(data: Mapping[str, Any]) -> bool:
    """Whether a batch comes from a Serve replica (our code runs there)."""
    return str(data.get("actor_name") or "").startswith("ServeReplica:")


def make_printer(show: Callable[[dict[str, Any], bool], None],
                 stopping: threading.Event | None = None) -> Callable[[dict], None]:
    """The dispatcher handler: `show(data, ignore_prefix)` (Ray's printer) of each batch's
    kept lines, a replica's without Ray's prefix; once `stopping` is set, a replica's only."""
    def handle(data: dict[str, Any]) -> None:
        kept = filtered(data)
        if kept is None:
            return
        replica = is_replica(kept)
        if replica or stopping is None or not stopping.is_set():
            show(kept, replica)

    return handle


class _Expected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(e in record.getMessage() for e in EXPECTED)


def quiet_driver(verbose: bool) -> None:
    """Before `ray.init`: this process's own lines below WARNING (ray.init's, Serve's, `serve
    run`'s "Running config file ..." and "Submitted deploy config successfully.") stay off
    the console, and so do EXPECTED warnings; warnings and errors still print."""
    if verbose:
        return
    for name in ("ray", "ray.serve"):  # ray.serve does not propagate to ray
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in (_TOKEN_LOGGER, _NPU_LOGGER):
        logging.getLogger(name).addFilter(_Expected())
    try:
        from ray.autoscaler._private.cli_logger import cli_logger
    except ImportError:
        return
    for name in ("print", "success", "info"):
        setattr(cli_logger, name, lambda *args, **kwargs: None)


def install(verbose: bool, stopping: threading.Event | None = None) -> None:
    """After `ray.init`: Ray's worker lines are filtered as the module docstring says
    (`stopping`: set once the run stops; nothing changes when `verbose`)."""
    if verbose:
        return
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
        from ray._private.worker import print_to_stdstream
    except ImportError as exc:
        print(f"flm-serve: Ray's lines are shown unfiltered ({exc})", file=sys.stderr)
        return
    if not any(name == RAY_HANDLER for name, _ in dispatcher.handlers):
        return  # log_to_driver is off: nothing is printed anyway
    dispatcher.remove_handler(RAY_HANDLER)
    dispatcher.add_handler(RAY_HANDLER, make_printer(
        lambda data, bare: print_to_stdstream(data, ignore_prefix=bare), stopping))


def verbose_from(argv: list[str],
                 environ: Mapping[str, str] = os.environ) -> tuple[bool, list[str]]:
    """`--verbose` / `-v` taken out of `argv`, or FLM_VERBOSE in `environ`; and the rest."""
    rest = [a for a in argv if a not in ("--verbose", "-v")]
    return len(rest) != len(argv) or is_verbose(environ), rest
