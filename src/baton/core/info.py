"""What a policy can see: the information model shared by the simulator and the gateway.

Every ``ClusterView`` field is one of two classes:

- **own bookings** — what the router itself placed, moved and released, and the tokens it
  relayed: prefill queues (``prefill_queue``), requests bound early (``shadow``), KV on
  its way (``incoming``), each running request's context and output so far
  (``decode_snapshot``, ``context_tokens``, ``token_load``), outstanding requests
  (``own_requests``). A router knows these exactly and at once.
- **engine metrics** — what only the engine knows and a router learns by scraping
  ``/metrics``: running and waiting request counts (``running_requests``,
  ``waiting_requests``), KV-cache usage (``kv_usage``), the iteration / token interval
  (``token_interval_s``). They are as old as the last scrape, plus its delay.

Modes: ``exact`` reads engine metrics as they are now (an idealised router);
``scraped`` (the default, and what ``baton serve`` has) reads them from the last scrape
every ``scrape_interval_s``, published ``delay_s`` later, and keeps own bookings exact;
``scraped-only`` has no own bookings (a router that reads only ``/metrics``): token load
is estimated from KV usage, outstanding requests from running + waiting, and stages that
need per-request bookings (SIBYL, ARES) cannot run.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import baton.core.settings as settings
from baton.core.errors import ConfigError
from baton.core.settings import setting


class ViewMode(str, enum.Enum):
    """How fresh engine metrics are, and whether own bookings exist."""

    EXACT = "exact"
    SCRAPED = "scraped"
    SCRAPED_ONLY = "scraped-only"

    @property
    def scraped(self) -> bool:
        return self is not ViewMode.EXACT

    @property
    def bookings(self) -> bool:
        return self is not ViewMode.SCRAPED_ONLY


@dataclass(slots=True, frozen=True)
class InfoModel:
    """The information model: a mode, a scrape interval and a publication delay (s)."""

    mode: ViewMode = setting(ViewMode.SCRAPED, flag="--view", doc="what policies see: exact (the runtime's own state) or "
                                                   "scraped (engine metrics every interval, with a delay)")
    scrape_interval_s: float = setting(1.0, gt=0, unit="s", flag="--scrape-interval", doc="how often the scraped view refreshes")
    delay_s: float = setting(0.0, ge=0, unit="s", flag="--scrape-delay", doc="how stale a scrape is when policies see it")

    def __post_init__(self) -> None:
        if not (self.scrape_interval_s > 0 and math.isfinite(self.scrape_interval_s)):
            raise ConfigError(f"view.scrape_interval_s: expected a positive number, got {self.scrape_interval_s}")
        if not (self.delay_s >= 0 and math.isfinite(self.delay_s)):
            raise ConfigError(f"view.delay_s: expected a non-negative number, got {self.delay_s}")


EXACT = InfoModel(ViewMode.EXACT)


def info_from_dict(data: Any, where: str = "view") -> InfoModel:
    """``{mode, scrape_interval_s, delay_s}`` from YAML; errors name the key."""
    return settings.parse(InfoModel, data, where)


@dataclass(slots=True, frozen=True)
class EngineSample:
    """One scrape of an engine's metrics, taken at ``at_s``: running and waiting request
    counts, KV-cache usage (0..1) and the recent token interval (s)."""

    at_s: float
    running: int
    waiting: int
    kv_usage: float
    token_interval_s: float
