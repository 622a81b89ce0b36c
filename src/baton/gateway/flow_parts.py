"""What a request's flow is given (``flow.Flow``): its collaborators, passed in rather than
reached through ``Control``."""

from __future__ import annotations

from dataclasses import dataclass

from baton.gateway.config import GatewayConfig
from baton.gateway.control import Control
from baton.gateway.engines import Engines
from baton.gateway.live import LiveCluster
from baton.gateway.metrics import GatewayMetrics


@dataclass(slots=True, frozen=True)
class FlowParts:
    """What every request's flow works with: the gateway's control (policy calls and
    bookkeeping), its engines (legs), its live cluster (the request's steps), its config
    and its metrics."""

    control: Control
    engines: Engines
    cluster: LiveCluster
    config: GatewayConfig
    metrics: GatewayMetrics
