"""The gateway's outer HTTP layers: client API keys on ``/v1/*``, and the response count
by status code and error type with its rate-limited log of refused requests."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from aiohttp import web

from baton.gateway.auth import token_matches
from baton.gateway.metrics import GatewayMetrics
from baton.protocol.errors import ApiError

log = logging.getLogger("baton.gateway")
ERROR_TYPE = "baton_error_type"  # where a response carries its OpenAI error type, for the count


def mark_error(resp: web.StreamResponse, err: ApiError) -> web.StreamResponse:
    """Note on ``resp`` the error it carries (a JSON error, or an error event in a stream)."""
    resp[ERROR_TYPE] = err.err_type
    return resp


class RefusalLog:
    """One DEBUG line per refused request; at INFO at most one summary per ``every_s``
    seconds (a flood of bad requests must not flood the log)."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._counts: Counter[str] = Counter()
        self._since = clock()

    def note(self, status: int, error_type: str, path: str, client: str | None) -> None:
        log.debug("refused %s from %s: %d %s", path, client, status, error_type)
        self._counts[f"{status} {error_type}"] += 1
        now = self.clock()
        if now - self._since >= self.every_s:
            summary = ", ".join(f"{k} x{n}" for k, n in self._counts.most_common())
            log.info("refused %d requests in the last %.0f s: %s", sum(self._counts.values()), now - self._since,
                     summary)
            self._counts.clear()
            self._since = now


def client_keys(keys: tuple[str, ...]):
    """Requests to ``/v1/*`` must present one of ``keys`` as a bearer token (401 as
    OpenAI answers it otherwise). No keys: open, as before."""

    @web.middleware
    async def check(request: web.Request, handler):
        if keys and request.path.startswith("/v1/"):
            header = request.headers.get("Authorization")
            if not token_matches(header, keys):
                msg = ("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'." if not header
                       else "Incorrect API key provided.")
                err = ApiError(401, msg, err_type="invalid_request_error", code="invalid_api_key")
                return mark_error(web.json_response(err.body(), status=401,
                                                    headers={"WWW-Authenticate": "Bearer"}), err)
        return await handler(request)
    return check


def counted(metrics: GatewayMetrics, refusals: RefusalLog):
    """Count every response by status and error type (``baton_responses_total``); log
    refusals (4xx and 5xx) through ``refusals``."""

    @web.middleware
    async def count(request: web.Request, handler):
        resp = await handler(request)
        error_type = resp.get(ERROR_TYPE, "") if isinstance(resp, web.StreamResponse) else ""
        status = getattr(resp, "status", 0)
        metrics.child(metrics.responses, str(status), error_type).inc()
        if status >= 400:
            refusals.note(status, error_type, request.path, request.remote)
        return resp
    return count
