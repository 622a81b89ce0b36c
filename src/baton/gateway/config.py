"""Gateway configuration from YAML: listen address, policy, engines and their roles. Every
key is defined once, in ``GatewayConfig`` (``core.settings``): its type, default, bounds
and description; errors name the key at fault (``engines[1].role: ...``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import baton.core.settings as settings
from baton.core.errors import ConfigError
from baton.core.flow_control import FlowControlSettings
from baton.core.settings import setting
from baton.gateway.classes import ClassSettings
from baton.gateway.engine_spec import EngineSpec, parse_engine
from baton.gateway.hidden import MAX_DIM, is_z85_key
from baton.gateway.outliers import OutlierSettings
from baton.gateway.pool import DiscoverySettings, parse_discovery
from baton.policies.catalog import check_policy
from baton.yamlfile import read_yaml

__all__ = ["EngineSpec", "GatewayConfig", "load_config", "parse_config", "parse_engine", "relay_workers"]

PD_PROTOCOLS = ("nixl", "sglang")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _workers(value: int | str) -> str | None:
    ok = value == "auto" or (isinstance(value, int) and value >= 0)
    return None if ok else f"expected a number of relay processes (0 or 'auto': one per core), got {value!r}"


def _log_level(value: str) -> str | None:
    return None if value.upper() in LOG_LEVELS else f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}"


def _positive(default: Any, doc: str, unit: str | None = None, **kw: Any) -> Any:
    return setting(default, doc=doc, unit=unit, gt=0, **kw)


@dataclass(slots=True)
class GatewayConfig:
    """Everything ``baton serve`` (and ``baton epp``) reads from its YAML file."""

    engines: list[EngineSpec] = setting(doc="the engines behind the gateway (or a discovery section that finds them)")
    host: str = setting("127.0.0.1", flag=True, doc="address to listen on")
    port: int = setting(8000, flag=True, gt=0, le=65535, doc="port to listen on")
    model: str | None = setting(None, doc="the model name clients send (default: the engines')")
    policy: Any = setting("least-loaded", flag=True, doc="a policy name (`baton list policies`) or {name, stages: [...]}")
    preset: str = setting("llama-3.1-8b@a100-80g", doc="model@gpu performance preset policies predict with")
    pd_protocol: str = setting("nixl", choices=PD_PROTOCOLS, doc="how a decode leg finds its prefilled KV")
    admin_token: str | None = setting(None, secret=True, doc="bearer token for /admin (also BATON_ADMIN_TOKEN)")
    metrics_token: str | None = setting(
        None, secret=True, doc="with api_keys, /metrics needs this token or the admin token (a tenant must not "
                               "read the others' activity from it); also BATON_METRICS_TOKEN")
    scrape_interval_s: float = _positive(1.0, "how often each engine's /metrics is scraped", "s")
    link_gbps: float = _positive(100.0, "each engine's link for KV: what policies cost a KV move at", "Gb/s")
    unhealthy_after_failures: int = _positive(3, "failed scrapes before an engine counts as unhealthy")
    scrape_timeout_s: float = _positive(5.0, "one scrape's deadline", "s")
    max_inflight: int = _positive(1024, "requests admitted at once (429 beyond)")
    max_inflight_per_client: int | None = _positive(None, "one API key's (or address's) share of max_inflight "
                                                          "(default: half)")
    client_write_timeout_s: float = _positive(30.0, "a stream whose client reads nothing for this long is dropped", "s")
    # 2 MiB holds the longest prompt max_prompt_tokens allows (131,072 tokens) in any form:
    # token ids take at most 8 bytes each ("151935, "), text about 4-6 bytes per token, 12
    # when every character is a JSON \u escape. Larger bodies only cost parse time.
    max_body_bytes: int = _positive(2 * 1024 * 1024, "largest request body (413 beyond; raise it for inline "
                                                     "images)", "bytes")
    upstream_timeout_s: float = _positive(600.0, "a leg's whole-response deadline", "s")
    connect_timeout_s: float = _positive(3.0, "deadline to connect to an engine", "s")
    max_recoveries: int = setting(2, ge=0, doc="times a request is resumed on another engine after a failure")
    max_engine_deaths: int = _positive(2, "engine faults a request may cause before it is refused (a "
                                          "request that crashes engines)")
    # a request that crashes engines does so as it arrives, while one that ran well for
    # longer (a long decode when an engine is killed) is not the cause
    death_window_s: float = _positive(10.0, "an engine fault counts towards max_engine_deaths only this soon "
                                            "after its leg's start", "s")
    first_token_timeout_factor: float = _positive(3.0, "a leg's first token is late after this many predicted "
                                                       "prefills + first_token_timeout_base_s")
    first_token_timeout_base_s: float = _positive(5.0, "the fixed part of the first-token deadline", "s")
    token_timeout_factor: float = _positive(50.0, "after its first token, a leg is hung after this many of the "
                                                  "instance's recent token intervals")
    token_timeout_min_s: float = _positive(5.0, "the token deadline's floor", "s")
    # 75 s is nginx's keep-alive default: clients that reuse idle connections for less
    # (aiohttp 15 s, httpx 5 s) never race the gateway's close
    keepalive_timeout_s: float = _positive(75.0, "a connection idle between requests (no byte of a next head) "
                                                 "is closed after this", "s")
    head_timeout_s: float = _positive(10.0, "from a request head's first byte, the whole head must arrive in "
                                            "this time (the connection is closed otherwise)", "s")
    max_partial_heads_per_client: int = _positive(8, "connections of one address part-way through a request "
                                                     "head at once (a further one is closed)")
    body_timeout_s: float = _positive(10.0, "and its body in this time (408 otherwise)", "s")
    max_body_reads: int = _positive(256, "bodies being read at once beyond slow_body_after_s (429 beyond)")
    max_body_reads_per_client: int = _positive(32, "such slow bodies per client address")
    slow_body_after_s: float = _positive(1.0, "a body still arriving after this long is slow", "s")
    min_body_bytes_per_s: float = _positive(4096.0, "a slow body arriving slower than this on average is dropped "
                                                    "(408)", "bytes/s")
    max_prompt_tokens: int = _positive(131072, "longer token-id (or estimated text) prompts are a 400", "tokens")
    default_max_tokens: int = _positive(16, "max_tokens of a request that gives none", "tokens")
    decisions_log_size: int = _positive(10_000, "policy decisions kept for /admin/decisions")
    block_size: int = _positive(16, "tokens per KV block (the engines')", "tokens")
    seed: int = setting(0, ge=0, doc="seed of the policy's random generator")
    prefill_inflight_limit: int = _positive(2, "prefill legs in flight per instance when the policy re-plans "
                                               "queued prefills (held-prefill mode)")
    ttft_slo_s: float | None = _positive(None, "time-to-first-token SLO for SLO-aware policies (Arrow)", "s")
    tpot_slo_s: float | None = _positive(None, "time-per-output-token SLO for SLO-aware policies", "s")
    log_level: str = setting("INFO", check=_log_level, doc="DEBUG adds one line per finished request")
    access_log: bool = setting(False, doc="one aiohttp access line per HTTP request (INFO)")
    verbatim_relay: bool = setting(True, doc="relay a stream's chunks as the engine wrote them when its leg speaks "
                                             "the client's format (false: rebuild every chunk)")
    epp_port: int = setting(9002, flag=True, gt=0, le=65535, doc="baton epp: the ext_proc (gRPC) port Envoy calls")
    epp_fallbacks: int = setting(2, ge=0, le=16, doc="baton epp: endpoints named after the pick, least loaded first, "
                                                     "for the data plane to retry on when the pick cannot be reached "
                                                     "(colocated picks; not with discovery)")
    epp_response_bodies: bool = setting(True, doc="baton epp: Envoy streams response bodies to the picker (token "
                                                  "counts; without them a request is released at its headers)")
    workers: int | str = setting(1, flag=True, check=_workers, doc="relay worker processes (1: one process does everything; "
                                                        "0 or auto: one per core)")
    relay_report_interval_s: float = _positive(0.005, "how often a relay worker reports decode progress", "s")
    discovery: DiscoverySettings | None = setting(None, doc="engines from an InferencePool's pods (Kubernetes)")
    admin_env_allowlist: tuple[str, ...] = setting(
        (), doc="environment variables an admin-API call may name as an engine's api_key_env")
    outliers: OutlierSettings = setting(factory=OutlierSettings, key="outlier_detection",
                                        doc="Envoy-style ejection of engines whose legs keep failing")
    api_keys: tuple[str, ...] = setting((), secret=True, doc="keys a client must present on /v1/* as "
                                                             "`Authorization: Bearer <key>` (none: open)")
    api_keys_file: str | None = setting(None, doc="a file of client keys, one per line (# comments)")
    classes: ClassSettings = setting(factory=ClassSettings, doc="request classes: named objectives (priority band, "
                                                               "SLOs), tenants by API key, client class headers")
    flow_control: FlowControlSettings = setting(factory=FlowControlSettings,
                                                doc="hold requests in priority bands while the engines are saturated; "
                                                    "fair across tenants; shed (429) past a time to live")
    hidden_states_client_key_env: str | None = setting(
        None, doc="environment variable holding the gateway's CURVE secret key for hidden-state feeds "
                  "(none: a fresh keypair per run)")
    hidden_states_rate_per_s: float = _positive(5000.0, "hidden states accepted per engine socket", "1/s")
    hidden_states_max_dim: int = _positive(MAX_DIM, "floats per hidden state")
    kv_events_rate_per_s: float = _positive(2000.0, "KV-event batches accepted per engine socket", "1/s")
    # one engine step's batch: a BlockStored block of 16 tokens is about 75 bytes of msgpack, so
    # 2 MiB holds about 27,000 blocks, 430,000 tokens stored in one step (a step of 32,768
    # batched tokens is about 150 KB)
    kv_events_max_bytes: int = _positive(2 * 1024 * 1024, "largest KV-event batch", "bytes")
    kv_events_verify: bool = setting(True, doc="index an engine's stored blocks only where a prompt the gateway "
                                               "sent it (and that prompt's output) could have made them: a forged "
                                               "feed cannot draw other prompts' requests onto an engine")
    tokenizer: str | None = setting(None, doc="the model's tokenizer.json (or its folder) to key text and chat "
                                              "prompts for prefix-aware policies (token-id prompts need none)")
    chat_template: str | None = setting(None, doc="the engine's chat template file, when it is not the one beside "
                                                  "the tokenizer (as vLLM's --chat-template)")
    hidden_states_client_key: str | None = field(default=None, repr=False)  # from hidden_states_client_key_env


def parse_config(raw: Any, source: str = "config") -> GatewayConfig:
    """Validate a parsed YAML document."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if "header_timeout_s" in raw:  # one timer became two: say which is which
        raise ConfigError("header_timeout_s: renamed keepalive_timeout_s (how long a connection may idle between "
                          "requests); head_timeout_s now bounds a request head from its first byte")
    discovery = parse_discovery(raw.get("discovery"))
    engines = raw.get("engines", [] if discovery else None)
    if not isinstance(engines, list) or not (engines or discovery):
        raise ConfigError(f"{source}: engines: expected a non-empty list (or a discovery section that finds them)")
    specs = [parse_engine(e, f"engines[{i}]") for i, e in enumerate(engines)]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError("engines: engine names must be unique")
    cfg = settings.parse(GatewayConfig, raw, "", built={"engines": specs, "discovery": discovery})
    check_policy(cfg.policy)
    cfg.classes.check()
    cfg.api_keys = _api_keys(cfg.api_keys, cfg.api_keys_file)
    cfg.api_keys += tuple(k for k in cfg.classes.api_keys() if k not in cfg.api_keys)
    check_workers(cfg)
    cfg.hidden_states_client_key = _client_key(cfg.hidden_states_client_key_env)
    cfg.admin_token = cfg.admin_token or os.environ.get("BATON_ADMIN_TOKEN") or None
    cfg.metrics_token = cfg.metrics_token or os.environ.get("BATON_METRICS_TOKEN") or None
    check_secret("admin_token", cfg.admin_token)
    check_secret("metrics_token", cfg.metrics_token)
    if cfg.api_keys and not (cfg.metrics_token or cfg.admin_token):
        raise ConfigError("metrics_token: api_keys are set: /metrics then needs metrics_token or admin_token (one "
                          "tenant could read the others' activity from it)")
    return cfg


