"""Gateway configuration from YAML: listen address, policy, engines and their roles.

Every error names the key at fault (``engines[1].role: ...``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.yamlfile import read_yaml

ENGINE_TYPES = ("vllm", "sglang")
PD_PROTOCOLS = ("nixl", "sglang")

# Scraped names per engine type: running, waiting, KV usage (0..1), preemptions (counter).
DEFAULT_METRIC_NAMES: Mapping[str, dict[str, str | None]] = {
    "vllm": {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
             "kv_usage": "vllm:kv_cache_usage_perc", "preemptions": "vllm:num_preemptions_total"},
    "sglang": {"running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs",
               "kv_usage": "sglang:token_usage", "preemptions": None},
}


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
    scrape_interval_s: float = 1.0
    unhealthy_after_failures: int = 3
    scrape_timeout_s: float = 5.0
    max_inflight: int = 1024
    # 2 MiB holds the longest prompt max_prompt_tokens allows (131,072 tokens) in any
    # form: token ids take at most 8 bytes each ("151935, "), text about 4-6 bytes per
    # token, 12 when every character is a JSON \u escape; 413 beyond it (raise it for
    # inline images). Larger bodies only cost parse time on the gateway.
    max_body_bytes: int = 2 * 1024 * 1024
    upstream_timeout_s: float = 600.0
    connect_timeout_s: float = 3.0
    max_recoveries: int = 2
    max_engine_deaths: int = 2
    # read deadlines on legs: before a leg's first token 3 x the predicted prefill + 5 s
    # (colocated and deflected legs wait for a whole prefill), then max(5 s, 50 x the
    # instance's recent token interval); past them the engine counts as hung
    first_token_timeout_factor: float = 3.0
    first_token_timeout_base_s: float = 5.0
    token_timeout_factor: float = 50.0
    token_timeout_min_s: float = 5.0
    header_timeout_s: float = 10.0      # a connection must send its request head in this time
    body_timeout_s: float = 10.0        # and its body in this time (408 otherwise)
    # bodies still arriving do not count towards max_inflight; they are capped apart (429)
    max_body_reads: int = 256
    max_body_reads_per_client: int = 32  # per client address
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
    # environment variables an admin-API call may name as an engine's api_key_env (none by
    # default: any other name is refused with one message, set or not)
    admin_env_allowlist: tuple[str, ...] = ()


def public_url(url: str) -> str:
    """``url`` without user:password, for anything a person or a client may read."""
    parts = urlparse(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc).geturl()


def _require(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{where}: {msg}")


def parse_engine(raw: Any, where: str, env_allowlist: frozenset[str] | None = None) -> EngineSpec:
    """One ``engines[i]`` entry (also the body of the admin API's add-instance call, which
    passes ``env_allowlist``: the only variables its ``api_key_env`` may name)."""
    _require(isinstance(raw, Mapping), where, "expected a mapping with url and role")
    unknown = sorted(set(raw) - {"url", "role", "name", "type", "model", "kv_blocks", "bootstrap_port",
                                 "metric_names", "api_key", "api_key_env", "hidden_states"})
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
    return EngineSpec(url.rstrip("/"), role, name, etype,
                      raw.get("model"), raw.get("kv_blocks"), raw.get("bootstrap_port"), names, key, hidden)


_SCALARS = {"host": str, "port": int, "model": str, "preset": str, "pd_protocol": str,
            "admin_token": str, "scrape_interval_s": (int, float), "scrape_timeout_s": (int, float), "unhealthy_after_failures": int,
            "max_inflight": int, "max_body_bytes": int, "upstream_timeout_s": (int, float),
            "connect_timeout_s": (int, float), "max_recoveries": int, "max_engine_deaths": int,
            "first_token_timeout_factor": (int, float), "first_token_timeout_base_s": (int, float),
            "token_timeout_factor": (int, float), "token_timeout_min_s": (int, float),
            "header_timeout_s": (int, float), "body_timeout_s": (int, float), "max_prompt_tokens": int,
            "default_max_tokens": int, "decisions_log_size": int, "block_size": int, "seed": int,
            "log_level": str, "access_log": bool, "verbatim_relay": bool, "ttft_slo_s": (int, float), "tpot_slo_s": (int, float),
            "prefill_inflight_limit": int, "max_body_reads": int, "max_body_reads_per_client": int}


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def parse_config(raw: Any, source: str = "config") -> GatewayConfig:
    """Validate a parsed YAML document."""
    _require(isinstance(raw, Mapping), source, "expected a mapping at the top level")
    unknown = sorted(set(raw) - set(_SCALARS) - {"engines", "policy", "admin_env_allowlist"})
    _require(not unknown, f"{source}: {unknown[0] if unknown else ''}", "unknown key")
    engines = raw.get("engines")
    _require(isinstance(engines, list) and bool(engines), f"{source}: engines", "expected a non-empty list")
    specs = [parse_engine(e, f"engines[{i}]") for i, e in enumerate(engines)]
    names = [s.name for s in specs]
    _require(len(set(names)) == len(names), "engines", "engine names must be unique")
    kwargs: dict[str, Any] = {}
    for key, typ in _SCALARS.items():
        if raw.get(key) is not None:
            ok = isinstance(raw[key], typ) and (typ is bool or not isinstance(raw[key], bool))
            _require(ok, key, f"expected {getattr(typ, '__name__', 'a number')}, got {raw[key]!r}")
            kwargs[key] = raw[key]
    allow = raw.get("admin_env_allowlist") or []
    _require(isinstance(allow, list) and all(isinstance(v, str) for v in allow), "admin_env_allowlist",
             "expected a list of environment variable names")
    cfg = GatewayConfig(specs, policy=raw.get("policy", "least-loaded"), admin_env_allowlist=tuple(allow), **kwargs)
    _require(cfg.log_level.upper() in LOG_LEVELS, "log_level", f"expected one of {', '.join(LOG_LEVELS)}")
    _require(cfg.pd_protocol in PD_PROTOCOLS, "pd_protocol", f"expected one of {', '.join(PD_PROTOCOLS)}")
    for key in ("scrape_interval_s", "scrape_timeout_s", "max_inflight", "max_body_bytes", "upstream_timeout_s",
                "connect_timeout_s", "block_size", "unhealthy_after_failures", "max_engine_deaths",
                "default_max_tokens", "decisions_log_size", "first_token_timeout_factor",
                "first_token_timeout_base_s", "token_timeout_factor", "token_timeout_min_s",
                "header_timeout_s", "body_timeout_s", "max_prompt_tokens", "prefill_inflight_limit",
                "max_body_reads", "max_body_reads_per_client"):
        _require(getattr(cfg, key) > 0, key, "must be positive")
    for key in ("ttft_slo_s", "tpot_slo_s"):
        _require(getattr(cfg, key) is None or getattr(cfg, key) > 0, key, "must be positive")
    cfg.admin_token = cfg.admin_token or os.environ.get("BATON_ADMIN_TOKEN") or None
    return cfg


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway YAML file."""
    return parse_config(read_yaml(path), str(path))
