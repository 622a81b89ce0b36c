"""Bearer tokens: the admin token and the client API keys.

Both are compared in constant time against every configured key (a match does not end
the loop early), the scheme name is case-insensitive as RFC 7235 has it, and a header
that is not valid text is just a wrong token.
"""

from __future__ import annotations

import hashlib
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


def key_id(token: bytes) -> str:
    """The client id a request presenting API key ``token`` is counted under: a short hash,
    never the key itself (per-client shares, tenants by key)."""
    return "key:" + hashlib.sha256(token).hexdigest()[:16]


def token_matches(header: str | None, keys: Iterable[str]) -> bool:
    """Whether the header presents one of ``keys``."""
    given = presented_token(header)
    found = False
    for key in keys:
        found |= given is not None and hmac.compare_digest(given, key.encode("utf-8"))
    return found


class FailedLogins:
    """Failed admin logins per client address: ``limit`` within ``window_s`` lock that
    address out for the rest of the window (429), so the token cannot be guessed at speed."""

    def __init__(self, limit: int = 10, window_s: float = 60.0) -> None:
        self.limit, self.window_s = limit, window_s
        self.failures: dict[str, list[float]] = {}

    def retry_after_s(self, address: str, now_s: float) -> float | None:
        """Seconds until ``address`` may try again; None while it may."""
        recent = [t for t in self.failures.get(address, ()) if now_s - t < self.window_s]
        if recent:
            self.failures[address] = recent
        else:
            self.failures.pop(address, None)
        return self.window_s - (now_s - recent[0]) if len(recent) >= self.limit else None

    def failed(self, address: str, now_s: float) -> None:
        if len(self.failures) > 100_000:  # an address flood: forget the oldest half rather than grow
            for key in list(self.failures)[: len(self.failures) // 2]:
                del self.failures[key]
        self.failures.setdefault(address, []).append(now_s)
