"""One Ray Serve instance for the whole test run: flm-tiny on two replicas, a random gpt-oss
(harmony format), a random BERT encoder (embeddings only), a random BERT cross-encoder (a
reranker), the default model, and the real stories260K model when ../shared is there; a
secured app (API key, CORS) that also holds a model that cannot load."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.bert_model import build_bert, build_reranker
from tests.gpt_oss_model import build_gpt_oss
from tests.shared import SHARED

STORIES = SHARED / "models" / "stories260K" / "hf-f32"
SECRET = "test-key-123"
# a model on the secured app that cannot load (an architecture the engine does not run)
UNLOADABLE = "no-such-arch"
UNLOADABLE_CONFIG = '{"architectures": ["FooForCausalLM"], "model_type": "foo"}'
RERANKER = "bert-rerank"
# the apps here set their keys themselves: a key in the developer's environment (every
# app's default, deployments.app.API_KEY_VAR) would lock the keyless ones and the servers
# the launch tests and benches start
os.environ.pop("FLM_API_KEY", None)


@pytest.fixture(scope="session")
def reranker_dir(tmp_path_factory) -> Path:
    """The random BERT cross-encoder (BertForSequenceClassification, one label) the app
    serves as RERANKER: its tests score the same folder with transformers."""
    return build_reranker(tmp_path_factory.mktemp("reranker") / "model")


@pytest.fixture(scope="session")
def serve_url(tmp_path_factory, reranker_dir):
    ray = pytest.importorskip("ray")
    from ray import serve

    from deployments.app import build_app
    from deployments.launch.serve_env import free_port, serve_environ
    from npu.engine.cpu_kernels import seed_cache

    # Ray's processes read these at start: serve as `make serve` does (HAProxy ingress)
    os.environ.update(serve_environ(os.environ, private_ports=True))
    cache = str(tmp_path_factory.mktemp("flm-cache"))
    seed_cache(Path(cache))  # the workers load this process's kernel build, not their own
    os.environ["FLM_CACHE"] = cache
    port = free_port()
    ray.init(num_cpus=2, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"FLM_CACHE": cache}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    models = [{"name": "flm-tiny", "path": "flm-tiny", "replicas": 2, "max_batch": 8,
               "max_queued": 48}]
    if STORIES.exists():
        models.append({"name": "stories260k", "path": str(STORIES), "max_batch": 4})
    gpt_oss = tmp_path_factory.mktemp("gpt-oss") / "model"  # random, harmony format
    build_gpt_oss(gpt_oss, Path(cache))
    models.append({"name": "tiny-gpt-oss", "path": str(gpt_oss), "max_batch": 2})
    # drafts sized by a fixed row cost (not timings): the speculative test sees drafts
    models.append({"name": "smollm2-135m", "path": "smollm2-135m", "max_batch": 4,
                   "speculative": {"row_cost": 0.05}})
    bert = build_bert(tmp_path_factory.mktemp("bert") / "model")  # random BERT encoder
    models.append({"name": "bert-tiny", "path": str(bert), "max_batch": 2})
    models.append({"name": RERANKER, "path": str(reranker_dir), "max_batch": 2})
    apps = [serve.RunTarget(build_app({"models": models, "max_request_bytes": 1 << 20}),
                            name="flm", route_prefix="/")]
    # two simulated NPUs: one worker replica each, claiming {"NPU": 1} from Ray
    from npu.load.tiny import tiny_config
    from npu.xrt.sim_kernels import make_kernel_dir

    kernels = make_kernel_dir(tmp_path_factory.mktemp("kernel"), [tiny_config()])
    apps.append(serve.RunTarget(build_app({"models": [
        {"name": "flm-tiny", "path": "flm-tiny", "device": "npu", "replicas": 2, "max_batch": 4,
         "kernel_dir": str(kernels), "simulator_devices": ["RyzenAI-npu4", "RyzenAI-npu4"]}]}),
        name="npu", route_prefix="/npu"))
    # a second app with an API key and CORS, on its own prefix; its flm-tiny worker takes
    # one sequence and queues one more, so the overload test can fill it
    # ... and a model whose architecture the engine does not run (its worker says why)
    unloadable = tmp_path_factory.mktemp("unloadable") / "model"
    unloadable.mkdir()
    (unloadable / "config.json").write_text(UNLOADABLE_CONFIG)
    apps.append(serve.RunTarget(build_app({
        "models": [{"name": "flm-tiny", "path": "flm-tiny", "max_batch": 1, "max_queued": 1},
                   {"name": UNLOADABLE, "path": str(unloadable), "max_batch": 1}],
        "api_key": SECRET, "cors_origins": ["http://example.test"]}),
        name="secured", route_prefix="/secured"))
    serve.run_many(apps)  # the three apps' replicas start together
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    yield url
    serve.shutdown()
    ray.shutdown()


@pytest.fixture()
def client(serve_url):
    with httpx.Client(base_url=serve_url, timeout=120) as c:
        yield c


LIBRARY_PREFIX = "/library"


@pytest.fixture(scope="session")
def library_dir(serve_url, tmp_path_factory) -> Path:
    """A models_dir app on the shared Serve instance (started only when a test asks for it):
    three small random GGUF files of real architectures (flm-tiny's tokenizer and chat
    template), a code model's (the same with Qwen2.5-Coder's FIM tokens, a 4,096-token
    context), a file that is not GGUF, one whose architecture is not served, one whose
    header reads but whose load fails (metadata missing) and one larger than the memory
    budget; at most two models loaded at once."""
    from ray import serve

    from deployments.app import build_app
    from npu.load.loader import DATA
    from npu.load.tiny import ensure_tiny
    from tests.npu.gguf_files import coder_dir, tiny_tokenizer_meta, write_random_gguf

    folder = tmp_path_factory.mktemp("library")
    template = {"tokenizer.chat_template": (DATA / "flm_tiny_chat_template.jinja").read_text()}
    meta = {**tiny_tokenizer_meta(ensure_tiny()), **template}
    coder = {**tiny_tokenizer_meta(coder_dir(tmp_path_factory.mktemp("coder"))), **template}
    for name, arch in (("Llama-Q8_0", "llama"), ("qwen3-tiny", "qwen3"), ("gemma-tiny", "gemma3")):
        write_random_gguf(folder / f"{name}.gguf", arch, tokenizer_meta=meta)
    write_random_gguf(folder / "coder-tiny.gguf", "qwen3", tokenizer_meta=coder, context=4096)
    from gguf import GGMLQuantizationType as QT

    write_random_gguf(folder / "huge.gguf", "llama", QT.F32, tokenizer_meta=meta,
                      dims=(512, 1024, 8, 2, 64, 6))  # about 57 MB
    (folder / "broken.gguf").write_bytes(b"NOT A GGUF FILE" + bytes(100))
    _write_unknown_arch(folder / "mamba.gguf")
    _write_unknown_arch(folder / "hollow.gguf", "llama")  # a Llama header without its metadata
    serve.run(build_app(library_args(folder)), name="library", route_prefix=LIBRARY_PREFIX)
    return folder


def library_args(folder: Path) -> dict:
    """The library app's args (a test that restarts the app runs it again with these)."""
    return {"models_dir": str(folder), "keep_alive": "5m",
            "library": {"max_loaded_models": 2, "max_batch": 4, "memory_budget": 40_000_000}}


def _write_unknown_arch(path: Path, arch: str = "mamba") -> None:
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
