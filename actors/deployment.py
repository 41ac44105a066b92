"""ModelWorker: the Ray Serve deployment around a `Worker`, one replica per device.

On NPU hosts a replica asks for `{"NPU": 1}` and learns its device index from Ray's
accelerator ids; CPU replicas need no claim. Serve's router balances requests across the
replicas, `max_ongoing_requests` is the batch one worker decodes together, and the health
check fails once the worker's decode loop has died (Serve then restarts the replica). A
model that cannot load is a replica that answers why (see ModelWorker).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator

from ray import serve

from actors.blas import blas_threads_for, set_blas_threads
from actors.config import WorkerConfig
from actors.events import Accepted, ChatGenerate, Event, GenerateRequest, Rejected
from actors.library import gguf_quantization, path_digest
from actors.rerank import is_reranker
from actors.worker import Worker
from chat import FormatKind
from npu import ModelError

log = logging.getLogger(__name__)


def resolve_device(device: str, kernel_dir: str | None) -> str:
    """"auto": "npu" when pyxrt sees an NPU (and there is a kernel directory), else "cpu";
    "cpu" and "npu" as they are."""
    if device != "auto":
        return device
    if not kernel_dir:
        return "cpu"
    try:
        from npu.xrt import XRT

        return "npu" if XRT().enumerate_devices() else "cpu"
    except Exception:  # no pyxrt, no driver
        return "cpu"


def npus_seen() -> int:
    """The NPUs pyxrt sees on this machine (0 without pyxrt or its driver)."""
    try:
        from npu.xrt import XRT

        return len(XRT().enumerate_devices())
    except Exception:  # no pyxrt, no driver
        return 0


def device_index(device: str) -> int | None:
    """This replica's NPU index from Ray (None on CPU)."""
    if device != "npu":
        return None
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get("NPU") or []
    return int(ids[0]) if ids else None


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def load_failure(name: str, path: str, exc: BaseException) -> str:
    """One line on a model that could not load: its name, its path and why."""
    reason = str(exc) if isinstance(exc, ModelError) else f"{type(exc).__name__}: {exc}"
    return f"The model '{name}' could not be loaded from {path}: {reason}"


@serve.deployment
class ModelWorker:
    """One model's worker on one device. A model that cannot load leaves the replica up
    and "unavailable": its info says why, every request is refused with that reason (500,
    code "model_unavailable"), and its health check passes, so Serve does not restart it
    over and over (a restart would fail the same way)."""

    def __init__(self, config: WorkerConfig, metrics_hub=None):
        from npu import load_model

        self.name = name = config.name
        self.path = config.path
        self.device = config.device
        device = config.device
        index = device_index(device)
        self.index = index
        options = config.options()
        if device == "npu":
            def factory():  # pyxrt opened here: its absence is the model's failure (below)
                from npu.xrt import XRT

                if config.simulator_devices:  # testing: the simulator stands in for the driver
                    from npu.xrt.sim_kernels import simulator_for

                    xrt = XRT(simulator_for(config.kernel_dir, config.simulator_devices))
                else:
                    xrt = XRT()
                return load_model(config.path, "npu", options, name=name,
                                  device_index=index or 0, xrt=xrt)
        else:
            def factory():
                return load_model(config.path, "cpu", options, name=name)
        replica = getattr(serve.get_replica_context(), "replica_id", None)
        self.replica = str(getattr(replica, "unique_id", replica))
        self.metrics_hub = metrics_hub
        self.failure: str | None = None
        self.started = time.time()
        try:
            self.worker: Worker | None = Worker(
                factory, max_batch=config.max_batch,
                stream_interval_s=config.stream_interval_ms / 1000,
                max_messages_per_s=config.max_messages_per_s,
                speculation=config.speculative)
        except Exception as exc:  # the replica stays up, answering why (not restarted)
            self.worker = None
            self.failure = load_failure(name, config.path, exc)
            log.error("%s", self.failure)
            return
        engine = self.worker.model.engine
        # what /v1/models and Ollama's listings show of the weights (fixed: read once)
        self.weights = {"weight_bytes": engine.weight_bytes, **engine.weight_summary()}
        file_type = gguf_quantization(self.worker.model.path)  # a GGUF file's own name
        if file_type:
            self.weights["quantization"] = file_type
        self.weights["digest"] = path_digest(self.worker.model.path)  # Ollama's listings
        threads = blas_threads_for(self.weights["weight_bytes"], config.blas_threads)
        set_blas_threads(threads)
        engine.set_threads(threads)  # the compiled CPU kernels' threads
        if device == "npu":
            self.kernels = "NPU"
        else:
            from npu.engine.cpu_kernels import kernel_path

            self.kernels = kernel_path()
        log.info("worker for %s on %s%s ready (%d BLAS threads)", name, device,
                 f" #{index}" if index is not None else "", threads)

    def unavailable(self) -> Rejected:
        """What every request gets from a worker whose model could not load."""
        return Rejected(status=500, message=self.failure or "", type="server_error",
                        param="model", code="model_unavailable")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[list[Event]]:
        if self.worker is None:
            yield [self.unavailable()]
            return
        async for batch in self.worker.generate(request):
            yield batch

    async def count_tokens(self, request: ChatGenerate) -> Accepted | Rejected:
        """The prompt tokens of a chat request (Anthropic's count_tokens), counted by the
        model's own template and tokenizer; nothing is scheduled."""
        if self.worker is None:
            return self.unavailable()
        return await self.worker.count_tokens(request)

    async def info(self, template: bool = False) -> dict:
        """The model and this replica: what /v1/models, Ollama's /api/show and /api/ps
        show (`template`: with the chat template's source) and the load figures."""
        import ray

        if self.worker is None:
            return {"id": self.name, "created": int(self.started), "status": "unavailable",
                    "error": self.failure, "path": self.path, "replica": self.replica}
        m = self.worker.model
        spec = self.worker.spec
        capabilities = (["completion"] if m.generates else ["rerank"] if is_reranker(m)
                        else ["embedding"])
        if (m.generates and self.worker.tool_spec.kind is not FormatKind.CONTENT_ONLY
                and m.tools_enabled()):
            capabilities.append("tools")
        if m.fim is not None:  # Ollama's name for fill-in-the-middle (`suffix`, /infill)
            capabilities.append("insert")
        if m.generates and spec.reasoning:
            capabilities.append("thinking")
        extra = {"template": m.chat_template_source} if template else {}
        return {"id": self.name, "created": int(self.worker.started),
                "context_length": m.context_length, "format": spec.kind.value,
                "architecture": m.config.arch, "capabilities": capabilities,
                "embedding_length": m.embedding_dims, "pooling": m.pooling,
                "file_format": "gguf" if m.path.suffix == ".gguf" else "safetensors",
                "path": str(m.path), "device": self.device, "kernels": self.kernels,
                "max_batch": self.worker.max_batch,
                **self.weights, **extra,
                "active": self.worker.active, "requests": self.worker.requests,
                "device_index": self.index,
                "replica": self.replica,
                "actor": ray.get_runtime_context().get_actor_name(),
                "node": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid(), "rss_bytes": _rss_bytes(), **m.engine.kv_usage()}

    def check_health(self) -> None:
        if self.worker is None:  # healthy as a failed model: restarting cannot load it
            return
        if not self.worker.healthy:
            raise RuntimeError(f"the decode loop has failed: {self.worker.error!r}")
        self.worker.model.engine.check_device()
        if self.metrics_hub is not None:  # not awaited: a slow hub never fails a check
            self.metrics_hub.push.remote(self.replica,
                                         self.worker.metrics_snapshot(self.replica))
