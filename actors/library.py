"""Library: the models a folder holds, by Ollama-style name, with what their headers say.

Every GGUF file under the folder (split files `NAME-00001-of-0000N.gguf` as one model) and
every Hugging Face model directory (`config.json` and `*.safetensors`) is a model. Names are
lower-case file or folder names without `.gguf`; a sub-folder that is not a model directory
gives its GGUF files tags (`qwen3/8b-q4_k_m.gguf` is `qwen3:8b-q4_k_m`); `name` and
`name:latest` are one model. A scan reads headers only (a GGUF file's metadata, a
safetensors file's JSON header) and keeps each model's facts until one of its files changes
size or modification time, so listing a folder of large files again costs a `stat` each.
A file that cannot be read is still listed, with `error` saying why (loading it is then a
clear error naming the file, and the other models are unaffected).

The digest is sha256 over each file's name, size and first and last 1 MiB: it changes when
a file is replaced, and needs no full read of a 5 GB file (it is not Ollama's blob digest).
No Ray here: the ingress lists with it, the library worker loads from it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from actors.aliases import Alias, AliasStore
from actors.errors import RequestError
from actors.go_template import GoTemplateError, is_go_template, jinja_from_go
from chat import detect_format
from npu.load.fim import fim_tokens, vocabulary_fim
from npu.load.gguf import ARCHITECTURES
from npu.load.gguf_header import read_header
from npu.load.gguf_tokenizer import TOKENIZER_MODELS

log = logging.getLogger(__name__)

LATEST = "latest"
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})$")
SAMPLE = 1 << 20  # bytes hashed at each end of a file for its digest
# GGUF's general.file_type values (llama.cpp's LLAMA_FTYPE_*) -> Ollama's quantization_level
def _file_type_name(ftype: object) -> str | None:
    """`general.file_type` as llama.cpp and Ollama name it (15: Q4_K_M, 30: IQ4_XS, 38:
    MXFP4_MOE); None for a value gguf-py does not know, or not an integer."""
    from gguf import LlamaFileType

    if not isinstance(ftype, int) or isinstance(ftype, bool):
        return None
    try:
        name = LlamaFileType(ftype).name
    except ValueError:
        return None
    if name == "GUESSED":
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


class LibraryModel(msgspec.Struct, frozen=True, kw_only=True):
    """One model of the library.

    Attributes:
        name: its id (lower-case, no `:latest`).
        path: what `load_model` takes: the GGUF file (the first of split files) or the
            model directory.
        files: every file of the model (split parts, config and shards).
        format: "gguf" or "safetensors".
        size: bytes of all its files.
        modified: the newest file's modification time (seconds since the epoch).
        digest: "sha256:" + hex, from names, sizes and the files' ends (see the module).
        family: the architecture (`general.architecture`, or config.json's `model_type`).
        parameters: the weights' values (from the tensor shapes).
        quantization: the file type (Q4_K_M, Q8_0, ...) or the dtype of most weights.
        context_length: the trained context (None: not stated).
        chat_template: the template the model carries ("" when none).
        tool_template: its template for conversations with tools, where it has one of its
            own (a GGUF file's `tokenizer.chat_template.tool_use`, a directory's "tool_use").
        capability: what it serves, read from its header: "completion" (a decoder),
            "embedding" (an encoder) or "rerank" (a reranker: a GGUF file with pooling_type
            4 or a cls.output head, a sequence classifier's config.json).
        insert: a decoder whose vocabulary has FIM tokens (fill-in-the-middle): a GGUF
            file's header, a directory's tokenizer.json.
        error: why the model cannot be read ("" when it can).
        alias_of: for an alias (/api/copy), the model it stands for ("" otherwise).
        system: a variant's system prompt (/api/create; None: the request's own).
        options: a variant's Modelfile parameters (defaults of its requests).
        template: a variant's own Jinja chat template (/api/create; None: the file's,
            `chat_template`, which then shows this one).
        license: a variant's license text (/api/create's; "" none).
    """

    name: str
    path: str
    files: tuple[str, ...]
    format: str
    size: int
    modified: float
    digest: str
    family: str = ""
    parameters: int = 0
    quantization: str = ""
    context_length: int | None = None
    chat_template: str = ""
    tool_template: str = ""
    capability: str = "completion"
    insert: bool = False
    error: str = ""
    alias_of: str = ""
    system: str | None = None
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    template: str | None = None
    license: str = ""

    def capabilities(self) -> list[str]:
        """What the model serves, as Ollama lists it, from its header: its capability, then
        "tools" where its templates mention them, "insert" (FIM), "thinking" where its
        template's format lets it reason (the chat format detected from the template alone:
        the vocabulary is not read here)."""
        caps = [self.capability]
        chat = self.capability == "completion"
        if chat and "tools" in self.chat_template + self.tool_template:
            caps.append("tools")
        if self.insert:
            caps.append("insert")
        if chat:
            spec = detect_format(self.chat_template, lambda _: False)
            if spec.reasoning or spec.thinking_switch:
                caps.append("thinking")
        return caps

    def info(self) -> dict[str, Any]:
        """The model as the APIs' listings read a model description (see ModelWorker.info)."""
        return {"id": self.name, "created": int(self.modified), "path": self.path,
                "architecture": self.family,
                "parameters": self.parameters, "quantization": self.quantization,
                "context_length": self.context_length, "file_format": self.format,
                "weight_bytes": self.size, "digest": self.digest, "library": True,
                "capabilities": self.capabilities(),
                **({"alias_of": self.alias_of} if self.alias_of else {}),
                **({"license": self.license} if self.license else {}),
                **({"error": self.error} if self.error else {})}


