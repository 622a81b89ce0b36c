"""Gateway configuration from YAML: listen address, policy, engines and their roles.

Every error names the key at fault (``engines[1].role: ...``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from baton.core.errors import ConfigError
from baton.gateway.engine_types import DEFAULT_METRIC_NAMES, ENGINE_TYPES
from baton.gateway.pool import parse_discovery
from baton.core.instance import Role
from baton.gateway.outliers import OutlierSettings
from baton.gateway.hidden import MAX_DIM, is_z85_key, public_key_from_file
from baton.gateway.urls import public_url
from baton.yamlfile import read_yaml

PD_PROTOCOLS = ("nixl", "sglang")


@dataclass(slots=True)
class EngineSpec:
    """One engine: base URL, role, engine type (metric names and protocol fields), model,
    KV capacity in blocks (None: the preset's), SGLang's bootstrap port, and the
    credential the gateway presents to it (``api_key``, or ``api_key_env`` in YAML)."""

    url: str
    role: Role
    name: str = ""
    engine_type: str = "vllm"
    model: str | None = None
    kv_blocks: int | None = None
    bootstrap_port: int | None = None
    metric_names: dict[str, str | None] = field(default_factory=dict)
    api_key: str | None = None  # sent to this engine as a bearer token (never the client's)
    hidden_states: str | None = None  # ZMQ address of the engine's hidden-state plugin (gateway.hidden)
    hidden_states_key: str | None = None  # its CURVE public key (Z85); None: unauthenticated feed
    kv_events: str | None = None  # ZMQ address of its KV-event publisher (vLLM's --kv-events-config endpoint)
    kv_events_topic: str = ""     # the topic its batches carry ("" accepts any)
    sidecar: str | None = None    # baton epp: its `baton sidecar` URL (a PD decode leg goes there)

    @property
    def host(self) -> str:
        return urlparse(self.url).hostname or "127.0.0.1"


@dataclass(slots=True)
class GatewayConfig:
    """Everything ``baton serve`` needs. Times are seconds, sizes bytes."""

    engines: list[EngineSpec]
    host: str = "127.0.0.1"
    port: int = 8000
    model: str | None = None
    policy: Any = "least-loaded"
    preset: str = "llama-3.1-8b@a100-80g"
    pd_protocol: str = "nixl"
    admin_token: str | None = None
    # with api_keys, /metrics needs this token or the admin token (a tenant must not read the
    # others' activity from it); also BATON_METRICS_TOKEN
    metrics_token: str | None = None
    scrape_interval_s: float = 1.0
    link_gbps: float = 100.0  # each engine's link for KV (Gb/s): what policies cost a KV move at
    unhealthy_after_failures: int = 3
    scrape_timeout_s: float = 5.0
    max_inflight: int = 1024
    max_inflight_per_client: int | None = None  # one API key's (or address's) share; None: half of max_inflight
    client_write_timeout_s: float = 30.0  # a stream whose client reads nothing for this long is dropped
    # 2 MiB holds the longest prompt max_prompt_tokens allows (131,072 tokens) in any
    # form: token ids take at most 8 bytes each ("151935, "), text about 4-6 bytes per
    # token, 12 when every character is a JSON \u escape; 413 beyond it (raise it for
    # inline images). Larger bodies only cost parse time on the gateway.
    max_body_bytes: int = 2 * 1024 * 1024
    upstream_timeout_s: float = 600.0
    connect_timeout_s: float = 3.0
    max_recoveries: int = 2
    max_engine_deaths: int = 2
    # an engine fault counts towards max_engine_deaths only within this many seconds of its
    # leg's start: a request that crashes engines does so as it arrives, while one that ran
    # well there for longer (a long decode when an engine is killed) is not the cause
    death_window_s: float = 10.0
    # read deadlines on legs: before a leg's first token 3 x the predicted prefill + 5 s
    # (colocated and deflected legs wait for a whole prefill), then max(5 s, 50 x the
    # instance's recent token interval); past them the engine counts as hung
    first_token_timeout_factor: float = 3.0
    first_token_timeout_base_s: float = 5.0
    token_timeout_factor: float = 50.0
    token_timeout_min_s: float = 5.0
    # a connection must send its (next) request head in this time: aiohttp has one timer for
    # a fresh connection's head and a keep-alive connection's idle time. 75 s is nginx's
    # keep-alive default: a client that reuses idle connections for less (aiohttp 15 s,
    # httpx 5 s) never races the gateway's close (at 10 s, 4 of 1,209 soak requests did)
    header_timeout_s: float = 75.0
    body_timeout_s: float = 10.0        # and its body in this time (408 otherwise)
    # bodies still arriving do not count towards max_inflight. One still arriving after
    # slow_body_after_s is slow: slow ones are capped apart (429 beyond the caps), and a slow
    # one arriving at under min_body_bytes_per_s on average is dropped (408); a body that
    # came with its head counts nowhere (gateway.bodies)
    max_body_reads: int = 256
    max_body_reads_per_client: int = 32  # per client address
    slow_body_after_s: float = 1.0
    min_body_bytes_per_s: float = 4096.0
    max_prompt_tokens: int = 131072     # longer token-id (or estimated text) prompts are a 400
    default_max_tokens: int = 16
    decisions_log_size: int = 10_000
    block_size: int = 16
    seed: int = 0
    prefill_inflight_limit: int = 2     # held-prefill mode (policies that re-plan queued prefills)
    ttft_slo_s: float | None = None     # latency SLOs for SLO-aware policies (Arrow)
    tpot_slo_s: float | None = None
    log_level: str = "INFO"             # DEBUG adds one line per finished request
    access_log: bool = False            # one aiohttp access line per HTTP request (INFO)
    # a streamed response whose first leg speaks the client's format (same endpoint, same
    # model name) gets that leg's chunks as the engine wrote them (token id lists nulled
    # when the client did not ask for them); False rebuilds every chunk (the slow path)
    verbatim_relay: bool = True
    # baton epp: the ext_proc (gRPC) port Envoy calls, and whether Envoy streams response
    # bodies to it (token counts, a request booked until its response ends; without them
    # a request counts as decoding from its response headers and is released there)
    epp_port: int = 9002
    epp_response_bodies: bool = True
    # baton serve: relay worker processes (gateway.workers; 1: one process does everything,
    # 0 or "auto": one per core) and how often a relay reports decode progress to control
    workers: int | str = 1
    relay_report_interval_s: float = 0.005
    # engines from an InferencePool's pods (gateway.discovery.DiscoverySettings; None: only `engines`)
    discovery: Any = None
    # environment variables an admin-API call may name as an engine's api_key_env (none by
    # default: any other name is refused with one message, set or not)
    admin_env_allowlist: tuple[str, ...] = ()
    # Envoy-style outlier ejection of engines whose legs keep failing (gateway.outliers)
    outliers: OutlierSettings = field(default_factory=OutlierSettings)
    # keys a client must present on /v1/* as "Authorization: Bearer <key>" (none: open,
    # as before); from ``api_keys`` and/or ``api_keys_file`` (one key per line)
    api_keys: tuple[str, ...] = ()
    # hidden-state feeds (gateway.hidden): the gateway's CURVE secret key (Z85, read from the
    # variable hidden_states_client_key_env names; None: a fresh keypair per run), and
    # per engine socket at most this many states a second and this many floats a state
    hidden_states_client_key: str | None = field(default=None, repr=False)
    hidden_states_rate_per_s: float = 5000.0
    hidden_states_max_dim: int = MAX_DIM
    # KV-event feeds (gateway.kv_feed): per engine socket at most this many batches a second
    # and this many bytes a batch; a tokenizer.json to key text prompts for prefix-aware
    # policies (token-id prompts need none; chat prompts are not keyed)
    kv_events_rate_per_s: float = 2000.0
    kv_events_max_bytes: int = 16 * 1024 * 1024
    tokenizer: str | None = None


def _require(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def parse_engine(raw: Any, where: str, env_allowlist: frozenset[str] | None = None) -> EngineSpec:
    """One ``engines[i]`` entry (also the body of the admin API's add-instance call, which
    passes ``env_allowlist``: the only variables its ``api_key_env`` may name)."""
    _require(isinstance(raw, Mapping), where, "expected a mapping with url and role")
    unknown = sorted(set(raw) - {"url", "role", "name", "type", "model", "kv_blocks", "bootstrap_port",
                                 "metric_names", "api_key", "api_key_env", "hidden_states",
                                 "hidden_states_key", "hidden_states_key_file", "kv_events", "kv_events_topic",
                                 "sidecar"})
    _require(not unknown, f"{where}.{unknown[0] if unknown else ''}", "unknown key")
    url = raw.get("url")
    _require(isinstance(url, str) and urlparse(url).scheme in ("http", "https") and bool(urlparse(url).netloc),
             f"{where}.url", f"expected an http(s) URL, got {public_url(url) if isinstance(url, str) else url!r}")
    try:
        role = Role(raw.get("role"))
    except ValueError:
        raise ConfigError(f"{where}.role: expected prefill, decode or mixed, got {raw.get('role')!r}") from None
    etype = raw.get("type", "vllm")
    _require(etype in ENGINE_TYPES, f"{where}.type", f"expected one of {', '.join(ENGINE_TYPES)}")
    for key in ("kv_blocks", "bootstrap_port"):
        v = raw.get(key)
        _require(v is None or (isinstance(v, int) and v > 0), f"{where}.{key}", "expected a positive integer")
    names = dict(DEFAULT_METRIC_NAMES[etype])
    overrides = raw.get("metric_names") or {}
    _require(isinstance(overrides, Mapping) and set(overrides) <= set(names), f"{where}.metric_names",
             f"expected a mapping with keys among {', '.join(names)}")
    names.update(overrides)
    name = str(raw.get("name") or urlparse(url).netloc)
    # admin calls address instances by name or numeric id, so a name must not look like an id
    _require(not name.isdigit(), f"{where}.name", f"must not be all digits, got {name!r}")
    key = raw.get("api_key")
    if raw.get("api_key_env") is not None:
        env = str(raw["api_key_env"])
        key = os.environ.get(env) if env_allowlist is None or env in env_allowlist else None
        # one message whether the variable exists or not: the admin API must not tell
        _require(key is not None, f"{where}.api_key_env", f"environment variable {env} is not set" if
                 env_allowlist is None else f"environment variable {env} is not in admin_env_allowlist or not set")
    _require(key is None or isinstance(key, str), f"{where}.api_key", "expected a string")
    hidden = raw.get("hidden_states")
    _require(hidden is None or (isinstance(hidden, str) and hidden.startswith(("tcp://", "ipc://"))),
             f"{where}.hidden_states", f"expected a ZMQ address such as tcp://127.0.0.1:5599, got {hidden!r}")
    kv = raw.get("kv_events")
    _require(kv is None or (isinstance(kv, str) and kv.startswith(("tcp://", "ipc://")) and "*" not in kv),
             f"{where}.kv_events", f"expected the ZMQ address to connect to, such as tcp://127.0.0.1:5557, got {kv!r}")
    topic = raw.get("kv_events_topic", "")
    _require(isinstance(topic, str), f"{where}.kv_events_topic", "expected a string")
    sidecar = raw.get("sidecar")
    _require(sidecar is None or (isinstance(sidecar, str) and urlparse(sidecar).scheme == "http"
                                 and bool(urlparse(sidecar).port)),
             f"{where}.sidecar", f"expected the sidecar's http://host:port URL, got {sidecar!r}")
    _require(sidecar is None or role.decodes, f"{where}.sidecar", "only an engine that decodes has a sidecar")
    return EngineSpec(url.rstrip("/"), role, name, etype, raw.get("model"), raw.get("kv_blocks"),
                      raw.get("bootstrap_port"), names, key, hidden,
                      _hidden_key(raw, where, admin=env_allowlist is not None), kv, topic,
                      sidecar.rstrip("/") if sidecar else None)


def _hidden_key(raw: Mapping[str, Any], where: str, admin: bool) -> str | None:
    """An engine's CURVE public key: ``hidden_states_key`` (Z85) or the ``public-key`` of
    the ZMQ certificate file ``hidden_states_key_file`` names (``NAME.key``; not through
    the admin API, which must not probe the gateway's files)."""
    key, path = raw.get("hidden_states_key"), raw.get("hidden_states_key_file")
    _require(path is None or not admin, f"{where}.hidden_states_key_file", "not accepted by the admin API")
    _require(key is None or path is None, f"{where}.hidden_states_key", "give the key or its file, not both")
    if path is not None:
        try:
            key = public_key_from_file(str(path))
        except OSError as err:
            raise ConfigError(f"{where}.hidden_states_key_file: cannot read {path}: {err.strerror}") from None
        _require(key is not None, f"{where}.hidden_states_key_file", f"no Z85 public-key in {path}")
    _require(key is None or is_z85_key(key), f"{where}.hidden_states_key",
             "expected a CURVE public key: 40 Z85 characters, as zmq.curve_keypair() writes them")
    _require(key is None or raw.get("hidden_states") is not None, f"{where}.hidden_states_key",
             "needs hidden_states (the address it authenticates)")
    return key


_SCALARS = {"host": str, "port": int, "model": str, "preset": str, "pd_protocol": str,
            "admin_token": str, "metrics_token": str, "scrape_interval_s": (int, float), "link_gbps": (int, float), "scrape_timeout_s": (int, float), "unhealthy_after_failures": int,
            "max_inflight": int, "max_inflight_per_client": int, "client_write_timeout_s": (int, float),
            "max_body_bytes": int, "upstream_timeout_s": (int, float),
            "connect_timeout_s": (int, float), "max_recoveries": int, "max_engine_deaths": int,
            "death_window_s": (int, float),
            "first_token_timeout_factor": (int, float), "first_token_timeout_base_s": (int, float),
            "token_timeout_factor": (int, float), "token_timeout_min_s": (int, float),
            "header_timeout_s": (int, float), "body_timeout_s": (int, float), "max_prompt_tokens": int,
            "default_max_tokens": int, "decisions_log_size": int, "block_size": int, "seed": int,
            "log_level": str, "access_log": bool, "verbatim_relay": bool,
            "epp_port": int, "epp_response_bodies": bool, "workers": (int, str), "relay_report_interval_s": (int, float), "ttft_slo_s": (int, float), "tpot_slo_s": (int, float),
            "prefill_inflight_limit": int, "max_body_reads": int, "max_body_reads_per_client": int,
            "slow_body_after_s": (int, float), "min_body_bytes_per_s": (int, float),
            "hidden_states_rate_per_s": (int, float), "hidden_states_max_dim": int,
            "kv_events_rate_per_s": (int, float), "kv_events_max_bytes": int, "tokenizer": str}


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_LISTS = {"engines", "policy", "admin_env_allowlist", "outlier_detection", "api_keys", "api_keys_file",
          "hidden_states_client_key_env", "discovery"}


def parse_config(raw: Any, source: str = "config") -> GatewayConfig:
    """Validate a parsed YAML document."""
    _require(isinstance(raw, Mapping), source, "expected a mapping at the top level")
    unknown = sorted(set(raw) - set(_SCALARS) - _LISTS)
    _require(not unknown, f"{source}: {unknown[0] if unknown else ''}", "unknown key")
    discovery = parse_discovery(raw.get("discovery"))
    engines = raw.get("engines", [] if discovery else None)
    _require(isinstance(engines, list) and (bool(engines) or discovery is not None), f"{source}: engines",
             "expected a non-empty list (or a discovery section that finds them)")
    specs = [parse_engine(e, f"engines[{i}]") for i, e in enumerate(engines)]
    names = [s.name for s in specs]
    _require(len(set(names)) == len(names), "engines", "engine names must be unique")
    kwargs: dict[str, Any] = {}
    for key, typ in _SCALARS.items():
        if raw.get(key) is not None:
            kwargs[key] = _typed(raw[key], typ, key)
    allow = raw.get("admin_env_allowlist") or []
    _require(isinstance(allow, list) and all(isinstance(v, str) for v in allow), "admin_env_allowlist",
             "expected a list of environment variable names")
    cfg = GatewayConfig(specs, policy=raw.get("policy", "least-loaded"), admin_env_allowlist=tuple(allow),
                        discovery=discovery,
                        outliers=parse_outliers(raw.get("outlier_detection")),
                        api_keys=parse_api_keys(raw.get("api_keys"), raw.get("api_keys_file")), **kwargs)
    _require(cfg.log_level.upper() in LOG_LEVELS, "log_level", f"expected one of {', '.join(LOG_LEVELS)}")
    _require(cfg.pd_protocol in PD_PROTOCOLS, "pd_protocol", f"expected one of {', '.join(PD_PROTOCOLS)}")
    for key in ("scrape_interval_s", "link_gbps", "scrape_timeout_s", "max_inflight", "max_body_bytes", "upstream_timeout_s",
                "connect_timeout_s", "block_size", "unhealthy_after_failures", "max_engine_deaths", "death_window_s",
                "default_max_tokens", "decisions_log_size", "first_token_timeout_factor",
                "first_token_timeout_base_s", "token_timeout_factor", "token_timeout_min_s",
                "header_timeout_s", "body_timeout_s", "max_prompt_tokens", "prefill_inflight_limit",
                "max_body_reads", "max_body_reads_per_client", "slow_body_after_s",
                "min_body_bytes_per_s", "hidden_states_rate_per_s", "hidden_states_max_dim",
                "kv_events_rate_per_s", "kv_events_max_bytes", "epp_port"):
        _require(getattr(cfg, key) > 0, key, "must be positive")
    _require(cfg.relay_report_interval_s > 0, "relay_report_interval_s", "must be positive")
    _require(cfg.client_write_timeout_s > 0, "client_write_timeout_s", "must be positive")
    _require(cfg.max_inflight_per_client is None or cfg.max_inflight_per_client > 0, "max_inflight_per_client",
             "must be positive")
    check_workers(cfg)
    cfg.hidden_states_client_key = _client_key(raw.get("hidden_states_client_key_env"))
    for key in ("ttft_slo_s", "tpot_slo_s"):
        _require(getattr(cfg, key) is None or getattr(cfg, key) > 0, key, "must be positive")
    cfg.admin_token = cfg.admin_token or os.environ.get("BATON_ADMIN_TOKEN") or None
    cfg.metrics_token = cfg.metrics_token or os.environ.get("BATON_METRICS_TOKEN") or None
    _require(not cfg.api_keys or bool(cfg.metrics_token or cfg.admin_token), "metrics_token",
             "api_keys are set: /metrics then needs metrics_token or admin_token (one tenant could read the "
             "others' activity from it)")
    return cfg


def check_workers(cfg: GatewayConfig) -> None:
    """``workers``: a count of relay processes, or "auto"; and nothing a relay cannot carry."""
    w = cfg.workers
    _require(w == "auto" or (isinstance(w, int) and not isinstance(w, bool) and w >= 0), "workers",
             f"expected a number of relay processes (0 or 'auto': one per core), got {w!r}")
    if relay_workers(cfg) > 1:
        tagged = [e.name for e in cfg.engines if e.hidden_states]
        _require(not tagged, "workers", f"engines with a hidden-state feed ({', '.join(tagged)}) need workers: 1 "
                 "(the feed's tags live in the process that sent the leg)")


def relay_workers(cfg: GatewayConfig) -> int:
    """The number of relay processes ``workers`` asks for (1: no separate control process)."""
    if cfg.workers == "auto" or cfg.workers == 0:
        return max(1, os.cpu_count() or 1)
    return int(cfg.workers)


def _typed(value: Any, typ: Any, where: str) -> Any:
    ok = isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
    _require(ok, where, f"expected {getattr(typ, '__name__', 'a number')}, got {value!r}")
    return value


def parse_outliers(raw: Any) -> OutlierSettings:
    """The ``outlier_detection`` mapping: any of ``OutlierSettings``' fields; numbers
    must be positive (percentages at most 100)."""
    if raw is None:
        return OutlierSettings()
    _require(isinstance(raw, Mapping), "outlier_detection", "expected a mapping")
    known = {f.name: f for f in fields(OutlierSettings)}
    unknown = sorted(set(raw) - set(known))
    _require(not unknown, f"outlier_detection.{unknown[0] if unknown else ''}", "unknown key")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        default = getattr(OutlierSettings(), key)
        typ = bool if isinstance(default, bool) else int if isinstance(default, int) else (int, float)
        values[key] = _typed(value, typ, f"outlier_detection.{key}")
        if typ is not bool:
            _require(value > 0, f"outlier_detection.{key}", "must be positive")
            _require(value <= 100 or not key.endswith(("percent", "threshold")),
                     f"outlier_detection.{key}", "is a percentage: at most 100")
    return OutlierSettings(**values)


def parse_api_keys(keys: Any, path: Any) -> tuple[str, ...]:
    """Client API keys from the config's ``api_keys`` list and the ``api_keys_file`` (one
    key per line; blank lines and ``#`` comments skipped). Keys are never echoed back."""
    _require(keys is None or (isinstance(keys, list) and all(isinstance(k, str) and k.strip() for k in keys)),
             "api_keys", "expected a list of non-empty strings")
    out = [k.strip() for k in keys or []]
    if path is not None:
        _require(isinstance(path, str), "api_keys_file", "expected a file path")
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"api_keys_file: cannot read {path}: {type(exc).__name__}") from None
        from_file = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        _require(bool(from_file), "api_keys_file", f"{path} holds no key")
        out += from_file
    return tuple(out)


def _client_key(env: Any) -> str | None:
    """The gateway's CURVE secret key from the environment variable ``env`` names (never
    inline in the config, never in a message)."""
    if env is None:
        return None
    _require(isinstance(env, str), "hidden_states_client_key_env", "expected an environment variable name")
    key = os.environ.get(env)
    _require(key is not None, "hidden_states_client_key_env", f"environment variable {env} is not set")
    _require(is_z85_key(key), "hidden_states_client_key_env",
             f"{env} must hold a CURVE secret key: 40 Z85 characters")
    return key


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway YAML file."""
    return parse_config(read_yaml(path), str(path))
