"""A trace's request-class columns read through ``--columns``: ``priority`` (an integer
band), ``tenant`` (any text) and ``ttft_slo_ms`` / ``tpot_slo_ms`` (the request's own
targets, milliseconds). An empty cell leaves the run's default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from baton.core.errors import WorkloadError

CLASS_COLUMNS = ("priority", "tenant", "ttft_slo_ms", "tpot_slo_ms")


def class_fields(row: Mapping[str, Any], columns: Mapping[str, str], where: str) -> dict[str, Any]:
    """The ``Request`` fields a row's class columns give (``priority``, ``tenant``,
    ``ttft_slo_s``, ``tpot_slo_s``); WorkloadError names the row and column otherwise."""
    out: dict[str, Any] = {}
    for key in CLASS_COLUMNS:
        col = columns.get(key)
        value = row.get(col) if col is not None else None
        if value is None or str(value).strip() == "":
            continue
        text = str(value).strip()
        if key == "tenant":
            out["tenant"] = text
            continue
        try:
            number = int(text) if key == "priority" else float(text)
        except ValueError:
            kind = "an integer" if key == "priority" else "a number of milliseconds"
            raise WorkloadError(f"{where}: column {col!r} ({key}): expected {kind}, got {text!r}") from None
        if key == "priority":
            out["priority"] = number
        elif not number > 0:
            raise WorkloadError(f"{where}: column {col!r} ({key}): expected a positive number, got {text!r}")
        else:
            out[key.replace("_ms", "_s")] = number / 1000.0
    return out
