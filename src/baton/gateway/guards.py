"""Checks every request passes before its handler (aiohttp middlewares)."""

from __future__ import annotations

from aiohttp import web

from baton.protocol.errors import ApiError

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSON_PATHS = ("/v1/", "/admin/")


@web.middleware
async def json_bodies_only(request: web.Request, handler):
    """A request with a body to the API or the admin API must declare it JSON (415
    otherwise). A browser sends ``text/plain``, form and multipart bodies to any origin
    without asking it first (no CORS preflight), so a web page could make its visitor's
    browser post completions (or, with a token in the page, admin calls) to a gateway it
    can reach; ``application/json`` requires a preflight, which the gateway never grants.
    Parameters (``; charset=utf-8``) are allowed; the media type must be exact."""
    if request.method in BODY_METHODS and request.path.startswith(JSON_PATHS) \
            and request.content_type != "application/json":
        declared = request.headers.get("Content-Type")
        raise ApiError(415, f"Content-Type must be application/json, got {declared or 'none'}",
                       code="unsupported_media_type")
    return await handler(request)
