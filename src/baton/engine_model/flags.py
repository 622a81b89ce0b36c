"""The engine's flags, defined once, named as vLLM's: the YAML's ``cluster.engine`` (and
``prefill_engine`` / ``decode_engine``) keys, ``baton simulate``'s engine flags (every
command that runs the simulator) and ``baton emulate``'s are all these, checked here."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from baton.core.errors import ConfigError
from baton.engine_model.work import EngineConfig

# key -> (type, help); a key is the YAML key and, with dashes, the command-line flag
ENGINE_FLAGS: dict[str, tuple[type, str]] = {
    "kv_tokens": (int, "KV cache tokens per instance (overrides the size computed from the memory flags)"),
    "gpu_memory_utilization": (float, "share of GPU memory the engine may use (sizes the KV cache as vLLM does)"),
    "max_num_seqs": (int, "running sequences per instance"),
    "max_num_batched_tokens": (int, "tokens per iteration"),
    "block_size": (int, "tokens per KV block"),
    "max_model_len": (int, "longest prompt + output served (default: the model's own limit)"),
    "prefix_caching": (bool, "vLLM v1's automatic prefix caching: a prompt's cached full blocks cost no "
                             "prefill (on unless --no-enable-prefix-caching)"),
}
# keys the YAML has and the command line does not
ENGINE_TYPES: dict[str, type] = {**{k: t for k, (t, _) in ENGINE_FLAGS.items()},
                                 "kv_buffer_bytes": float, "reserve_full_sequence": bool}
_FIELDS = {"prefix_caching": "enable_prefix_caching"}  # key -> EngineConfig field
_OPTIONS = {"prefix_caching": "enable-prefix-caching"}  # key -> flag, where vLLM's differs


def typed(value: Any, kind: type, key: str) -> Any:
    """``value`` as a ``kind`` (an int is a float too), non-negative if a number."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}")
    if kind in (int, float) and value < 0:
        raise ConfigError(f"{key}: expected a non-negative number, got {value!r}")
    return value


def engine_from_dict(data: Any, where: str, base: EngineConfig | None = None) -> EngineConfig:
    """Engine flags from a mapping of keys (YAML or flags), over ``base``; errors name the
    offending key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in ENGINE_TYPES:
            raise ConfigError(f"{where}.{key}: unknown key; expected one of: {', '.join(sorted(ENGINE_TYPES))}")
        values[key] = typed(value, ENGINE_TYPES[key], f"{where}.{key}")
        if values[key] == 0 and ENGINE_TYPES[key] is not bool and key != "kv_buffer_bytes":
            raise ConfigError(f"{where}.{key}: expected a positive number, got 0")
    if values.get("gpu_memory_utilization", 0.5) > 1.0:
        raise ConfigError(f"{where}.gpu_memory_utilization: expected a fraction in (0, 1], "
                          f"got {values['gpu_memory_utilization']}")
    return replace(base or EngineConfig(), **{_FIELDS.get(k, k): v for k, v in values.items()})


def add_engine_flags(group: argparse._ActionsContainer) -> None:
    """Add every engine flag to ``group`` (an absent flag leaves its value None)."""
    for key, (kind, text) in ENGINE_FLAGS.items():
        option = "--" + _OPTIONS.get(key, key.replace("_", "-"))
        if kind is bool:
            group.add_argument(option, dest=key, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            group.add_argument(option, dest=key, type=kind, metavar="N", help=text)


def engine_flags_given(args: argparse.Namespace) -> dict[str, Any]:
    """The engine flags given on the command line, by key."""
    return {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k, None) is not None}


def engine_from_flags(args: argparse.Namespace, base: EngineConfig | None = None) -> EngineConfig:
    """``base`` with the engine flags given on the command line; errors name the flag."""
    try:
        return engine_from_dict(engine_flags_given(args), "engine flag", base)
    except ConfigError as err:
        text = str(err).removeprefix("engine flag.")
        key = text.split(":", 1)[0]
        raise ConfigError("--" + _OPTIONS.get(key, key.replace("_", "-")) + text[len(key):]) from None
