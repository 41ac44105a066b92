"""The import graph of the packages: arrows point one way (ARCHITECTURE.md's layering) and
no module imports another that imports it back, even lazily inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("chat", "npu", "actors", "deployments")
# what each package may import of the others
ALLOWED = {"chat": set(), "npu": set(), "actors": {"chat", "npu"},
           "deployments": {"actors", "chat"}}
# inside deployments/, by folder (a top-level module is its own room): the shared request
# path below the API surfaces, each surface a folder that reaches no other (but OpenAI's,
# whose requests and replies Ollama's and Responses' are translated to), the server and the
# app above them, the launcher apart (it starts processes; configs name the app by path)
CORE = {"deployments.access", "deployments.body", "deployments.errors", "deployments.exchange",
        "deployments.ingress", "deployments.library", "deployments.metrics",
        "deployments.prefill", "deployments.routing"}
SURFACES = {"deployments.openai", "deployments.responses", "deployments.ollama",
            "deployments.embeddings", "deployments.anthropic", "deployments.page",
            "deployments.tokenize", "deployments.rerank", "deployments.llama_server"}
# inside npu/, by folder: the model's config and the loaded Model at the top, shared by the
# three jobs below them; the engine under the NPU's (whose engine extends the CPU's); loading
# over both (it makes their engines); none of them reaches back up
NPU_BASE = {"npu.errors", "npu.paths", "npu.config", "npu.sampler"}
NPU = {
    **{m: NPU_BASE for m in NPU_BASE},
    "npu.model": NPU_BASE | {"npu.engine"},  # the Engine protocol it holds
    "npu.engine": NPU_BASE,
    "npu.xrt": NPU_BASE | {"npu.engine"},
    "npu.load": NPU_BASE | {"npu.model", "npu.engine", "npu.xrt"},
}
DEPLOYMENTS = {
    **{c: CORE for c in CORE},
    "deployments.openai": CORE,
    "deployments.responses": CORE | {"deployments.openai"},
    "deployments.ollama": CORE | {"deployments.openai"},
    "deployments.anthropic": CORE,
    # Ollama's embedding shape: its model names and options
    "deployments.embeddings": CORE | {"deployments.ollama"},
    # the chat page (its `/` answers Ollama's clients as Ollama's route does)
    "deployments.page": CORE | {"deployments.ollama"},
    # a conversation typed as OpenAI's chat completions types it (its count is theirs)
    "deployments.tokenize": CORE | {"deployments.openai"},
    # a reranker's scores (a request of its own: no other surface's)
    "deployments.rerank": CORE,
    # llama-server's own completions, typed as OpenAI's completions type them
    "deployments.llama_server": CORE | {"deployments.openai"},
    "deployments.server": CORE | SURFACES,
    "deployments.app": CORE | {"deployments.server"},
    "deployments.launch": set(),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names)
        # an import of a package or of a name inside a module is an edge to that module
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _runtime_nodes(tree: ast.AST):
    """Every node that runs: all of them but the bodies of `if TYPE_CHECKING:` (imports
    for annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _graph()
    # a package's __init__ re-exports its modules; the edges that matter are module to module
    graph = {m: {t for t in ts if t not in PACKAGES} for m, ts in graph.items()}
    assert _cycles(graph) == []


def test_packages_import_only_what_lies_below_them() -> None:
    bad = sorted(f"{m} -> {t}" for m, ts in _graph().items() for t in ts
                 if t.split(".")[0] != m.split(".")[0]
                 and t.split(".")[0] not in ALLOWED[m.split(".")[0]])
    assert bad == []


def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _folder_arrows(package: str, table: dict[str, set[str]]) -> list[str]:
    """Inside `package`, the imports from one folder (or top-level module) to another that
    `table` does not allow; a folder the table does not know is one too."""
    graph = _graph()
    inside = {m: ts for m, ts in graph.items() if m.startswith(package + ".")}
    unknown = sorted({_room(m) for m in inside} - set(table))
    return unknown + sorted(f"{m} -> {t}" for m, ts in inside.items() for t in ts
                            if t.startswith(package + ".") and _room(t) != _room(m)
                            and _room(t) not in table[_room(m)])


@pytest.mark.parametrize("package,table", [("deployments", DEPLOYMENTS), ("npu", NPU)])
def test_folders_import_only_what_lies_below_them(package: str, table: dict) -> None:
    """deployments/: the request path below every API surface, surfaces apart, the
    launcher apart. npu/: config and Model on top of the engine, the NPU and loading; no
    folder circles."""
    assert _folder_arrows(package, table) == []


def test_actors_use_an_engine_only_through_the_engine_protocol() -> None:
    """Every `<...>.engine.<member>` in actors/ is a member of npu.engine.protocol.Engine."""
    from npu.engine.protocol import Engine

    members = {n for n in dir(Engine) if not n.startswith("_")}
    used = set()
    for path in (ROOT / "actors").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and (
                    getattr(node.value, "attr", None) == "engine"
                    or getattr(node.value, "id", None) == "engine"):
                used.add(node.attr)
    assert used and used <= members, used - members
