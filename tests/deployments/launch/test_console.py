"""The start block (deployments/launch/console.py): what a person reads once `make serve`
is up: the address, each model's file, format, device and kernel path, or why it could not
load; and that a run with no loadable model says it stops."""

from __future__ import annotations

from deployments.launch.console import ServedApp, none_loaded, served_apps, start_block

SMOL = {"path": "/models/smollm2.gguf", "file_format": "gguf", "quantization": "Q4_1",
        "weight_bytes": 97_000_000, "architecture": "llama", "format": "hermes_json",
        "device": "cpu", "kernels": "AVX2", "max_batch": 8, "context_length": 8192}
BROKEN = {"error": "The model 'bert' could not be loaded from /m/bert: config.json: "
                   "architecture ['BertModel'] is not supported"}


def test_start_block_names_address_model_file_device_and_kernel_path() -> None:
    text = start_block(version="0.1.0", urls=["http://127.0.0.1:8000/"],
                       models={"smollm2-135m": SMOL}, logs="/tmp/ray/logs", seconds=12.4)
    assert text.splitlines()[0] == "flm-serve 0.1.0"
    assert "http://127.0.0.1:8000/" in text and "chat page" in text
    assert "smollm2-135m  /models/smollm2.gguf" in text
    assert "GGUF Q4_1 97 MB" in text and "cpu (AVX2)" in text and "context 8192" in text
    assert "/tmp/ray/logs" in text and text.endswith("ready in 12 s\n")


def test_start_block_says_why_a_model_is_unavailable() -> None:
    text = start_block(version="0.1.0", urls=["http://127.0.0.1:8000/"],
                       models={"smollm2-135m": SMOL, "bert": BROKEN}, logs=None, seconds=3)
    assert "bert: UNAVAILABLE" in text and "/m/bert" in text and "not supported" in text
    assert text.endswith("ready in 3 s\n")
    alone = start_block(version="0.1.0", urls=["http://127.0.0.1:8000/"],
                        models={"bert": BROKEN}, logs=None, seconds=3)
    assert alone.endswith("no model could be loaded: stopping\n") and "ready" not in alone


def test_served_apps_are_this_projects_apps_with_their_models() -> None:
    config = {"applications": [
        {"name": "flm", "route_prefix": "/", "import_path": "deployments.app:build_app",
         "args": {"models": [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}]}},
        {"name": "default-model", "route_prefix": "/d",
         "import_path": "deployments.app:build_app"},
        {"name": "lib", "route_prefix": "/l", "import_path": "deployments.app:build_app",
         "args": {"models_dir": "/models"}},
        {"name": "other", "import_path": "somebody.else:app"}]}
    assert served_apps(config) == [ServedApp("flm", "/", ["a", "b"]),
                                   ServedApp("default-model", "/d", ["smollm2-135m"]),
                                   ServedApp("lib", "/l", [], "/models")]


def test_a_library_is_named_and_keeps_the_run_going() -> None:
    text = start_block(version="0.1.0", urls=["http://127.0.0.1:8000/"],
                       models={"bert": BROKEN}, logs=None, seconds=3, libraries=("/models",))
    assert "library  /models" in text and text.endswith("ready in 3 s\n")
    assert none_loaded({"bert": BROKEN}, []) and not none_loaded({"bert": BROKEN}, ["/m"])
    assert not none_loaded({"smollm2-135m": SMOL, "bert": BROKEN}, [])


def test_the_watch_stops_asking_serve_once_the_run_stops(tmp_path, monkeypatch) -> None:
    # a Serve call after the launcher's ray.shutdown() starts a new Ray cluster (auto-init):
    # seen when `serve run` failed under load and a second Ray started as the run exited
    import threading

    from ray import serve

    from deployments.launch import console

    config = tmp_path / "serve.yaml"
    config.write_text("applications:\n  - name: flm\n    import_path: deployments.app:build_app\n")
    stopping = threading.Event()
    calls = []

    def status():
        calls.append(1)
        stopping.set()  # the run stops while the apps are still starting
        raise RuntimeError("Serve's controller is not up")

    monkeypatch.setattr(serve, "status", status)
    monkeypatch.setattr(console, "READY_S", 2.0)
    watch = console.StartWatch(config, 0.0, stopping=stopping)
    assert watch._wait_and_describe() is None
    assert len(calls) == 1
