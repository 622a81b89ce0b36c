"""OpenAI-style error bodies."""

from __future__ import annotations

import math
from typing import Any


class ApiError(Exception):
    """An error to return to an HTTP client: status, message and OpenAI error type."""

    def __init__(self, status: int, message: str, err_type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type = status, message, err_type
        self.param, self.code = param, code
        self.retry_after_s = retry_after_s  # a 429's Retry-After (whole seconds, rounded up)

    def headers(self) -> dict[str, str]:
        """The response headers the error carries (``Retry-After``)."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.err_type, self.param, self.code or str(self.status))


OPENAI_ERROR_TYPES = frozenset({"invalid_request_error", "authentication_error", "permission_error",
                                "not_found_error", "rate_limit_exceeded", "server_error"})


def openai_type(err_type: object, status: int) -> str:
    """An error type in OpenAI's words: the given one if it is one of theirs, else the one
    its HTTP status means (an engine may say ``BadRequestError``, as older vLLM did)."""
    if err_type in OPENAI_ERROR_TYPES:
        return str(err_type)
    by_status = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                 429: "rate_limit_exceeded"}
    return by_status.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, err_type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}`` as the OpenAI API returns it."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}
