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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from baton.core.errors import ConfigError


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

    mode: ViewMode = ViewMode.SCRAPED
    scrape_interval_s: float = 1.0
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.scrape_interval_s > 0 and math.isfinite(self.scrape_interval_s)):
            raise ConfigError(f"view.scrape_interval_s: expected a positive number, got {self.scrape_interval_s}")
        if not (self.delay_s >= 0 and math.isfinite(self.delay_s)):
            raise ConfigError(f"view.delay_s: expected a non-negative number, got {self.delay_s}")


EXACT = InfoModel(ViewMode.EXACT)


def info_from_dict(data: Any, where: str = "view") -> InfoModel:
    """``{mode, scrape_interval_s, delay_s}`` from YAML; errors name the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping with mode, scrape_interval_s, delay_s")
    unknown = sorted(set(data) - {"mode", "scrape_interval_s", "delay_s"})
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key; expected mode, scrape_interval_s or delay_s")
    try:
        mode = ViewMode(data.get("mode", "scraped"))
    except ValueError:
        raise ConfigError(f"{where}.mode: expected one of {', '.join(m.value for m in ViewMode)}, "
                          f"got {data.get('mode')!r}") from None
    values = {}
    for key in ("scrape_interval_s", "delay_s"):
        if key in data:
            v = data[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"{where}.{key}: expected a number, got {v!r}")
            values[key] = float(v)
    return InfoModel(mode, **values)


@dataclass(slots=True, frozen=True)
class EngineSample:
    """One scrape of an engine's metrics, taken at ``at_s``: running and waiting request
    counts, KV-cache usage (0..1) and the recent token interval (s)."""

    at_s: float
    running: int
    waiting: int
    kv_usage: float
    token_interval_s: float
