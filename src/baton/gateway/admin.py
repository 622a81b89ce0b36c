"""Admin API (bearer token): list instances with their live state, add or remove an
instance, change a role, show the active policy config."""

from __future__ import annotations

import time
from urllib.parse import urlparse

from aiohttp import web

from baton.core.decisions import Migrate
from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.gateway.config import GatewayConfig, parse_engine
from baton.gateway.urls import public_url
from baton.gateway.control import Control, InFlight
from baton.gateway.auth import FailedLogins, token_matches
from baton.gateway.engines import Engines
from baton.gateway.fleet import Fleet
from baton.gateway.ipc import RELAYED_FOR
from baton.gateway.scrape import Scraper
from baton.protocol.errors import ApiError
from baton.protocol.requests import parse_json


def _authorise(config: GatewayConfig, request: web.Request, logins: FailedLogins) -> None:
    token = config.admin_token
    if not token:
        raise ApiError(403, "admin API disabled: set admin_token in the config or BATON_ADMIN_TOKEN",
                       err_type="permission_error")
    address, now = client_address(request), time.monotonic()
    wait_s = logins.retry_after_s(address, now)
    if wait_s is not None:
        raise ApiError(429, f"too many failed admin logins from this address; retry in {wait_s:.0f} s",
                       err_type="rate_limit_exceeded", code="admin_login_locked")
    if not token_matches(request.headers.get("Authorization"), (token,)):
        logins.failed(address, now)
        raise ApiError(401, "missing or wrong bearer token", err_type="authentication_error")


def client_address(request: web.Request) -> str:
    """The client's address; a relay worker passing a request through names its client in
    ``RELAYED_FOR`` (believed only from this host: control listens on loopback)."""
    relayed = request.headers.get(RELAYED_FOR)
    if relayed and request.remote in ("127.0.0.1", "::1"):
        return relayed
    return request.remote or ""


LOOPBACK = frozenset({"127.0.0.1", "localhost", "0.0.0.0", "::1", "::"})


def _is_self(url: str, config: GatewayConfig) -> bool:
    """Whether ``url`` names this gateway's own port (on loopback or its listen address)."""
    parsed = urlparse(url)
    return parsed.port == config.port and (parsed.hostname in LOOPBACK or parsed.hostname == config.host)


def _guarded(config: GatewayConfig, handler, logins: FailedLogins):
    async def wrapped(request: web.Request) -> web.Response:
        try:
            _authorise(config, request, logins)
            return await handler(request)
        except ApiError as err:
            return web.json_response(err.body(), status=err.status)
        except ConfigError as err:
            return web.json_response(ApiError(400, str(err)).body(), status=400)
    return wrapped


def _instance(control: Control, request: web.Request) -> int:
    iid = control.cluster.find(request.match_info["key"])
    if iid is None:
        raise ApiError(404, f"no instance named {request.match_info['key']!r}", err_type="not_found_error")
    return iid


