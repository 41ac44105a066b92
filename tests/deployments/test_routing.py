"""What the prefix-aware router matches of a worker request (no Ray cluster needed)."""

from __future__ import annotations

from types import SimpleNamespace

from actors.events import ChatGenerate, CompletionGenerate, GenerateRequest
from deployments.routing import PrefixRouter, router_config, routing_text

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _text(req: GenerateRequest) -> str:
    router = PrefixRouter.__new__(PrefixRouter)  # its text reading needs no state
    return router._extract_text_from_request(SimpleNamespace(args=(req,), kwargs={}))


def test_a_chat_request_is_matched_by_its_tools_then_its_messages() -> None:
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    plain = _text(ChatGenerate(request_id="a", messages=msgs))
    with_tools = _text(ChatGenerate(request_id="b", messages=msgs, tools=TOOLS))
    assert plain == "Be brief.Hi"
    assert with_tools.endswith(plain) and '"name":"f"' in with_tools
    # the next turn starts with the same text: its match is the whole earlier request
    longer = msgs + [{"role": "assistant", "content": "Hello."}]
    assert _text(ChatGenerate(request_id="c", messages=longer)).startswith(plain)


def test_completions_match_their_prompt_and_nothing_is_empty() -> None:
    assert _text(CompletionGenerate(request_id="a", prompt="abc")) == "abc"
    assert _text(CompletionGenerate(request_id="b", prompt="")) == " "
    assert _text(ChatGenerate(request_id="c", messages=[])) == " "
    router = PrefixRouter.__new__(PrefixRouter)
    assert router._extract_text_from_request(SimpleNamespace(args=("x",), kwargs={})) == " "
    assert routing_text(CompletionGenerate(request_id="d", prompt="p"),
                        str) == "p"
    # llama-server's mixed prompt: its parts in order (the same parts, the same text)
    mixed = CompletionGenerate(request_id="e", prompt_parts=["Hi", 5, " there"])
    assert routing_text(mixed, str) == "Hi 5  there"
    assert routing_text(CompletionGenerate(request_id="f", prompt_parts=[]), str) == " "


def test_affinity_gives_way_to_load_at_half_a_batch() -> None:
    cfg = router_config(8)
    assert cfg["request_router_class"] == "deployments.routing:PrefixRouter"
    assert cfg["request_router_kwargs"]["imbalanced_threshold"] == 4
    assert router_config(1)["request_router_kwargs"]["imbalanced_threshold"] == 1


def test_a_kv_budget_below_a_mebibyte_is_refused_by_name() -> None:
    import msgspec
    import pytest

    from deployments.app import ModelEntry

    entry = msgspec.convert({"name": "m", "path": "p", "kv_cache_bytes": 1 << 30}, ModelEntry)
    assert entry.kv_cache_bytes == 1 << 30 and entry.prefix_cache and entry.prefix_routing
    with pytest.raises(msgspec.ValidationError, match="kv_cache_bytes"):
        msgspec.convert({"name": "m", "path": "p", "kv_cache_bytes": 4096}, ModelEntry)


def test_a_library_request_is_keyed_by_its_model_so_models_never_share_a_prefix() -> None:
    router = PrefixRouter.__new__(PrefixRouter)

    def text(model: str, req: GenerateRequest) -> str:
        pending = SimpleNamespace(args=(req, None), kwargs={},
                                  metadata=SimpleNamespace(multiplexed_model_id=model))
        return router._extract_text_from_request(pending)

    req = ChatGenerate(request_id="a", messages=[{"role": "user", "content": "Hi"}])
    a, b = text("qwen3", req), text("llama", req)
    assert a == "qwen3\0Hi" and b == "llama\0Hi"
    assert not a.startswith(b[:len("llama") + 1]) and not b.startswith("qwen3")
    assert text("", req) == "Hi"  # a deployment of one model: the text alone
    # the next turn on the same model still starts with the earlier request's key
    longer = ChatGenerate(request_id="b", messages=[{"role": "user", "content": "Hi"},
                                                    {"role": "assistant", "content": "Yo"}])
    assert text("qwen3", longer).startswith(a)


def test_a_library_of_several_replicas_routes_by_model_and_prefix() -> None:
    from deployments.app import build_app

    def router(args: dict) -> object:
        app = build_app(args)
        library = app._bound_deployment.init_args[3]  # (workers, settings, hub, library)
        return library._bound_deployment._deployment_config.request_router_config

    one = router({"models_dir": "/tmp/none", "library": {"replicas": 1}})
    two = router({"models_dir": "/tmp/none", "library": {"replicas": 2}})
    off = router({"models_dir": "/tmp/none",
                  "library": {"replicas": 2, "prefix_routing": False}})
    assert two.request_router_class == "deployments.routing:PrefixRouter"
    assert "PrefixRouter" not in one.request_router_class
    assert "PrefixRouter" not in off.request_router_class
