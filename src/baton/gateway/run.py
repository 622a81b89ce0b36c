"""Start the gateway from a config file."""

from __future__ import annotations

import logging

from aiohttp import web

from baton.gateway.config import GatewayConfig, relay_workers
from baton.gateway.server import Gateway


def serve(config: GatewayConfig) -> None:
    """Serve until interrupted (uvloop when installed); with ``workers`` other than 1, as a
    supervisor of relay workers and a control process (``gateway.workers``)."""
    if relay_workers(config) > 1:
        from baton.gateway.workers import serve_workers
        serve_workers(config)
        return
    gw = Gateway(config)
    try:
        import uvloop  # noqa: F401  (optional speed-up)
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("baton.gateway").info(
        "baton serve: %s on http://%s:%s with policy %r, %d engines (%s)", ", ".join(gw.engines.names.served()),
        config.host, config.port, gw.scheduler.name, len(config.engines),
        ", ".join(f"{e.name}={e.role.value}" for e in config.engines))
    kwargs: dict = {"loop": loop_factory()} if loop_factory else {}
    kwargs["access_log"] = logging.getLogger("baton.access") if config.access_log else None
    # keepalive_timeout also bounds how long a fresh connection may take to send its
    # request head (config.header_timeout_s says why it is not shorter)
    web.run_app(gw.app(), host=config.host, port=config.port, print=None, handler_cancellation=True,
                keepalive_timeout=config.header_timeout_s, **kwargs)
