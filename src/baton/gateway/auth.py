"""Bearer tokens: the admin token and the client API keys.

Both are compared in constant time against every configured key (a match does not end
the loop early), the scheme name is case-insensitive as RFC 7235 has it, and a header
that is not valid text is just a wrong token.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable


def presented_token(header: str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (any case of ``Bearer``),
    as bytes; None without one."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    # surrogateescape: a non-ASCII header is just a wrong token, never a server error
    return token.strip().encode("utf-8", "surrogateescape")


def token_matches(header: str | None, keys: Iterable[str]) -> bool:
    """Whether the header presents one of ``keys``."""
    given = presented_token(header)
    found = False
    for key in keys:
        found |= given is not None and hmac.compare_digest(given, key.encode("utf-8"))
    return found
