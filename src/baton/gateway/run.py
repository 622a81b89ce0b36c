"""Start the gateway from a config file."""

from __future__ import annotations

import logging

from baton.gateway.config import GatewayConfig, relay_workers
from baton.gateway.listener import listener_settings, serve_app
from baton.gateway.server import Gateway


def serve(config: GatewayConfig) -> None:
    """Serve until interrupted (uvloop when installed); with ``workers`` other than 1, as a
    supervisor of relay workers and a control process (``gateway.workers``)."""
    if relay_workers(config) > 1:
        from baton.gateway.workers import serve_workers
        serve_workers(config)
        return
    gw = Gateway(config)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("baton.gateway").info(
        "baton serve: %s on http://%s:%s with policy %r, %d engines (%s)", ", ".join(gw.engines.names.served()),
        config.host, config.port, gw.scheduler.name, len(config.engines),
        ", ".join(f"{e.name}={e.role.value}" for e in config.engines))
    serve_app(gw.app(), config.host, config.port, **listener_settings(config))

