"""Reading YAML config files with errors that name the file (and line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from baton.core.errors import ConfigError


def read_yaml(path: str | Path) -> Any:
    """The parsed document (None for an empty file); ConfigError names file:line."""
    import yaml  # only where a file is read: a run without one starts without it
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: malformed YAML: {getattr(exc, 'problem', exc)}") from None
