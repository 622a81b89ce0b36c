"""An Envoy bootstrap for ``baton epp``: Envoy relays the tokens, the picker picks.

One listener whose HTTP filters are, in order:

1. ``header_mutation``: removes any client-sent ``x-gateway-destination-endpoint``,
   ``x-prefiller-host-port`` and ``x-gateway-prefill-endpoints`` (a client must never
   choose its own endpoint: only the picker's header, set after this filter, routes);
2. ``ext_proc`` to the picker (request headers, buffered request body, response headers
   and, with ``epp_response_bodies``, the streamed response body), accepting the picker's
   ``envoy.lb`` dynamic metadata;
3. the router.

Routes: a request the picker placed (its ``envoy.lb`` metadata, which no client can set)
goes to a cluster of every engine and sidecar the config names whose load-balancing policy
is Envoy's ``override_host``: it connects to the first endpoint of the picker's list and,
when that cannot be reached (connection refused or reset before a byte went out), retries
down the list (``epp_fallbacks``), then reports the endpoint that served as
``envoy.lb``/``x-gateway-destination-endpoint-served``, forwarded to the picker with the
response headers. With ``discovery`` (endpoints unknown when the bootstrap is written) an
``ORIGINAL_DST`` cluster connects to the pick alone. Without a pick (the picker down and
``failure_mode_allow``): fail-open routes round-robin over the configured engines;
fail-close answers 503 (``status_on_error`` when the picker cannot be reached at all).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from baton.gateway.config import GatewayConfig
from baton.gateway.epp import DEST, LB_NAMESPACE, SERVED

STRIPPED = (DEST, "x-prefiller-host-port", "x-gateway-prefill-endpoints")


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _endpoints(addresses: list[tuple[str, int]]) -> dict[str, Any]:
    return {"endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(h, p)}} for h, p in addresses]}]}


HELD_WITHOUT_TTL_S = 300.0  # how long Envoy waits for a held request's answer when flow control has no TTL


def message_timeout_s(config: GatewayConfig) -> float:
    """How long Envoy waits for one picker answer: 10 s, or, with flow control (which holds
    a request's answer while the engines are saturated), its time to live (else
    ``HELD_WITHOUT_TTL_S``) and 10 s more; past it Envoy answers 503 itself."""
    flow = config.flow_control
    return 10.0 + ((flow.ttl_s or HELD_WITHOUT_TTL_S) if flow.enabled else 0.0)


def _ext_proc(config: GatewayConfig, fail_open: bool) -> dict[str, Any]:
    return {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "baton_epp"}, "timeout": "10s"},
        "failure_mode_allow": fail_open,
        "status_on_error": {"code": 503},
        "message_timeout": f"{message_timeout_s(config):g}s",
        "processing_mode": {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                            "response_header_mode": "SEND",
                            "response_body_mode": "STREAMED" if config.epp_response_bodies else "NONE",
                            "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"},
        "metadata_options": {"receiving_namespaces": {"untyped": [LB_NAMESPACE]},
                             "forwarding_namespaces": {"untyped": [LB_NAMESPACE]}}}}


def _routes(fail_open: bool, retries: int = 0) -> list[dict[str, Any]]:
    # routed by the picker's dynamic metadata, which a client cannot set (its header is
    # stripped before the picker runs, but a route matched on it would be cached by then)
    picked = {"match": {"prefix": "/", "dynamic_metadata": [{"filter": LB_NAMESPACE, "path": [{"key": DEST}],
                                                              "value": {"present_match": True}}]},
              "route": {"cluster": "baton_picked", "timeout": "0s"}}
    if retries:  # only before the request reached an engine: an answer is never sent twice
        picked["route"]["retry_policy"] = {"retry_on": "connect-failure,refused-stream,reset-before-request",
                                           "num_retries": retries}
    rest = {"match": {"prefix": "/"}, "route": {"cluster": "baton_fallback", "timeout": "0s"}} if fail_open else \
        {"match": {"prefix": "/"}, "direct_response": {"status": 503, "body": {
            "inline_string": '{"error": {"message": "no endpoint picked", "type": "server_error", '
                             '"param": null, "code": "503"}}'}}}
    return [picked, rest]


def _typed(name: str, type_url: str, **config: Any) -> dict[str, Any]:
    return {"typed_extension_config": {"name": name, "typed_config": {"@type": f"type.googleapis.com/{type_url}",
                                                                      **config}}}


def _picked_cluster(config: GatewayConfig, engines: list[tuple[str, int]]) -> dict[str, Any]:
    """Where picked requests go: the picker's endpoint list over every engine and sidecar
    (``override_host``), or, with discovery, the one picked address (``ORIGINAL_DST``)."""
    if config.discovery is not None:
        return {"name": "baton_picked", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": "3s", "original_dst_lb_config": {"use_http_header": True, "http_header_name": DEST}}
    sidecars = [(urlsplit(e.sidecar).hostname or "127.0.0.1", urlsplit(e.sidecar).port or 80)
                for e in config.engines if e.sidecar]
    override = _typed("envoy.load_balancing_policies.override_host",
                      "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                      override_host_sources=[{"metadata": {"key": LB_NAMESPACE, "path": [{"key": DEST}]}}],
                      selected_host_key={"key": LB_NAMESPACE, "path": [{"key": SERVED}]},
                      fallback_policy={"policies": [_typed(
                          "envoy.load_balancing_policies.round_robin",
                          "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin")]})
    return {"name": "baton_picked", "type": "STATIC", "connect_timeout": "3s",
            "load_balancing_policy": {"policies": [override]},
            "load_assignment": {"cluster_name": "baton_picked", **_endpoints(list(dict.fromkeys(engines + sidecars)))}}


def bootstrap(config: GatewayConfig, listen_port: int, fail_open: bool, admin_port: int = 0,
              picker: bool = True) -> dict[str, Any]:
    """The bootstrap as a dict (``yaml.safe_dump`` it); ``admin_port`` 0: any free port.
    ``picker=False``: plain Envoy, round-robin over the engines (a baseline to measure the
    picker against)."""
    engines = [(urlsplit(e.url).hostname or "127.0.0.1", urlsplit(e.url).port or 80) for e in config.engines]
    manager = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                        "HttpConnectionManager",
               "stat_prefix": "baton", "stream_idle_timeout": "0s",
               "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": _routes(
                   fail_open, 0 if config.discovery else config.epp_fallbacks) if picker else _routes(True)[1:]}]},
               "http_filters": [
                   {"name": "envoy.filters.http.header_mutation", "typed_config": {
                       "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                       "mutations": {"request_mutations": [{"remove": h} for h in STRIPPED]}}},
                   _ext_proc(config, fail_open),
                   {"name": "envoy.filters.http.router", "typed_config": {
                       "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    if not picker:
        manager["http_filters"] = manager["http_filters"][-1:]
    http2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}}
    clusters = [
        {"name": "baton_epp", "type": "STATIC", "connect_timeout": "3s", "typed_extension_protocol_options": http2,
         "load_assignment": {"cluster_name": "baton_epp", **_endpoints([(config.host, config.epp_port)])}},
        _picked_cluster(config, engines),
        {"name": "baton_fallback", "type": "STATIC", "lb_policy": "ROUND_ROBIN", "connect_timeout": "3s",
         "load_assignment": {"cluster_name": "baton_fallback", **_endpoints(engines)}}]
    return {"admin": {"address": _address("127.0.0.1", admin_port)},
            "static_resources": {"listeners": [{"name": "baton", "address": _address(config.host, listen_port),
                                                # a body the picker buffers may be max_body_bytes (Envoy: 1 MiB)
                                                "per_connection_buffer_limit_bytes": config.max_body_bytes + 65536,
                                                "filter_chains": [{"filters": [{
                                                    "name": "envoy.filters.network.http_connection_manager",
                                                    "typed_config": manager}]}]}],
                                 "clusters": clusters}}


def write_bootstrap(path: Path, config: GatewayConfig, listen_port: int, fail_open: bool) -> None:
    """Write the bootstrap YAML (``envoy -c PATH`` runs it)."""
    path.write_text(yaml.safe_dump(bootstrap(config, listen_port, fail_open), sort_keys=False))
