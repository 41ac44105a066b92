"""deployments/app.py: a models_dir app has a library worker and no default model; its
options are checked before anything starts."""

from __future__ import annotations

import msgspec
import pytest

from deployments.app import build_app


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
