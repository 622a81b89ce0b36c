"""Start ``baton epp``: the gateway's control (policy, bookings, scrapes, KV events, ticks)
with its HTTP side for ``/metrics``, ``/health`` and the admin API on ``port``, and the
ext_proc endpoint picker (with the standard gRPC health service) on ``epp_port``."""

from __future__ import annotations

import asyncio
import logging
import signal
from types import SimpleNamespace

from aiohttp import web

from baton.core.errors import ConfigError
from baton.gateway.config import GatewayConfig
from baton.gateway.epp import Exchange, check_policy
from baton.gateway.server import Gateway

log = logging.getLogger("baton.epp")


def protos() -> SimpleNamespace:
    """The Envoy and protobuf message types the picker answers with (extra ``epp``)."""
    try:
        from envoy.config.core.v3 import base_pb2
        from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
        from envoy.type.v3 import http_status_pb2
        from google.protobuf import struct_pb2
    except ImportError:
        raise ConfigError("baton epp needs grpcio and Envoy's API messages: pip install 'llm-baton[epp]'") from None
    return SimpleNamespace(ProcessingResponse=ep.ProcessingResponse, HeadersResponse=ep.HeadersResponse,
                           BodyResponse=ep.BodyResponse, CommonResponse=ep.CommonResponse,
                           HeaderMutation=ep.HeaderMutation, ImmediateResponse=ep.ImmediateResponse,
                           HeaderValueOption=base_pb2.HeaderValueOption, HeaderValue=base_pb2.HeaderValue,
                           HttpStatus=http_status_pb2.HttpStatus, Struct=struct_pb2.Struct)


def picker_servicer(gateway: Gateway):
    """The ext_proc servicer: one ``Exchange`` per stream, released when it closes."""
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as grpc_ep
    pb = protos()

    class EndpointPicker(grpc_ep.ExternalProcessorServicer):
        async def Process(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
            exchange = Exchange(gateway, pb)
            try:
                async for req in request_iterator:
                    yield await exchange.answer(req)
            finally:
                exchange.close()

    return EndpointPicker()


async def run_epp(config: GatewayConfig, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set."""
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as grpc_ep
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    gw = Gateway(config)
    check_policy(gw)
    runner = web.AppRunner(gw.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    server = grpc.aio.server()
    grpc_ep.add_ExternalProcessorServicer_to_server(picker_servicer(gw), server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    if server.add_insecure_port(f"{config.host}:{config.epp_port}") == 0:
        raise ConfigError(f"epp_port: cannot listen on {config.host}:{config.epp_port}")
    await server.start()
    for name in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("baton epp: ext_proc on %s:%d, metrics and admin on http://%s:%d, policy %r, %d engines",
             config.host, config.epp_port, config.host, config.port, gw.scheduler.name, len(config.engines))
    try:
        await stop.wait()
    finally:
        await server.stop(1.0)
        await runner.cleanup()


def serve_epp(config: GatewayConfig) -> None:
    """``baton epp`` until SIGINT or SIGTERM."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_epp(config, stop)

    asyncio.run(main())
