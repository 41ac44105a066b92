"""A request body as an API's typed request (its msgspec schema): `decode_json`, shared by
every API surface; a bad body is a 400 whose `param` is the offending field's path."""

from __future__ import annotations

from typing import Any

import msgspec

from deployments.errors import ApiError

_DECODERS: dict[type, msgspec.json.Decoder] = {}


def decode_json(body: bytes, kind: type) -> Any:
    """`body` as a `kind` (one reused decoder per type): any API's request body.

    Raises:
        ApiError: 400 with `param` set to the offending field's path.
    """
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"Invalid request: {exc}", param=param_from(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"The body is not valid JSON: {exc}") from None


def param_from(err: msgspec.ValidationError) -> str | None:
    """The field a msgspec error is about: its path, plus a missing field's name."""
    text = str(err)
    path = ""
    if " - at `$" in text:
        text, path = text.split(" - at `$", 1)
        path = path.rstrip("`").lstrip(".")
    if text.startswith("Object missing required field `"):
        field = text.split("`")[1]
        path = f"{path}.{field}" if path else field
    return path or None