SAMPLE_CHAT = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
               {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]


def variant_template(source: str) -> str:
    """The Jinja chat template a variant renders with: Ollama's Go template translated
    (actors.go_template), or a Jinja chat template as it is; checked by rendering a short
    conversation.

    Raises:
        RequestError: 400 (param `template`) saying why it cannot be used.
    """
    from npu import ChatTemplate, ModelError

    try:
        jinja = jinja_from_go(source) if is_go_template(source) else source
        ChatTemplate(jinja).render(SAMPLE_CHAT)
    except (GoTemplateError, ModelError) as exc:
        raise RequestError(f"The template cannot be used: {exc}", param="template",
                           code="invalid_template") from None
    return jinja


def model_key(name: str) -> str:
    """The id a client's model name means: lower-case, the tag `latest` dropped
    (`Qwen3:latest` -> `qwen3`; `qwen3:8b` stays)."""
    key = name.strip().lower()
    return key[: -len(LATEST) - 1] if key.endswith(":" + LATEST) else key


def _clean(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-") or "model"


def _stamp(files: list[Path]) -> tuple:
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f), st.st_size, st.st_mtime_ns))
    return tuple(out)


def path_digest(path: Path) -> str:
    """The digest of a served file, or of a folder's files (a Hugging Face directory):
    `_digest`'s, as the library's models have ("" when it cannot be read)."""
    try:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        return _digest(files)
    except OSError:
        return ""


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(SAMPLE))
            if size > SAMPLE:
                fh.seek(max(SAMPLE, size - SAMPLE))
                h.update(fh.read(SAMPLE))
    return "sha256:" + h.hexdigest()


def gguf_quantization(path: Path) -> str | None:
    """A GGUF model's type as llama.cpp and Ollama name it (`general.file_type`: Q4_K_M,
    ...); None where the path is not a GGUF model or its file does not say. For a configured
    model's listings: the engine's own view is the formats it holds (a Q4_K_M file's
    Q4_1, its Q5_0 embedding), not the name users know the file by."""
    from npu.load.loader import find_gguf

    try:
        file = find_gguf(Path(path))
        ftype = read_header(file).meta.get("general.file_type") if file else None
    except Exception:  # listings only: the model itself loaded, or says why not
        return None
    return _file_type_name(ftype)


