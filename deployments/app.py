"""build_app: the Serve application of a config (the import path of configs/*.yaml)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import msgspec
from ray.serve.config import RequestRouterConfig

from actors.blas import start_threads
from actors.config import WorkerConfig, worker_config
from actors.deployment import ModelWorker, resolve_device
from actors.keep_alive import keep_alive_seconds
from actors.library_worker import LibraryConfig, library_worker
from deployments.metrics import MetricsHub
from deployments.routing import router_config
from deployments.server import make_ingress

# a deployment's replicas (Serve takes 0 too: a model no request could reach)
Replicas = Annotated[int, msgspec.Meta(ge=1)]


def _check_max_queued(value: int) -> None:
    if value == 0:  # Serve's max_queued_requests: -1 (no limit) or a positive count
        raise ValueError("max_queued must be -1 (no limit) or at least 1")


class ModelEntry(WorkerConfig, kw_only=True, forbid_unknown_fields=True):
    """One served model: its worker (WorkerConfig: name, path, device, batch, streaming;
    LoadOptions: how the model is loaded) and how Serve runs it.

    Attributes:
        replicas: worker replicas (CPU: how many; NPU: usually the NPU count).
        max_queued: requests waiting per replica before the API answers 503.
        prefix_routing: with several replicas and the prefix cache on, send requests that
            share a prefix to the replica that was sent it (Serve's prefix-aware router),
            unless one replica has half a batch more requests than another; off: by load.
    """

    replicas: Replicas = 1
    max_queued: Annotated[int, msgspec.Meta(ge=-1)] = 64
    prefix_routing: bool = True

    def __post_init__(self) -> None:
        _check_max_queued(self.max_queued)


class LibraryEntry(LibraryConfig, kw_only=True, forbid_unknown_fields=True):
    """How the models of `models_dir` are served: one worker deployment for all of them
    (LibraryConfig: each model's worker options, `max_loaded_models` per replica), and

    Attributes:
        replicas: worker replicas (each holds up to max_loaded_models models).
        max_queued: requests waiting per replica before the API answers 503.
        prefix_routing: with several replicas and the prefix cache on, a request goes to a
            replica holding its model (Serve's multiplexing) and, among those, to the one
            that was sent the longest prefix of its text for that model (the prefix-aware
            router keyed by model), unless one has half a batch more requests; off: by load.
    """

    replicas: Replicas = 1
    max_queued: Annotated[int, msgspec.Meta(ge=-1)] = 64
    prefix_routing: bool = True

    def __post_init__(self) -> None:
        _check_max_queued(self.max_queued)


DEFAULT_MODEL = {"name": "smollm2-135m", "path": "smollm2-135m"}
API_KEY_VAR = "FLM_API_KEY"  # api_key's default (README: Configuration)


class AppConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The app's `args:`.

    Attributes:
        models: models served by name, each loaded at start on its own deployment (default:
            smollm2-135m, unless `models_dir` is given).
        models_dir: a folder whose every model (GGUF files, Hugging Face directories) is
            served, loaded on first use (actors.library, actors.library_worker).
        library: how the folder's models are served.
        keep_alive: how long a library model stays loaded after its last request when the
            request does not say (Ollama's `keep_alive`: "5m", seconds, -1 for ever).
        allow_delete: Ollama's /api/delete may delete a library model's GGUF files (off:
            it removes aliases only).
        api_key: the key every API route requires (None: $FLM_API_KEY of the processes
            Ray starts, which the command line's --api-key sets, so that the key is not in
            the args Serve logs; else no key).
    """

    models: list[ModelEntry] | None = None
    models_dir: str | None = None
    library: LibraryEntry = msgspec.field(default_factory=LibraryEntry)
    keep_alive: str | float = "5m"
    allow_delete: bool = False
    api_key: str | None = None
    cors_origins: list[str] = msgspec.field(default_factory=list)
    max_request_bytes: Annotated[int, msgspec.Meta(ge=1)] = 4 << 20
    ingress_replicas: Replicas = 1


# The ingress's handlers only await (no blocking work, no model): run them and its handles'
# router on the replica's own event loop instead of a thread each, two thread hops less
# per request each way (about 1.7 ms of time to first token here, bench/bench_serve.py).
# Workers keep Serve's defaults: a model's load would block their main loop.
# Serve's calls between the ingress and the workers go over gRPC, whose receiving end takes
# at most 4 MiB a message unless told otherwise (RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH):
# 2,048 embeddings of 576 floats are 4.7 MB, a body of max_request_bytes (4 MiB) a little
# more once pickled. Both ends (the ingress receives answers, a worker requests) take 1 GiB.
GRPC_ENV = {"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(1 << 30)}
INGRESS_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
               "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0", **GRPC_ENV}


# Ray's built-in resource of the head node (documented in Ray's resource scheduling guide)
HEAD_NODE = "node:__internal_head__"


def check_args(args: dict[str, Any] | None) -> AppConfig:
    """The app's `args:` typed and checked as far as can be without starting anything (the
    launcher calls it before Serve deploys, so a mistake is one line, not a failed app).

    Raises:
        msgspec.ValidationError: the config is malformed; the message names the key.
    """
    cfg = msgspec.convert(args or {}, AppConfig)
    names = [m.name for m in cfg.models or []]
    for i, name in enumerate(names):
        if name in names[:i]:  # the second would replace the first's worker
            raise msgspec.ValidationError(f"{name!r} is also the name of models"
                                          f"[{names.index(name)}] - at `$.models[{i}].name`")
    if cfg.models_dir is not None:
        _library_config(cfg)
    return cfg


def build_app(args: dict[str, Any] | None = None):
    """The application for `args` (the `args:` of a Serve config).

    Raises:
        msgspec.ValidationError: the config is malformed; the message names the key.
    """
    cfg = check_args(args)
    models = cfg.models if cfg.models is not None else (
        [] if cfg.models_dir else [msgspec.convert(DEFAULT_MODEL, ModelEntry)])
    # every replica's metrics, added up for /metrics; on the head node with the ingress
    hub = MetricsHub.options(name="metrics-hub", ray_actor_options={
        "num_cpus": 0, "resources": {HEAD_NODE: 0.001}}).bind()
    workers = {}
    for m in models:
        device = resolve_device(m.device, m.kernel_dir)
        actor: dict[str, Any] = {"num_cpus": 0}
        if device == "npu":
            actor["resources"] = {"NPU": 1}
        # Ray starts actors with OMP_NUM_THREADS=1, which OpenBLAS obeys: give the worker's
        # BLAS every core at start; the worker then sets the count it wants
        n = str(start_threads(m.blas_threads))
        actor["runtime_env"] = {"env_vars": {**GRPC_ENV, "OPENBLAS_NUM_THREADS": n,
                                             "OMP_NUM_THREADS": n,
                                             "MKL_NUM_THREADS": n}}
        routing = {}
        if m.prefix_cache and m.prefix_routing and m.replicas > 1:  # to the replica with the KV
            routing["request_router_config"] = RequestRouterConfig(**router_config(
                m.max_batch, tree_resources={HEAD_NODE: 0.001}))
        workers[m.name] = ModelWorker.options(
            name=f"worker-{m.name}", num_replicas=m.replicas, max_ongoing_requests=m.max_batch,
            max_queued_requests=m.max_queued, ray_actor_options=actor,
            health_check_period_s=5, health_check_timeout_s=30, **routing,
        ).bind(msgspec.structs.replace(worker_config(m), device=device), metrics_hub=hub)
    settings: dict[str, Any] = {"api_key": cfg.api_key or os.environ.get(API_KEY_VAR) or None,
                                "max_request_bytes": cfg.max_request_bytes}
    library = None
    if cfg.models_dir:
        library = _library(cfg, hub)
        settings["models_dir"] = cfg.models_dir
        settings["allow_delete"] = cfg.allow_delete
    ingress = make_ingress({"cors_origins": cfg.cors_origins})
    # The ingress runs on the head node, where the configs put the HTTP entry (proxy_location
    # HeadOnly): losing another node then loses only its workers, whose streams end with an
    # error event, never the ingress and every stream through it.
    return ingress.options(name="openai-ingress", num_replicas=cfg.ingress_replicas,
                           max_ongoing_requests=1000, health_check_period_s=5,
                           ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE: 0.001},
                                              "runtime_env": {"env_vars": INGRESS_ENV}},
                           ).bind(workers, settings, hub, library)


def _library_config(cfg: AppConfig) -> LibraryConfig:
    """The library's worker options for `cfg.models_dir`.

    Raises:
        msgspec.ValidationError: a keep_alive that is not a duration, a library on NPUs, or
            no room for a model.
    """
    lib = cfg.library
    try:
        keep = keep_alive_seconds(cfg.keep_alive)
    except ValueError as exc:
        raise msgspec.ValidationError(f"{exc} - at `$.keep_alive`") from None
    if resolve_device(lib.device, lib.kernel_dir) != "cpu":
        raise msgspec.ValidationError("a models_dir is served on the CPU for now - at "
                                      "`$.library.device`")
    if lib.max_loaded_models < 1:
        raise msgspec.ValidationError("max_loaded_models must be at least 1 - at "
                                      "`$.library.max_loaded_models`")
    config = LibraryConfig(**{f: getattr(lib, f) for f in LibraryConfig.__struct_fields__})
    config = msgspec.structs.replace(config, models_dir=cfg.models_dir, device="cpu",
                                     keep_alive_s=keep if keep is not None else 300.0)
    return config


def _library(cfg: AppConfig, hub: Any):
    """The library's worker deployment (bound) for `cfg.models_dir`."""
    config = _library_config(cfg)
    lib = cfg.library
    n = str(start_threads(lib.blas_threads))
    actor = {"num_cpus": 0, "runtime_env": {"env_vars": {**GRPC_ENV,
        "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}}}
    # each loaded model batches max_batch sequences; a few more for load, unload and /api/ps
    ongoing = lib.max_batch * lib.max_loaded_models + 4
    routing = {}
    if lib.prefix_cache and lib.prefix_routing and lib.replicas > 1:
        routing["request_router_config"] = RequestRouterConfig(**router_config(
            lib.max_batch, tree_resources={HEAD_NODE: 0.001}))
    return library_worker(lib.max_loaded_models).options(
        name="worker-library", num_replicas=lib.replicas, max_ongoing_requests=ongoing,
        max_queued_requests=lib.max_queued, ray_actor_options=actor,
        health_check_period_s=5, health_check_timeout_s=30, **routing,
    ).bind(config, metrics_hub=hub)
