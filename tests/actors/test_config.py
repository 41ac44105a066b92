"""One typed worker config from the app's model entry to load_model: every option is
spelled once (npu.LoadOptions < actors.WorkerConfig < deployments' ModelEntry) and arrives
where it is used."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from actors.config import WorkerConfig, worker_config
from deployments.app import AppConfig, ModelEntry
from npu import LoadOptions, load_model
from npu.engine.cpu_kernels import KernelUnavailable, kernels
from npu.errors import ModelError

ENTRY = {"name": "t", "path": "flm-tiny", "device": "cpu", "max_batch": 3, "blas_threads": 1,
         "stream_interval_ms": 5.0, "max_messages_per_s": 7.0, "kv_cache_bytes": 1 << 22,
         "prefix_cache": False, "npu_mode": "layer", "backend": "reference", "replicas": 2,
         "max_queued": 9, "prefix_routing": False}


def test_the_model_entry_is_the_worker_config_and_the_load_options() -> None:
    entry = msgspec.convert({"models": [ENTRY]}, AppConfig).models[0]
    worker = worker_config(entry)
    assert type(worker) is WorkerConfig
    assert msgspec.to_builtins(worker) == {k: v for k, v in msgspec.to_builtins(entry).items()
                                           if k in WorkerConfig.__struct_fields__}
    options = worker.options()
    assert type(options) is LoadOptions
    assert (options.kv_cache_bytes, options.prefix_cache, options.npu_mode,
            options.backend) == (1 << 22, False, "layer", "reference")
    # the fields of each level, once: the entry adds Serve's, the worker config its own
    assert set(LoadOptions.__struct_fields__) < set(WorkerConfig.__struct_fields__) \
        < set(ModelEntry.__struct_fields__)


def test_the_options_reach_the_loaded_model() -> None:
    options = worker_config(msgspec.convert(ENTRY, ModelEntry)).options()
    model = load_model("flm-tiny", "cpu", options)
    assert model.engine.prefix_cache is False
    assert model.engine.kv.max_blocks * model.engine.kv.block_bytes <= 1 << 22
    on = load_model("flm-tiny", "cpu", options, prefix_cache=True)  # a field over the options
    assert on.engine.prefix_cache is True
    with pytest.raises(TypeError):
        load_model("flm-tiny", "cpu", options, no_such_option=1)


def test_the_kv_cache_type_reaches_the_cache() -> None:
    entry = msgspec.convert({**ENTRY, "backend": "cpu", "quantize": "q8_0",
                             "kv_cache_type": "q8_0"}, ModelEntry)
    options = worker_config(entry).options()
    assert options.kv_cache_type == "q8_0"
    try:
        kernels()
    except KernelUnavailable:  # no C compiler here: the format is the kernels', and it says so
        with pytest.raises(ModelError, match="q8_0 needs .* the compiled CPU kernels"):
            load_model("flm-tiny", "cpu", options)
        return
    assert load_model("flm-tiny", "cpu", options).engine.kv.dtype == np.uint8


@pytest.mark.parametrize("bad,where", [({"bogus": 1}, "bogus"),
                                       ({"kv_cache_bytes": 5}, "kv_cache_bytes"),
                                       ({"npu_mode": "fast"}, "npu_mode"),
                                       ({"kv_cache_type": "q4_0"}, "kv_cache_type")])
def test_a_bad_option_is_named(bad: dict, where: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=where):
        msgspec.convert({"models": [{**ENTRY, **bad}]}, AppConfig)
