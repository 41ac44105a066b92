"""A request body as an API's typed request (its msgspec schema): `decode_json`, shared by
every API surface, and `decode_raw` for the plain JSON object beside it; a bad body is a 400
whose `param` is the offending field's path. `page_limit`: a listing's `limit` parameter;
`is_token_id` and `several_prompts`: how prompts given as token ids are read; `PARTS_JOIN`:
what joins a message's text parts where an API's translation makes them one text."""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

import msgspec

from deployments.errors import ApiError

# what parts two text parts of one message, as the worker's templates join the OpenAI API's
# (npu.load.template.PARTS_JOIN): two parts run together ran their words together
PARTS_JOIN = "\n"

_DECODERS: dict[type, msgspec.json.Decoder] = {}

# Arrays and objects nested deeper than this are refused: no API's request needs a tenth of
# it (OpenAI takes JSON schemas 5 levels deep), and past about 500 a request can no longer
# be pickled to a worker (Ray's cloudpickle), past msgspec's limit not even decoded.
MAX_NESTING = 128
# a string, or one left open at the end (a lone backslash last): every match that starts at a
# quote succeeds, without backtracking (possessive), so the scan is linear in the body
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.S)
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes
_OTHERS = bytes(c for c in range(256) if c not in b"[{]}")


def is_token_id(value: Any) -> bool:
    """An integer that is no bool (JSON's `true` is no token id)."""
    return isinstance(value, int) and not isinstance(value, bool)


def several_prompts(value: Any) -> bool:
    """llama-server's rule (its `tokenize_input_prompts`): a non-empty list that holds no
    bare token id is several prompts; anything else is one."""
    return isinstance(value, list) and bool(value) and not any(map(is_token_id, value))


def nesting(body: bytes) -> int:
    """How deep `body`'s arrays and objects nest (brackets inside strings not counted)."""
    if body.count(b"[") + body.count(b"{") <= MAX_NESTING:  # no deeper than that: no scan
        return 0
    steps = _STRING.sub(b"", body).translate(_STEPS, _OTHERS)
    return max(accumulate(memoryview(steps).cast("b")), default=0)


def decode_json(body: bytes, kind: type) -> Any:
    """`body` as a `kind` (one reused decoder per type): any API's request body.

    Raises:
        ApiError: 400 with `param` set to the offending field's path.
    """
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    _check_nesting(body)
    return _decoded(decoder, body)


def decode_raw(body: bytes) -> Any:
    """`body` as plain JSON values: every field, the ones no schema names too (checked as
    `decode_json` checks them: a number out of range is a 400 naming its field).

    Raises:
        ApiError: 400 with `param` set to the offending field's path.
    """
    _check_nesting(body)
    try:  # an object field by field, so that an error names its field
        fields = _FIELDS.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return _decoded(_RAW, body)  # not an object: its own error, or its value
    out = {}
    for name, raw in fields.items():
        try:
            out[name] = _decoded(_RAW, raw)
        except ApiError as err:  # its path in the whole body
            inner = err.param or ""
            err.param = name + (inner if inner.startswith("[") or not inner else f".{inner}")
            at = f" - at `$.{name}"
            err.message = (err.message.replace(" - at `$", at, 1) if " - at `$" in err.message
                           else f"{err.message}{at}`")
            raise
    return out


_RAW = msgspec.json.Decoder()
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _check_nesting(body: bytes) -> None:
    if nesting(body) > MAX_NESTING:
        raise ApiError(400, f"The body nests arrays or objects more than {MAX_NESTING} levels "
                            "deep; this server takes no more.")


def _decoded(decoder: msgspec.json.Decoder, body: bytes | msgspec.Raw) -> Any:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"Invalid request: {exc}", param=param_from(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"The body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "The body is not valid JSON here: it nests arrays or objects too "
                            "deeply.") from None


def param_from(err: msgspec.ValidationError) -> str | None:
    """The field a msgspec error is about: its path, plus a missing field's name."""
    text = str(err)
    path = ""
    if " - at `$" in text:
        text, path = text.split(" - at `$", 1)
        # an object's key msgspec does not name (`[...]`): the field holding it, if any
        path = path.rstrip("`").split("[...]")[0].strip(".")
    if text.startswith("Object missing required field `"):
        field = text.split("`")[1]
        path = f"{path}.{field}" if path else field
    return path or None


def page_limit(raw: str | None, *, default: int, most: int) -> int:
    """A listing's `limit` query parameter: `default` when it is absent.

    Raises:
        ApiError: 400 naming `limit` when it is not an integer from 1 to `most`.
    """
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= most:
        raise ApiError(400, f"'limit' is {raw!r}; use an integer from 1 to {most} (default "
                            f"{default}).", param="limit")
    return n
