"""The Ray settings serving runs with (configs/serve.env), for code that starts Ray itself."""

from __future__ import annotations

import random
import socket
from collections.abc import Mapping
from pathlib import Path

SERVE_ENV_FILE = Path(__file__).resolve().parents[2] / "configs" / "serve.env"


def read_serve_env(path: Path = SERVE_ENV_FILE) -> dict[str, str]:
    """KEY=VALUE lines of an env file; blank lines and `#` comments are skipped.

    Raises:
        ValueError: a line is not KEY=VALUE (the message names the line).
    """
    env: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"{path}:{n}: expected KEY=VALUE, got {raw!r}")
        env[key.strip()] = value.strip()
    return env


# ports HAProxy mode opens besides the app's own (its stats page, its Prometheus endpoint,
# and Serve's fallback Python proxy), fixed by default
_SIDE_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
               "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT")


def serve_environ(environ: Mapping[str, str], *, private_ports: bool = False) -> dict[str, str]:
    """The variables to add to `environ` before starting Ray: configs/serve.env's, except
    those `environ` already sets.

    Args:
        private_ports: also move HAProxy's side ports to free ones picked now, so a test
            run or a benchmark can run beside `make serve` on the same host.
    """
    env = {k: v for k, v in read_serve_env().items() if k not in environ}
    if private_ports:
        for key in _SIDE_PORTS:
            if key not in environ:
                env[key] = str(free_port())
    return env


_HANDED_OUT: set[int] = set()  # ports free_port gave this process (maybe not bound yet)


def free_port() -> int:
    """A TCP port free on every interface now, below the kernel's ephemeral range: a port
    from that range (what binding port 0 gives) can be taken by one of Ray's outgoing
    connections before the server it was chosen for binds it (seen: HAProxy's Prometheus
    port, "Address already in use"). Never one it returned before in this process: ports
    are picked before Ray starts the servers that bind them (seen: HAProxy's stats port
    taken, most likely by the app port picked after it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    for _ in range(100):
        port = random.randrange(20000, max(ephemeral, 20001))
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:  # that range is full: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
