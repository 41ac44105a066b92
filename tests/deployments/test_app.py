"""deployments/app.py: a models_dir app has a library worker and no default model; its
options are checked before anything starts."""

from __future__ import annotations

import msgspec
import pytest

from deployments.app import build_app, check_args


def _deployments(app) -> dict:
    """The bound deployments under the ingress, by name."""
    ingress = app._bound_deployment
    workers, _settings, _hub, library = ingress.init_args
    return {"workers": workers,
            "library": library._bound_deployment if library is not None else None}


def test_models_dir_alone_serves_the_library_and_no_default_model(tmp_path) -> None:
    parts = _deployments(build_app({"models_dir": str(tmp_path), "keep_alive": "90s",
                                    "library": {"max_loaded_models": 3}}))
    assert parts["workers"] == {}
    config = parts["library"].init_args[0]
    assert (config.models_dir, config.keep_alive_s, config.max_loaded_models) == (
        str(tmp_path), 90.0, 3)
    assert list(_deployments(build_app({}))["workers"]) == ["smollm2-135m"]
    assert _deployments(build_app({}))["library"] is None


@pytest.mark.parametrize("args,where", [
    ({"keep_alive": "soon"}, "$.keep_alive"),
    ({"library": {"max_loaded_models": 0}}, "$.library.max_loaded_models"),
    ({"library": {"device": "npu", "kernel_dir": "/k"}}, "$.library.device"),
    ({"library": {"max_loaded": 2}}, "max_loaded"),
])
def test_a_bad_library_option_is_named(tmp_path, args: dict, where: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=where.replace("$", r"\$")):
        build_app({"models_dir": str(tmp_path), **args})
    with pytest.raises(msgspec.ValidationError, match=where.replace("$", r"\$")):
        check_args({"models_dir": str(tmp_path), **args})  # the launcher's, before Serve


def test_the_launcher_says_a_bad_config_in_one_line(tmp_path) -> None:
    from deployments.launch.launcher import _app_fault

    config = tmp_path / "bad.yaml"
    config.write_text(f"""applications:
- name: flm
  import_path: deployments.app:build_app
  args:
    models_dir: {tmp_path}
    keep_alive: 5 minutes
""")
    fault = _app_fault(config)
    assert fault is not None and "'flm'" in fault and "$.keep_alive" in fault
    assert "\n" not in fault
    config.write_text(config.read_text().replace("5 minutes", "5m"))
    assert _app_fault(config) is None
    # as the command line's --models-dir: not an empty library that starts silently
    config.write_text(config.read_text().replace(str(tmp_path), str(tmp_path / "nope")))
    assert "models_dir" in _app_fault(config) and "not a directory" in _app_fault(config)


def test_the_api_key_defaults_to_flm_api_key(monkeypatch) -> None:
    # README: api_key's default is $FLM_API_KEY (`FLM_API_KEY=k make serve` requires it);
    # the command line's --api-key comes this way, out of the args Serve logs
    def key(args: dict) -> str | None:
        return build_app(args)._bound_deployment.init_args[1]["api_key"]

    monkeypatch.delenv("FLM_API_KEY", raising=False)
    assert key({}) is None
    monkeypatch.setenv("FLM_API_KEY", "from-env")
    assert key({}) == "from-env"
    assert key({"api_key": "from-config"}) == "from-config"


@pytest.mark.parametrize("model,where", [
    ({"max_batch": 0}, "$.models[0].max_batch"),
    ({"replicas": 0}, "$.models[0].replicas"),
    ({"max_queued": 0}, "$.models[0]"),
    ({"device": "gpu"}, "$.models[0].device"),
    ({"blas_threads": 0}, "$.models[0].blas_threads"),
])
def test_a_bad_model_value_is_named_before_serve_starts(model: dict, where: str) -> None:
    # max_batch 0 reached Serve, whose build failed three times with pydantic tracebacks,
    # and the launcher's line was "For further information visit https://errors.pydantic..."
    with pytest.raises(msgspec.ValidationError, match=where.replace("$", r"\$")
                       .replace("[", r"\[")):
        check_args({"models": [{"name": "m", "path": "smollm2-135m", **model}]})


@pytest.mark.parametrize("args,where", [
    ({"ingress_replicas": 0}, "$.ingress_replicas"),
    ({"max_request_bytes": 0}, "$.max_request_bytes"),
    ({"models": [{"name": "m", "path": "smollm2-135m"}, {"name": "m", "path": "flm-tiny"}]},
     "$.models[1].name"),
])
def test_a_bad_app_value_is_named_before_serve_starts(args: dict, where: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=where.replace("$", r"\$")
                       .replace("[", r"\[")):
        check_args(args)
