"""RequestError: a request the worker refuses; carries its HTTP status and OpenAI fields."""

from __future__ import annotations

# the code of the refusal of a model without FIM tokens (actors.infill): llama-server's
# /infill answers it with its 501, the other APIs with a 400
FIM_UNSUPPORTED = "fim_unsupported"


class RequestError(Exception):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type