def add_routes(app: web.Application, control: Control, engines: Engines, scraper: Scraper, kv_index=None,
               hub=None) -> None:
    cluster, config = control.cluster, control.config
    fleet = Fleet(control, engines, scraper)
    logins = FailedLogins()

    async def workers(_request: web.Request) -> web.Response:
        """The relay workers (``baton serve --workers N``) and their pids."""
        return web.json_response(hub.describe())

    async def kv_state(_request: web.Request) -> web.Response:
        """What the engines' KV events built, per engine (``gateway.kv_index``)."""
        state = kv_index.state() if kv_index is not None else {}
        return web.json_response({"engines": {cluster.engines[i].spec.name: s for i, s in state.items()}})

    async def list_instances(_request: web.Request) -> web.Response:
        cluster.now()
        return web.json_response({"instances": [cluster.describe(i) for i in cluster.instances
                                                if not cluster.engines[i].removed],
                                  "in_flight": cluster.totals(), "held_prefills": control.hold.held_total()})

    async def add_instance(request: web.Request) -> web.Response:
        spec = parse_engine(parse_json(await request.read()), "instance", frozenset(config.admin_env_allowlist))
        if spec.hidden_states:  # the feed subscribes at start only
            raise ConfigError("instance.hidden_states: only engines in the config file can have a hidden-state feed")
        if spec.kv_feed:
            raise ConfigError("instance.kv_events: only engines in the config file can have a KV-event feed")
        if cluster.find(spec.name) is not None:
            raise ApiError(409, f"an instance named {spec.name!r} exists", code="instance_exists")
        if _is_self(spec.url, config):
            raise ApiError(400, f"{public_url(spec.url)} is the gateway's own address: a leg sent there would come "
                                "back to it", param="url")
        iid = await fleet.add(spec)
        return web.json_response(cluster.describe(iid), status=201)

    async def remove_instance(request: web.Request) -> web.Response:
        iid = _instance(control, request)
        draining = fleet.remove(iid)
        return web.json_response({"removed": cluster.engines[iid].spec.name, "draining_requests": draining})

    async def change_role(request: web.Request) -> web.Response:
        iid = _instance(control, request)
        body = parse_json(await request.read())
        try:
            role = Role(body.get("role"))
        except ValueError:
            raise ApiError(400, f"'role' must be prefill, decode or mixed, got {body.get('role')!r}",
                           param="role") from None
        control.set_role(iid, role, "admin")
        cluster.now()
        return web.json_response(cluster.describe(iid))

    async def policy(_request: web.Request) -> web.Response:
        cfg, scheduler = config, control.scheduler
        return web.json_response({"policy": cfg.policy, "scheduler": scheduler.name,
                                  "stages": [s.name for s in scheduler.stages],
                                  "ticks_s": [i for _, i in scheduler.tickers], "preset": cfg.preset,
                                  "pd_protocol": cfg.pd_protocol, "scrape_interval_s": cfg.scrape_interval_s})

    async def list_requests(_request: web.Request) -> web.Response:
        cluster.now()
        return web.json_response({"requests": [_describe(f, cluster.view.now_s) for f in control.flows.values()]})

    async def migrate(request: web.Request) -> web.Response:
        """Move one request (an operator's drain or rebalance), like a policy's Migrate."""
        try:
            flow = control.flows[int(request.match_info["req_id"])]
        except (KeyError, ValueError):
            raise ApiError(404, f"no request {request.match_info['req_id']!r} in flight",
                           err_type="not_found_error") from None
        body = parse_json(await request.read())
        target = cluster.find(str(body.get("target")))
        if target is None:
            raise ApiError(404, f"no instance named {body.get('target')!r}", err_type="not_found_error")
        if not cluster.instances[target].role.decodes:
            raise ApiError(409, f"instance {body.get('target')!r} does not decode (role "
                                f"{cluster.instances[target].role.value})", err_type="invalid_request_error",
                           param="target")
        control.execute(Migrate(flow.state.req_id, target), stage_index=-1)
        return web.json_response({"req_id": flow.state.req_id, "target": target, "status": "requested"},
                                 status=202)

    async def decisions(_request: web.Request) -> web.Response:
        return web.json_response({"decisions": control.decision_log()})

    app.router.add_get("/admin/requests", _guarded(config, list_requests, logins))
    app.router.add_post("/admin/requests/{req_id}/migrate", _guarded(config, migrate, logins))
    app.router.add_get("/admin/decisions", _guarded(config, decisions, logins))
    app.router.add_get("/admin/instances", _guarded(config, list_instances, logins))
    app.router.add_post("/admin/instances", _guarded(config, add_instance, logins))
    app.router.add_delete("/admin/instances/{key}", _guarded(config, remove_instance, logins))
    app.router.add_patch("/admin/instances/{key}", _guarded(config, change_role, logins))
    app.router.add_get("/admin/policy", _guarded(config, policy, logins))
    app.router.add_get("/admin/kv", _guarded(config, kv_state, logins))
    if hub is not None:
        app.router.add_get("/admin/workers", _guarded(config, workers, logins))


def _describe(flow: InFlight, now_s: float) -> dict:
    """A request's live state for the admin API."""
    st = flow.state
    return {"req_id": st.req_id, "x_request_id": flow.client_xid, "path": flow.path,
            "phase": st.phase.value, "prefill_instance": st.prefill_instance,
            "decode_instance": st.decode_instance, "prompt_tokens": st.request.prompt_tokens,
            "generated_tokens": st.generated_tokens, "migrations": st.migrations,
            "age_s": round(now_s - st.request.arrival_s, 3)}