# Placeholders Baton's own files have shipped (examples, compose, docs): a fleet started from a
# copied example must not run with a token the whole internet can read.
SHIPPED_EXAMPLE_TOKENS = frozenset({
    "change-me", "change-me-too", "change-this-token", "replace-with-a-long-random-token",
})
MIN_SECRET_CHARS = 16


def check_secret(key: str, token: str | None) -> None:
    """Refuse an admin or metrics token that anyone could guess: one that Baton's examples
    ship, or one shorter than ``MIN_SECRET_CHARS`` characters."""
    if token is None:
        return
    hint = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(24))'"
    if token.strip() in SHIPPED_EXAMPLE_TOKENS:
        raise ConfigError(f"{key}: that is the example token shipped with Baton; choose your own ({hint})")
    if len(token) < MIN_SECRET_CHARS:
        raise ConfigError(f"{key}: expected at least {MIN_SECRET_CHARS} characters, got {len(token)} ({hint})")


def check_workers(cfg: GatewayConfig) -> None:
    """Nothing a relay process cannot carry when ``workers`` asks for several."""
    if relay_workers(cfg) > 1:
        tagged = [e.name for e in cfg.engines if e.hidden_states]
        if tagged:
            raise ConfigError(f"workers: engines with a hidden-state feed ({', '.join(tagged)}) need workers: 1 "
                              "(the feed's tags live in the process that sent the leg)")


