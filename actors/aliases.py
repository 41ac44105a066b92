"""AliasStore: other names for a library's models (Ollama's /api/copy), and variants with
their own defaults (/api/create: a system prompt, sampling parameters), kept in a small JSON
file in the library folder (or in the cache directory when the folder is read-only), so they
survive a restart and every ingress replica sees the same ones (re-read when the file's
modification time changes)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from npu.paths import cache_dir

log = logging.getLogger(__name__)

FILE_NAME = ".flm-aliases.json"


def store_path(folder: Path) -> Path:
    """Where a folder's aliases live: in it when it is writable, else in the cache
    directory under a name made from the folder's path."""
    if os.access(folder, os.W_OK):
        return folder / FILE_NAME
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / f"aliases-{digest}.json"


class Alias(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Another name of a library model, with the defaults a variant adds.

    Attributes:
        model: the model it stands for (a file's or directory's name).
        system: the system prompt of requests that send none.
        parameters: Ollama's Modelfile parameters (temperature, num_predict, stop, ...) for
            requests that do not set them.
        template: the Jinja chat template its chats render with (Ollama's TEMPLATE, made
            Jinja by actors.go_template when it was a Go template); None: the model's.
        license: its license text (Ollama's LICENSE; None: none given).
        created: when it was made (seconds since the epoch; None: an alias file written
            before this was kept, dated as its model).
    """

    model: str
    system: str | None = None
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    template: str | None = None
    license: str | None = None
    created: float | None = None


def _alias(value: Any) -> Alias:
    return Alias(model=value) if isinstance(value, str) else msgspec.convert(value, Alias)


class AliasStore:
    """alias -> the Alias it is.

    Args:
        folder: the library folder.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._stamp: tuple[int, int] | None = None
        self._aliases: dict[str, Alias] = {}

    @property
    def path(self) -> Path:
        return store_path(self.folder)

    def read(self) -> dict[str, Alias]:
        """Every alias (a missing or unreadable file: none; the latter logged)."""
        path = self.path
        try:
            st = path.stat()
        except OSError:
            self._stamp, self._aliases = None, {}
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                aliases = {str(k): _alias(v) for k, v in dict(data.get("aliases", {})).items()}
            except (OSError, ValueError, TypeError, AttributeError,
                    msgspec.ValidationError) as exc:
                log.warning("%s cannot be read (%s); no aliases", path, exc)
                aliases = {}
            self._stamp, self._aliases = stamp, aliases
        return dict(self._aliases)

    def set(self, alias: str, target: Alias) -> None:
        """Add or replace an alias (written at once, atomically)."""
        self._write({**self.read(), alias: target})

    def remove(self, alias: str) -> bool:
        """Remove an alias; False when there was none."""
        aliases = self.read()
        if aliases.pop(alias, None) is None:
            return False
        self._write(aliases)
        return True

    def _write(self, aliases: dict[str, Alias]) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".flm-aliases-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"aliases": {k: msgspec.to_builtins(v) for k, v in
                                   sorted(aliases.items())}}, f, indent=1)
        os.replace(tmp, path)
        self._stamp = None
