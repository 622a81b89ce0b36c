"""Request classes: a workload's mix of priorities, tenants and per-request SLOs (for
example 20% interactive at 1 s / 50 ms in a high band, 80% batch at 30 s / 200 ms).
Each request draws its class with a seeded generator, independently of its lengths and
arrival, so the same workload with and without classes differs only in them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from baton.core.errors import ConfigError
from baton.core.request import Request
from baton.core.settings import setting


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One class of a workload's mix (YAML ``workload.classes[i]``)."""

    share: float = setting(gt=0, le=1, doc="the share of requests in this class (the shares sum to 1)")
    priority: int = setting(0, doc="its priority band (higher goes first under flow control)")
    tenant: str = setting("", doc="whose requests they are (flow control's fairness, per-tenant figures)")
    ttft_slo_s: float | None = setting(None, gt=0, unit="s", doc="its TTFT target (none: the run's)")
    tpot_slo_s: float | None = setting(None, gt=0, unit="s", doc="its TPOT target (none: the run's)")


def check_shares(classes: tuple[RequestClass, ...], where: str = "workload.classes") -> None:
    """ConfigError unless the classes' shares sum to 1 (within rounding)."""
    total = sum(c.share for c in classes)
    if classes and abs(total - 1.0) > 1e-6:
        raise ConfigError(f"{where}: the shares sum to {total:g}, expected 1")


def with_classes(requests: list[Request], classes: tuple[RequestClass, ...], seed: int) -> list[Request]:
    """``requests`` each with a class drawn by share (seeded by ``seed``, apart from the
    workload's own draws); unchanged without classes."""
    if not classes:
        return requests
    check_shares(classes)
    rng = np.random.default_rng([seed, 0xC1A55])
    picks = rng.choice(len(classes), size=len(requests), p=[c.share for c in classes])
    return [replace(r, priority=c.priority, tenant=c.tenant, ttft_slo_s=c.ttft_slo_s, tpot_slo_s=c.tpot_slo_s)
            for r, c in zip(requests, (classes[i] for i in picks))]
