"""Each client's share of the gateway's in-flight slots: one client (an API key, or an
address where there are no keys) may hold at most ``max_inflight_per_client`` requests at
once, so a client with many long streams cannot take every ``max_inflight`` slot from the
others. Behind a proxy that hides the clients' addresses, give each client its own API key
or raise the cap to ``max_inflight``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from baton.protocol.errors import ApiError


class ClientShares:
    """In-flight requests per client; ``take`` refuses (429) a client at its cap."""

    def __init__(self, cap: int, on_refused: Callable[[], None]) -> None:
        self.cap, self.on_refused = cap, on_refused
        self.held: Counter[str] = Counter()

    def take(self, client: str) -> None:
        """One more request of ``client`` ("": not counted, as behind an endpoint picker)."""
        if not client:
            return
        if self.held[client] >= self.cap:
            self.on_refused()
            raise ApiError(429, f"this client has {self.cap} requests in flight, its most at once; retry when "
                                "one has finished", err_type="rate_limit_exceeded", code="client_inflight_cap")
        self.held[client] += 1

    def give(self, client: str) -> None:
        if not client:
            return
        self.held[client] -= 1
        if self.held[client] <= 0:
            del self.held[client]