def _gguf_facts(files: list[Path]) -> dict[str, Any]:
    header = read_header(files[0])
    meta = header.meta
    arch = str(meta.get("general.architecture", ""))
    tensors = list(header.tensors)
    for part in files[1:]:  # split files: each part holds its own tensor table
        tensors += read_header(part).tensors
    params = sum(_product(t.shape) for t in tensors)
    ftype = meta.get("general.file_type")
    quant = _file_type_name(ftype)
    if quant is None:  # the type holding most of the matrices' bytes
        by_type: Counter = Counter()
        for t in tensors:
            if len(t.shape) == 2:
                by_type[t.tensor_type] += t.n_bytes
        quant = _type_name(by_type.most_common(1)[0][0]) if by_type else ""
    if arch not in ARCHITECTURES:  # as the load would say: listed as unavailable, not ready
        raise ValueError(f"its architecture {arch!r} is not supported (supported: "
                         f"{', '.join(sorted(ARCHITECTURES))})")
    tokenizer = meta.get("tokenizer.ggml.model")
    if tokenizer is not None and tokenizer not in TOKENIZER_MODELS:  # as the load would say
        raise ValueError(f"its tokenizer model {tokenizer!r} is not supported (supported: "
                         f"{', '.join(TOKENIZER_MODELS)})")
    ctx = meta.get(f"{arch}.context_length")
    template = meta.get("tokenizer.chat_template")
    tool_template = meta.get("tokenizer.chat_template.tool_use")
    capability = _gguf_capability(meta, arch, {t.name for t in tensors})
    tokens = meta.get("tokenizer.ggml.tokens") or []
    return {"family": arch, "parameters": params, "quantization": quant,
            "context_length": int(ctx) if isinstance(ctx, int) else None,
            "chat_template": template if isinstance(template, str) else "",
            "tool_template": tool_template if isinstance(tool_template, str) else "",
            "capability": capability,
            "insert": capability == "completion" and vocabulary_fim(tokens, meta) is not None}


def _gguf_capability(meta: dict[str, Any], arch: str, names: set[str]) -> str:
    """What a GGUF file serves, by npu.load.pooling's rule at load: a reranker (pooling type
    4, or none named and llama.cpp's classification head there), else an encoder's
    embeddings, else chat."""
    from npu.load.gguf import ENCODERS

    pooling = meta.get(f"{arch}.pooling_type")
    head = "cls.output.weight" in names or (arch in ENCODERS and "cls.weight" in names)
    if pooling == 4 or (pooling in (None, 0) and head):
        return "rerank"
    return "embedding" if arch in ENCODERS else "completion"


def _type_name(tensor_type: int) -> str:
    from gguf import GGMLQuantizationType as QT

    try:
        return QT(tensor_type).name
    except ValueError:
        return str(tensor_type)


def _product(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path.name} is too short to be a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > 100_000_000:
            raise ValueError(f"{path.name} is not a safetensors file")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def _hf_facts(folder: Path, shards: list[Path]) -> dict[str, Any]:
    if not shards:
        raise ValueError("no *.safetensors weights beside config.json")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    params, dtypes = 0, Counter()
    for shard in shards:
        for entry in _safetensors_header(shard).values():
            n = _product(tuple(entry["shape"]))
            params += n
            dtypes[entry["dtype"]] += n
    from npu.load.loader import template_sources
    from npu.load.pooling import encoder_config

    # a RoBERTa classifier's context is its position rows less those it skips (as it loads)
    ctx = encoder_config(config).get("max_position_embeddings") or \
        text.get("max_position_embeddings")
    try:
        tok_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, or unreadable: the load says so
        tok_config = {}
    templates = template_sources(folder, tok_config if isinstance(tok_config, dict) else {})
    capability = _hf_capability(config)
    return {"family": str(config.get("model_type") or text.get("model_type") or ""),
            "parameters": params,
            "quantization": dtypes.most_common(1)[0][0] if dtypes else "",
            "context_length": int(ctx) if isinstance(ctx, int) else None,
            "chat_template": templates.get("default", ""),
            "tool_template": templates.get("tool_use", ""),
            "capability": capability,
            "insert": capability == "completion" and _hf_fim(folder)}


def _hf_fim(folder: Path) -> bool:
    """Whether a directory's tokenizer.json has FIM tokens (in its vocabulary or its added
    tokens, where the load's tokenizer finds them); none, or unreadable: no."""
    try:
        tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = tok["model"]["vocab"]  # BPE's {piece: id}, Unigram's [[piece, score]]
        ids = dict(vocab) if isinstance(vocab, dict) else {v[0]: i for i, v in enumerate(vocab)}
        ids.update((t["content"], t["id"]) for t in tok.get("added_tokens") or [])
    except (OSError, ValueError, LookupError, TypeError, AttributeError):
        return False
    size = max((i for i in ids.values() if isinstance(i, int)), default=-1) + 1
    return fim_tokens(ids.get, size) is not None


