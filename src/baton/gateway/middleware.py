"""The gateway's outer HTTP layers: client API keys on ``/v1/*``, and the response count
by status code and error type with its rate-limited log of refused requests."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import aiohttp.http_exceptions
from aiohttp import web

from baton.gateway.auth import key_id, presented_token, token_matches
from baton.gateway.metrics import GatewayMetrics
from baton.gateway.ratelog import RateLimitedLog
from baton.protocol.errors import ApiError

log = logging.getLogger("baton.gateway")
# where a response carries its OpenAI error type, for the count (a typed key where aiohttp has
# them: a plain string key draws a NotAppKeyWarning on every refused request)
ERROR_TYPE = web.ResponseKey("baton_error_type", str) if hasattr(web, "ResponseKey") else "baton_error_type"
CLIENT = "baton_client"  # who a request counts against (gateway.admission): its API key, else its address
# a relay worker's answer that is control's, passed through (control counted it already)
FROM_CONTROL = web.ResponseKey("baton_from_control", bool) if hasattr(web, "ResponseKey") else "baton_from_control"


def client_of(request: web.Request) -> str:
    """The client a request's in-flight share is counted for: its API key (hashed), or
    its address where the gateway has no keys."""
    return request.get(CLIENT) or f"addr:{request.remote or ''}"


# the error types a response is counted by; any other (an engine's own answer passed on) is
# counted as "other": a label value an engine chooses would make one series per value
COUNTED_ERROR_TYPES = frozenset({"invalid_request_error", "authentication_error", "permission_error",
                                 "not_found_error", "NotFoundError", "conflict_error", "rate_limit_exceeded",
                                 "server_error", "BadRequestError", "api_error", "request_timeout"})


def mark_error(resp: web.StreamResponse, err: ApiError) -> web.StreamResponse:
    """Note on ``resp`` the error it carries (a JSON error, or an error event in a stream)."""
    resp[ERROR_TYPE] = err.err_type if err.err_type in COUNTED_ERROR_TYPES else "other"
    return resp


def client_keys(keys: tuple[str, ...]):
    """Requests to ``/v1/*`` must present one of ``keys`` as a bearer token (401 as
    OpenAI answers it otherwise). No keys: open, as before. A request with two
    ``Authorization`` headers is refused everywhere (400)."""

    @web.middleware
    async def check(request: web.Request, handler):
        if len(request.headers.getall("Authorization", ())) > 1:  # which one counts is anyone's guess
            err = ApiError(400, "more than one Authorization header", code="duplicate_authorization")
            return mark_error(web.json_response(err.body(), status=400), err)
        if keys and request.path.startswith("/v1/"):
            header = request.headers.get("Authorization")
            if not token_matches(header, keys):
                msg = ("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'." if not header
                       else "Incorrect API key provided.")
                err = ApiError(401, msg, err_type="invalid_request_error", code="invalid_api_key")
                return mark_error(web.json_response(err.body(), status=401,
                                                    headers={"WWW-Authenticate": "Bearer"}), err)
            request[CLIENT] = key_id(presented_token(header) or b"")
        return await handler(request)
    return check


def counted(metrics: GatewayMetrics, refusals: RateLimitedLog):
    """Count every response by status and error type (``baton_responses_total``); log
    refusals (4xx and 5xx) through ``refusals``. A relay worker's pass-through of control's
    answer is not counted again (``FROM_CONTROL``)."""

    @web.middleware
    async def count(request: web.Request, handler):
        resp = await handler(request)
        if isinstance(resp, web.StreamResponse) and resp.get(FROM_CONTROL):
            return resp
        error_type = resp.get(ERROR_TYPE, "") if isinstance(resp, web.StreamResponse) else ""
        status = getattr(resp, "status", 0)
        metrics.child(metrics.responses, str(status), error_type).inc()
        if status >= 400:
            refusals.note(f"{status} {error_type}".strip(), f"{request.method} {request.path} from {request.remote}")
        return resp
    return count


@web.middleware
async def json_errors(request: web.Request, handler):
    """Every error a client can get is an OpenAI-style JSON body: aiohttp's own (unknown
    route, wrong method, body too large), an undecodable body (bad Content-Encoding), and
    anything unforeseen."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = ApiError(exc.status, exc.reason or "error", err_type="invalid_request_error"
                       if exc.status < 500 else "server_error")
    except (web.RequestPayloadError, aiohttp.http_exceptions.HttpProcessingError) as exc:  # e.g. broken gzip
        err = ApiError(400, f"request body cannot be read: {exc}")
    except ApiError as exc:
        err = exc
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:
        # the client went away mid-answer: one debug line, and aiohttp's quiet path for a
        # premature disconnection (an exception reaching it is logged at ERROR with its
        # traceback: 43 lines a dropped stream)
        log.debug("client went away during %s", request.path)
        raise asyncio.CancelledError from None
    except Exception:  # noqa: BLE001
        log.exception("unhandled error on %s", request.path)
        err = ApiError(500, "internal gateway error", err_type="server_error")
    return mark_error(web.json_response(err.body(), status=err.status, headers=err.headers()), err)
