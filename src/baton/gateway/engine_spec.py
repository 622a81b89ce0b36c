"""One engine behind the gateway (a config's ``engines[i]``, a discovered pod, or the body of
the admin API's add-instance call): its settings, defined once (``core.settings``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

import baton.core.settings as settings
from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.core.settings import setting
from baton.gateway.engine_types import DEFAULT_METRIC_NAMES, ENGINE_TYPES
from baton.gateway.hidden import is_z85_key, public_key_from_file
from baton.gateway.urls import public_url


def http_url(value: str) -> str | None:
    """What is wrong with ``value`` as an engine's base URL (None: nothing)."""
    u = urlparse(value)
    if u.scheme not in ("http", "https") or not u.netloc or not u.hostname:
        return f"expected an http(s) URL, got {public_url(value)!r}"
    try:
        port = u.port  # urllib raises on a port outside 0-65535
    except ValueError:
        port = -1
    return None if port is None or 0 < port < 65536 else \
        f"expected a port in 1-65535, got {public_url(value)!r}"


def zmq_connect_address(value: str) -> str | None:
    """What is wrong with ``value`` as a ZMQ address to connect to."""
    return None if value.startswith(("tcp://", "ipc://")) and "*" not in value else \
        f"expected a ZMQ address to connect to, such as tcp://127.0.0.1:5557, got {value!r}"


WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "")


def zmq_listen_address(value: str) -> str | None:
    """What is wrong with ``value`` as a ZMQ address for the gateway to bind: one named
    interface (loopback, or an address chosen on purpose), never every interface."""
    if value.startswith("ipc://") and len(value) > len("ipc://"):
        return None
    host, _, port = value.removeprefix("tcp://").rpartition(":")
    if not value.startswith("tcp://") or not port.isdigit() or not 0 < int(port) < 65536:
        return f"expected a ZMQ address to bind, such as tcp://127.0.0.1:5557, got {value!r}"
    if host in WILDCARD_HOSTS:
        return f"{value!r} binds every interface: name one (tcp://127.0.0.1:PORT keeps the feed on this host)"
    return None


def _sidecar_url(value: str) -> str | None:
    u = urlparse(value)
    return None if u.scheme == "http" and u.port else f"expected the sidecar's http://host:port URL, got {value!r}"


def _z85_key(value: str) -> str | None:
    return None if is_z85_key(value) else "expected a CURVE public key: 40 Z85 characters, as zmq.curve_keypair() writes them"


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
MAX_NAME_CHARS = 128
MAX_KV_BLOCKS = 1 << 32  # about 64 G tokens at 16 a block: far beyond any engine's cache


def _engine_name(value: str) -> str | None:
    """A name is a metric label, a log field and an admin API path segment: letters,
    digits and ``-_.:``, at most ``MAX_NAME_CHARS``; and not all digits (admin calls address
    instances by name or numeric id, so a name must not look like an id)."""
    if len(value) > MAX_NAME_CHARS:
        return f"at most {MAX_NAME_CHARS} characters, got {len(value)}"
    bad = sorted(set(value) - NAME_CHARS)
    if bad:
        return f"only letters, digits and -_.: are allowed, got {''.join(bad)[:8]!r} in it"
    return f"must not be all digits, got {value!r}" if value.isdigit() else None