def relay_workers(cfg: GatewayConfig) -> int:
    """The number of relay processes ``workers`` asks for (1: no separate control process)."""
    if cfg.workers == "auto" or cfg.workers == 0:
        return max(1, os.cpu_count() or 1)
    return int(cfg.workers)


def _api_keys(keys: tuple[str, ...], path: str | None) -> tuple[str, ...]:
    """Client API keys from ``api_keys`` and the ``api_keys_file`` (one key per line; blank
    lines and ``#`` comments skipped). Keys are never echoed back."""
    if any(not k.strip() for k in keys):
        raise ConfigError("api_keys: expected a list of non-empty strings")
    out = [k.strip() for k in keys]
    if path is not None:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"api_keys_file: cannot read {path}: {type(exc).__name__}") from None
        from_file = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not from_file:
            raise ConfigError(f"api_keys_file: {path} holds no key")
        out += from_file
    return tuple(out)


def _client_key(env: str | None) -> str | None:
    """The gateway's CURVE secret key from the environment variable ``env`` names (never
    inline in the config, never in a message)."""
    if env is None:
        return None
    key = os.environ.get(env)
    if key is None:
        raise ConfigError(f"hidden_states_client_key_env: environment variable {env} is not set")
    if not is_z85_key(key):
        raise ConfigError(f"hidden_states_client_key_env: {env} must hold a CURVE secret key: 40 Z85 characters")
    return key


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway YAML file."""
    return parse_config(read_yaml(path), str(path))
