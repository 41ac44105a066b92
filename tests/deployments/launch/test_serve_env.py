"""configs/serve.env: the Ray settings `make serve`, the integration tests and bench_serve
start Ray with."""

from __future__ import annotations

import pytest

from deployments.launch.serve_env import read_serve_env, serve_environ


def test_env_file_lines(tmp_path) -> None:
    f = tmp_path / "x.env"
    f.write_text("# a comment\n\nA=1\n  B = two words \nC=\n")
    assert read_serve_env(f) == {"A": "1", "B": "two words", "C": ""}


@pytest.mark.parametrize("line", ["JUSTAWORD", "1BAD=x", "=x"])
def test_malformed_line_is_named(tmp_path, line: str) -> None:
    f = tmp_path / "x.env"
    f.write_text(f"A=1\n{line}\n")
    with pytest.raises(ValueError, match=r"x\.env:2: expected KEY=VALUE"):
        read_serve_env(f)


def test_the_environment_wins_and_side_ports_are_private() -> None:
    defaults = read_serve_env()
    assert defaults["RAY_SERVE_ENABLE_HA_PROXY"] == "1"  # the serving path BENCHMARKS.md measures
    env = serve_environ({"RAY_SERVE_ENABLE_HA_PROXY": "0"}, private_ports=True)
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in env  # the caller's own setting stays
    ports = [env[k] for k in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                              "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT")]
    assert all(p.isdigit() and int(p) > 0 for p in ports)
    assert "RAY_SERVE_HAPROXY_STATS_PORT" not in serve_environ({})


def test_a_port_is_handed_out_once_per_process(monkeypatch) -> None:
    """Side ports and the app's port are picked before Ray binds any of them: two picks
    must never be the same port, even when the random draw repeats."""
    from deployments.launch import serve_env

    class FreeSocket:  # every port free, whatever this host has bound
        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def bind(self, address) -> None:
            pass

    draws = iter([24000, 24000, 24001])
    monkeypatch.setattr(serve_env.random, "randrange", lambda a, b: next(draws))
    monkeypatch.setattr(serve_env.socket, "socket", FreeSocket)
    monkeypatch.setattr(serve_env, "_HANDED_OUT", set())
    assert [serve_env.free_port(), serve_env.free_port()] == [24000, 24001]
