"""What ``baton profile`` measures, and the rows it writes.

A row is one kind of engine iteration with its measured duration:

- ``prefill``: one prompt of ``prefill_tokens`` alone (one iteration: the prompt fits the
  engine's token budget), timed engine-side by vLLM's ``request_prefill_time_seconds``
  histogram when the engine exports it, else from the client (adds HTTP overhead);
- ``decode``: ``decode_requests`` streams decoding together, timed from the client as the
  mean gap between tokens while all of them decode (overheads cancel in the gaps);
- ``mixed``: one prompt prefilled while those streams decode, timed engine-side.

The CSV's columns are what ``FittedModel`` fits; a JSON file beside it records the engine's
facts (KV capacity and bytes per token, block size) so the profile is a complete preset.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from baton.perf.model import chunk_attn_pairs


@dataclass(slots=True, frozen=True)
class ProfileGrid:
    """The measurement grid (tokens and request counts).

    ``max_num_batched_tokens`` and ``max_num_seqs`` are the engine's flags: prompts above
    the token budget and batches above the sequence cap are not measured, because their
    rows would not be single iterations.
    """

    prompt_tokens: tuple[int, ...] = (16, 64, 128, 256, 512, 768, 1024)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    contexts: tuple[int, ...] = (128, 512, 1024)
    mixed_prompt_tokens: tuple[int, ...] = (128, 512)
    mixed_batches: tuple[int, ...] = (4, 16)
    decode_iterations: int = 12
    repeats: int = 2
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    # (tokens cached by a first request, new tokens after them): prefills over cached context
    cached_prefills: tuple[tuple[int, int], ...] = ((512, 128), (1024, 128), (1024, 512), (1536, 256))

    @classmethod
    def quick(cls, max_num_batched_tokens: int = 2048, max_num_seqs: int = 256) -> "ProfileGrid":
        """A small grid (about a tenth of the default's work) for tests and smoke runs."""
        return cls((32, 256, 1024), (1, 4, 16), (128, 512), (256,), (4,), 8, 1,
                   max_num_batched_tokens, max_num_seqs, ((512, 128),))

    def prefill_prompts(self) -> list[int]:
        return [p for p in self.prompt_tokens if p <= self.max_num_batched_tokens]

    def cached_points(self, max_model_len: int) -> list[tuple[int, int]]:
        """(cached, new) pairs whose whole prompt fits the context and one iteration."""
        return [(c, n) for c, n in self.cached_prefills
                if c + n < max_model_len and c + n <= self.max_num_batched_tokens]

    def decode_points(self, max_model_len: int) -> list[tuple[int, int]]:
        """(batch, context) pairs that fit the engine: room for the decode tokens too."""
        room = self.decode_iterations * 4 + 8
        return [(b, c) for c in self.contexts for b in self.batch_sizes
                if b <= self.max_num_seqs - 1 and c + room <= max_model_len]


@dataclass(slots=True, frozen=True)
class ProfileRow:
    """One measured iteration (tokens; ``iteration_s`` in seconds)."""

    kind: str
    prefill_tokens: int
    prefill_attn_pairs: float
    decode_requests: int
    decode_ctx_tokens: int
    iteration_s: float
    timing: str

    @classmethod
    def prefill(cls, prompt_tokens: int, iteration_s: float, timing: str,
                decode_requests: int = 0, decode_ctx_tokens: int = 0, cached_tokens: int = 0) -> "ProfileRow":
        """A prefill of ``prompt_tokens`` computed tokens after ``cached_tokens`` the engine
        found in its prefix cache (their attention counts, their compute does not)."""
        kind = "mixed" if decode_requests else "prefill"
        return cls(kind, prompt_tokens, chunk_attn_pairs(prompt_tokens, cached_tokens), decode_requests,
                   decode_ctx_tokens, iteration_s, timing)


@dataclass(slots=True, frozen=True)
class EngineFacts:
    """What the engine says about itself (``/v1/models`` and ``vllm:cache_config_info``)."""

    url: str
    model: str
    max_model_len: int
    block_size: int | None
    kv_capacity_tokens: int | None
    kv_bytes_per_token: int | None
    engine_timing: bool


def write_profile(path: Path, rows: list[ProfileRow], facts: EngineFacts, extra: dict) -> Path:
    """Write the CSV and its ``.json`` sidecar; returns the sidecar's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([f.name for f in fields(ProfileRow)])
        for row in rows:
            writer.writerow([getattr(row, f.name) for f in fields(ProfileRow)])
    side = sidecar_path(path)
    side.write_text(json.dumps({**asdict(facts), **extra}, indent=2) + "\n")
    return side


def sidecar_path(csv_path: Path) -> Path:
    """``profile.csv`` -> ``profile.json``."""
    return csv_path.with_suffix(".json")
