"""ShareGPT conversations (the ``ShareGPT_V3_unfiltered_cleaned_split.json`` layout) as
requests, read as vLLM's serving benchmark reads them.

Each item is ``{"id": ..., "conversations": [{"from": "human"|"gpt"|..., "value": TEXT},
...]}``. A request is a conversation's first turn (the prompt) and its second turn (the
output whose length it asks for): vLLM's ``ShareGPTDataset`` keeps conversations with at
least two turns and takes those two. Lengths are counted with the given tokenizer (or
``baton.workload.tokens``' estimate). Conversations with fewer than two turns or an empty
first or second turn are skipped and counted; vLLM's benchmark also drops prompts over
1,024 tokens and pairs over 2,048 (a limit of its default model), which Baton does not.
The file has no arrival times: ``--arrivals poisson:R`` draws them. Every request carries
prefix ids hashed from its tokens (or, without a tokenizer, from its text), so prompts that
share a beginning share cached blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.core.errors import WorkloadError
from baton.workload.tokens import ID_BLOCK_TOKENS, TokenCounter


@dataclass(frozen=True, slots=True)
class Exchange:
    """A conversation's first two turns, as text."""

    prompt: str
    output: str


def _turn_text(turn: Any, where: str) -> str:
    if not isinstance(turn, dict) or not isinstance(turn.get("value", ""), str):
        raise WorkloadError(f"{where}: expected a turn {{\"from\": ..., \"value\": TEXT}}, got {str(turn)[:80]}")
    return str(turn.get("value", ""))


def exchanges(data: list, path: Path) -> tuple[list[Exchange], int]:
    """(first exchanges, conversations skipped) of a parsed ShareGPT list; a malformed
    item raises ``WorkloadError`` naming it."""
    out, skipped = [], 0
    for i, item in enumerate(data):
        where = f"{path}: item {i}"
        if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
            hint = (" (a list of length pairs: --format json-lengths)"
                    if isinstance(item, dict) and any("len" in k or "tokens" in k for k in item) else "")
            raise WorkloadError(f"{where}: expected an object with a \"conversations\" list{hint}")
        turns = item["conversations"]
        if len(turns) < 2:
            skipped += 1
            continue
        prompt, output = _turn_text(turns[0], f"{where} turn 0"), _turn_text(turns[1], f"{where} turn 1")
        if not prompt.strip() or not output.strip():
            skipped += 1
            continue
        out.append(Exchange(prompt, output))
    return out, skipped


def is_sharegpt(path: Path) -> bool:
    """Whether a JSON list file holds conversations (its first item has ``conversations``)."""
    with path.open(encoding="utf-8", errors="replace") as handle:
        head = handle.read(65_536)
    return '"conversations"' in head


def sharegpt_rows(path: Path, counter: TokenCounter,
                  notes: list[str] | None = None) -> list[tuple[None, int, int]]:
    """(no arrival, prompt tokens, output tokens) per usable conversation; the skip count
    and how tokens were counted go to ``notes``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: expected a JSON list of conversations")
    pairs, skipped = exchanges(data, path)
    if not pairs:
        raise WorkloadError(f"{path}: no conversation has two non-empty turns")
    seqs = counter.sequences([p.prompt for p in pairs], [p.output for p in pairs])
    if notes is not None:
        notes.append(f"{path.name}: {len(pairs):,} ShareGPT conversations, tokens counted by {counter.name}"
                     + (f"; {skipped:,} skipped (fewer than two turns, or an empty one)" if skipped else ""))
    return [(None, s.prompt_tokens, s.output_tokens, None, s.prefix_ids, ID_BLOCK_TOKENS) for s in seqs]
