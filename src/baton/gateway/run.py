"""Start the gateway from a config file."""

from __future__ import annotations

from aiohttp import web

from baton.gateway.config import GatewayConfig
from baton.gateway.server import Gateway


def serve(config: GatewayConfig) -> None:
    """Serve until interrupted (uvloop when installed)."""
    gw = Gateway(config)
    try:
        import uvloop  # noqa: F401  (optional speed-up)
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    print(f"baton serve: {gw.model} on http://{config.host}:{config.port} with policy "
          f"{gw.scheduler.name!r}, {len(config.engines)} engines", flush=True)
    kwargs = {"loop": loop_factory()} if loop_factory else {}
    # keepalive_timeout also bounds how long a fresh connection may take to send its
    # request head, so slow-header clients cannot hold connections open for long
    web.run_app(gw.app(), host=config.host, port=config.port, print=None, handler_cancellation=True,
                access_log=None, keepalive_timeout=config.header_timeout_s, **kwargs)