def _hf_capability(config: dict[str, Any]) -> str:
    """What a Hugging Face directory serves, as npu.load reads its config.json (a decoder
    reranker's directory needs a model entry's `rerank`: a library has none)."""
    from npu.config import ENCODER_ARCHITECTURES, architectures_of
    from npu.load.pooling import classifier_of

    if classifier_of(config) is not None:
        return "rerank"
    archs = architectures_of(config)
    return "embedding" if any(a in ENCODER_ARCHITECTURES for a in archs) else "completion"


class _Found(msgspec.Struct, frozen=True):
    name: str
    format: str
    path: Path
    files: list[Path]


def gguf_problem(path: Path) -> str | None:
    """Why the GGUF file `path` (a split file's first part) cannot be served, as a models
    folder lists it from its header (cut short, an architecture or tokenizer not run here);
    None when its header reads as one that can."""
    try:
        _gguf_facts([path])
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        return f"{path.name}: cannot be read ({exc})"
    return None


def _gguf_groups(folder: Path, tag_of: str | None) -> list[_Found]:
    """The GGUF models of one folder (split parts grouped); `tag_of`: the sub-folder's name
    when these are tags of it."""
    singles, parts = [], {}
    for f in sorted(folder.iterdir()):
        if not f.is_file() or f.suffix.lower() != ".gguf" or f.name.startswith("."):
            continue
        m = SPLIT.match(f.stem)
        if m:
            parts.setdefault((m["stem"], m["count"]), []).append(f)
        else:
            singles.append((f.stem, [f]))
    for (stem, _count), files in parts.items():
        singles.append((stem, sorted(files)))
    out = []
    for stem, files in singles:
        name = f"{_clean(tag_of)}:{_clean(stem)}" if tag_of else _clean(stem)
        out.append(_Found(model_key(name), "gguf", files[0], files))  # qwen3/latest.gguf: qwen3
    return out


def _hf_files(folder: Path) -> list[Path]:
    return [folder / "config.json", *sorted(folder.glob("*.safetensors"))]


def find_models(root: Path) -> list[_Found]:
    """The models under `root` (not read: names, kinds and files only)."""
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if (entry / "config.json").is_file():
                found.append(_Found(_clean(entry.name), "safetensors", entry,
                                    _hf_files(entry)))
            else:
                found += _gguf_groups(entry, entry.name)
    found += _gguf_groups(root, None)
    return found


