"""The engine's flags, defined once on ``EngineConfig`` (``core.settings``), named as vLLM's:
the YAML's ``cluster.engine`` (and ``prefill_engine`` / ``decode_engine``) keys, ``baton
simulate``'s engine flags (every command that runs the simulator) and ``baton emulate``'s."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import baton.core.settings as settings
from baton.core.errors import ConfigError
from baton.engine_model.work import EngineConfig


def engine_flags() -> list[settings.Setting]:
    """The engine settings the command line sets too (the others are YAML-only)."""
    return [s for s in settings.settings_of(EngineConfig) if s.flag]


def engine_from_dict(data: Any, where: str, base: EngineConfig | None = None) -> EngineConfig:
    """Engine settings from a mapping of keys (YAML or flags), over ``base``; errors name
    the offending key."""
    return replace(base or EngineConfig(), **settings.given(EngineConfig, data, where))


def add_engine_flags(group: argparse._ActionsContainer) -> None:
    """Add every engine flag to ``group`` (an absent flag leaves its value None)."""
    settings.add_flags(group, EngineConfig)


def engine_flags_given(args: argparse.Namespace) -> dict[str, Any]:
    """The engine flags given on the command line, by key."""
    return {s.key: getattr(args, s.dest) for s in engine_flags() if getattr(args, s.dest, None) is not None}


def engine_from_flags(args: argparse.Namespace, base: EngineConfig | None = None) -> EngineConfig:
    """``base`` with the engine flags given on the command line; errors name the flag."""
    settings.flag_errors(args)
    try:
        return engine_from_dict(engine_flags_given(args), "", base)
    except ConfigError as err:
        text = str(err)
        key = text.split(":", 1)[0]
        flag = next((s.flag for s in engine_flags() if s.key == key), key)
        raise ConfigError(f"{flag}{text[len(key):]}") from None
