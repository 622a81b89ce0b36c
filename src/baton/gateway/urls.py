"""Engine URLs as people and data planes see them."""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlparse


def public_url(url: str) -> str:
    """``url`` without user:password, for anything a person or a client may read."""
    parts = urlparse(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc).geturl()


@lru_cache(maxsize=4096)  # read per engine several times a request (the picker's pick, fallbacks, served endpoint)
def endpoint_address(url: str) -> str:
    """``host:port`` of a base URL, as a data plane names endpoints (GIE's EPP protocol)."""
    parts = urlparse(url)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