class Library:
    """A folder's models, rescanned on each `models()` (headers read only for new or
    changed files).

    Args:
        root: the folder (a missing one is an empty library, logged once).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self._cache: dict[str, tuple[tuple, LibraryModel]] = {}
        self.conflicts: list[str] = []
        self.aliases = AliasStore(self.root)

    def models(self) -> dict[str, LibraryModel]:
        """Every model of the folder now, by name (sorted)."""
        try:
            found = find_models(self.root)
        except OSError as exc:
            log.warning("models_dir %s cannot be read: %s", self.root, exc)
            return {}
        out: dict[str, LibraryModel] = {}
        cache: dict[str, tuple[tuple, LibraryModel]] = {}
        self.conflicts = []
        for f in found:
            if f.name in out:  # two files, one name: the first (by path) wins
                self.conflicts.append(f"{f.path} (the name {f.name} is {out[f.name].path}'s)")
                continue
            try:
                stamp = _stamp(f.files)
            except OSError:  # gone between the listing and the stat
                continue
            key = str(f.path)
            held = self._cache.get(key)
            model = held[1] if held and held[0] == stamp else self._read(f)
            cache[key] = (stamp, model)
            out[f.name] = model
        self._cache = cache
        for alias, a in self.aliases.read().items():  # a file's own name comes first
            if a.model in out and alias not in out and not out[a.model].alias_of:
                base = out[a.model]
                out[alias] = msgspec.structs.replace(
                    base, name=alias, alias_of=a.model, system=a.system,
                    options=dict(a.parameters), template=a.template, license=a.license or "",
                    modified=a.created if a.created is not None else base.modified,
                    chat_template=a.template if a.template is not None else base.chat_template,
                    # a variant's own template serves conversations with tools too
                    tool_template="" if a.template is not None else base.tool_template)
        return out

    def copy(self, source: str, destination: str, *, system: str | None = None,
             parameters: dict[str, Any] | None = None, template: str | None = None,
             license: str | None = None) -> str:
        """Make `destination` an alias of the model `source` means (Ollama's /api/copy; a
        variant's defaults come along), or, with `system`, `parameters` or `template`, a
        variant with those defaults over the source's (/api/create); returns the alias's
        name. `template`: Ollama's Go template or a Jinja chat template (`variant_template`).

        Raises:
            RequestError: 404 for an unknown source, 422 for one that cannot be served; 400
                for a destination that is a file's model or not a name, or a template that
                cannot be used.
        """
        models = self.models()
        target = models.get(model_key(source))
        if target is None:
            raise RequestError(f"model '{source}' not found; see /api/tags.", status=404,
                               param="source", code="model_not_found")
        if target.error:  # a name for it would be one more model that cannot be served
            raise RequestError(f"model '{source}' cannot be served: {target.error}",
                               status=422, param="source", code="model_not_servable")
        name = model_key(destination)
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*(:[a-z0-9._-]+)?", name):
            raise RequestError(f"'{destination}' is not a model name (letters, digits, '.', "
                               "'_', '-', and one ':tag').", param="destination")
        existing = models.get(name)
        if existing is not None and not existing.alias_of:
            raise RequestError(f"'{destination}' is the model of {existing.path}; choose "
                               "another name.", param="destination")
        self.aliases.set(name, Alias(
            model=target.alias_of or target.name,
            system=system if system is not None else target.system,
            parameters={**target.options, **(parameters or {})},
            template=variant_template(template) if template else target.template,
            license=license if license is not None else (target.license or None),
            created=time.time()))
        return name

    def delete(self, name: str, *, allow_files: bool) -> LibraryModel:
        """Remove an alias, or (with `allow_files`) a GGUF model's files; the entry removed.

        Raises:
            RequestError: 404 for an unknown name; 403 for a file's model when deleting
                files is not allowed; 400 for a Hugging Face directory.
        """
        entry = self.models().get(model_key(name))
        if entry is None:
            raise RequestError(f"model '{name}' not found; see /api/tags.", status=404,
                               param="model", code="model_not_found")
        if entry.alias_of:
            self.aliases.remove(entry.name)
            return entry
        if not allow_files:
            raise RequestError(f"'{name}' is the file {entry.path}; this server deletes "
                               "files only when its config says allow_delete: true "
                               "(flm-serve serve --allow-delete).",
                               status=403, param="model")
        if entry.format != "gguf":
            raise RequestError(f"'{name}' is the directory {entry.path}; delete it yourself.",
                               param="model")
        for alias, a in self.aliases.read().items():
            if a.model == entry.name:
                self.aliases.remove(alias)
        for f in entry.files:
            Path(f).unlink(missing_ok=True)
        return entry

    def get(self, name: str) -> LibraryModel | None:
        """The model a client's name means (`model_key`), or None."""
        return self.models().get(model_key(name))

    @staticmethod
    def _read(f: _Found) -> LibraryModel:
        facts: dict[str, Any] = {}
        error = ""
        try:
            split = SPLIT.match(f.path.stem) if f.format == "gguf" else None
            if split and len(f.files) != int(split["count"]):
                raise ValueError(f"{len(f.files)} of its {int(split['count'])} split parts "
                                 "are here")
            facts = (_gguf_facts(f.files) if f.format == "gguf"
                     else _hf_facts(f.path, f.files[1:]))
            digest = _digest(f.files)
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            error = f"{f.path.name}: cannot be read ({exc})"
            digest = ""
        sizes = [p.stat().st_size for p in f.files if p.exists()]
        times = [p.stat().st_mtime for p in f.files if p.exists()]
        return LibraryModel(name=f.name, path=str(f.path), files=tuple(map(str, f.files)),
                            format=f.format, size=sum(sizes), modified=max(times, default=0.0),
                            digest=digest, error=error, **facts)