@dataclass(slots=True)
class EngineSpec:
    """One engine: its base URL, role, engine type (metric names and protocol fields),
    model, KV capacity, SGLang's bootstrap port, the credential the gateway presents to it,
    and its optional feeds (hidden states, KV events) and sidecar."""

    url: str = setting(doc="the engine's base URL (http or https)", check=http_url)
    role: Role = setting(doc="what the engine runs: prefill, decode or mixed (both)")
    name: str = setting("", doc="its name in metrics, logs and the admin API: letters, digits and -_.:, at most "
                                    "128 (default: host:port)", check=_engine_name)
    engine_type: str = setting("vllm", key="type", choices=tuple(ENGINE_TYPES),
                               doc="engine kind: its metric names and PD protocol fields")
    model: str | None = setting(None, doc="the model it serves (default: asked from its /v1/models)")
    kv_blocks: int | None = setting(None, gt=0, le=MAX_KV_BLOCKS, unit="blocks",
                                    doc="KV cache capacity (default: the preset's)")
    bootstrap_port: int | None = setting(None, gt=0, le=65535, doc="SGLang's disaggregation bootstrap port")
    metric_names: dict[str, str | None] = setting(
        factory=dict, doc="Prometheus names of running, waiting, kv_usage and preemptions, over the type's "
                          "(null: the engine has none)")
    api_key: str | None = setting(None, secret=True, doc="bearer token the gateway sends it (never the client's)")
    hidden_states: str | None = setting(None, check=zmq_connect_address,
                                        doc="ZMQ address of its hidden-state plugin (length prediction)")
    hidden_states_key: str | None = setting(None, check=_z85_key,
                                            doc="the feed's CURVE public key (Z85); none: unauthenticated")
    kv_events: str | None = setting(None, check=zmq_connect_address,
                                    doc="ZMQ address of its KV-event publisher (vLLM's --kv-events-config endpoint)")
    kv_events_listen: str | None = setting(None, check=zmq_listen_address,
                                           doc="ZMQ address the gateway binds for its KV events; the engine's "
                                               "publisher connects there (vLLM's endpoint without a wildcard): "
                                               "no one else can subscribe to its prompts' token ids")
    kv_events_topic: str = setting("", doc="the topic its KV-event batches carry (empty: any)")
    sidecar: str | None = setting(None, check=_sidecar_url, doc="baton epp: its `baton sidecar` URL "
                                                                "(a PD decode leg goes there)")
    api_key_env: str | None = setting(None, doc="environment variable holding api_key")
    hidden_states_key_file: str | None = setting(None, doc="ZMQ certificate file (NAME.key) holding "
                                                          "hidden_states_key (not through the admin API)")

    @property
    def host(self) -> str:
        return urlparse(self.url).hostname or "127.0.0.1"

    @property
    def kv_feed(self) -> str | None:
        """The address of its KV-event feed (the gateway binds ``kv_events_listen``, or
        connects to ``kv_events``), or None."""
        return self.kv_events_listen or self.kv_events


def parse_engine(raw: Any, where: str, env_allowlist: frozenset[str] | None = None) -> EngineSpec:
    """One ``engines[i]`` entry (also the body of the admin API's add-instance call, which
    passes ``env_allowlist``: the only variables its ``api_key_env`` may name)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping with url and role")
    spec: EngineSpec = settings.parse(EngineSpec, raw, where)
    names = dict(DEFAULT_METRIC_NAMES[spec.engine_type])
    for k in spec.metric_names:
        if k not in names:
            raise ConfigError(f"{where}.metric_names.{k}: unknown metric; expected keys among {', '.join(names)}")
    names.update(spec.metric_names)
    if spec.kv_events and spec.kv_events_listen:
        raise ConfigError(f"{where}.kv_events_listen: set kv_events (the gateway connects to the engine's publisher) "
                          "or kv_events_listen (the gateway binds, the engine connects), not both")
    if spec.sidecar is not None and not spec.role.decodes:
        raise ConfigError(f"{where}.sidecar: only an engine that decodes has a sidecar")
    return replace(spec, url=spec.url.rstrip("/"), name=spec.name or urlparse(spec.url).netloc, metric_names=names,
                   api_key=_api_key(spec, where, env_allowlist),
                   hidden_states_key=_hidden_key(spec, where, admin=env_allowlist is not None),
                   sidecar=spec.sidecar.rstrip("/") if spec.sidecar else None)


def _api_key(spec: EngineSpec, where: str, env_allowlist: frozenset[str] | None) -> str | None:
    if spec.api_key_env is None:
        return spec.api_key
    env = spec.api_key_env
    key = os.environ.get(env) if env_allowlist is None or env in env_allowlist else None
    if key is None:  # one message whether the variable exists or not: the admin API must not tell
        raise ConfigError(f"{where}.api_key_env: environment variable {env} is not set" if env_allowlist is None
                          else f"{where}.api_key_env: environment variable {env} is not in admin_env_allowlist "
                               "or not set")
    return key


def _hidden_key(spec: EngineSpec, where: str, admin: bool) -> str | None:
    """An engine's CURVE public key: ``hidden_states_key`` (Z85) or the ``public-key`` of
    the ZMQ certificate file ``hidden_states_key_file`` names (``NAME.key``; not through
    the admin API, which must not probe the gateway's files)."""
    key, path = spec.hidden_states_key, spec.hidden_states_key_file
    if path is not None and admin:
        raise ConfigError(f"{where}.hidden_states_key_file: not accepted by the admin API")
    if key is not None and path is not None:
        raise ConfigError(f"{where}.hidden_states_key: give the key or its file, not both")
    if path is not None:
        try:
            key = public_key_from_file(path)
        except OSError as err:
            raise ConfigError(f"{where}.hidden_states_key_file: cannot read {path}: {err.strerror}") from None
        if key is None:
            raise ConfigError(f"{where}.hidden_states_key_file: no Z85 public-key in {path}")
        if _z85_key(key):
            raise ConfigError(f"{where}.hidden_states_key_file: {_z85_key(key)}")
    if key is not None and spec.hidden_states is None:
        raise ConfigError(f"{where}.hidden_states_key: needs hidden_states (the address it authenticates)")
    return key
