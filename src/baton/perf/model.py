"""The performance-model interface every runtime and policy uses."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from baton.perf.memory import MemoryFlags


@dataclass(slots=True)
class BatchShape:
    """What an iteration's duration depends on (a value: nothing changes one once made; not
    frozen because a frozen dataclass's constructor costs twice as much, and the engine
    model and Kairos's chunk search make hundreds of thousands).

    - ``prefill_tokens``: prompt tokens computed this iteration (sum of chunks).
    - ``prefill_attn_pairs``: sum over chunks of chunk x (offset + (chunk + 1) / 2), the
      query-key pairs of causal prefill attention.
    - ``n_decodes`` and ``decode_ctx_tokens``: running decodes and their summed context.
    - ``decode_ctx_cv2``: squared coefficient of variation of the decode contexts; the
      length heterogeneity that slows attention kernels (CascadeInfer section 2.3). It is
      evaluated when the batch composition changes and held while it is unchanged.
    - ``prefill_chunks``: how many prefill chunks (each a kernel launch with its own fixed
      cost); 0 with ``prefill_tokens`` > 0 counts as one.
    - ``prefill_diag_pairs``: the part of ``prefill_attn_pairs`` inside the chunks' own
      causal triangles, sum of chunk x (chunk + 1) / 2; masked tiles run slower than the
      chunk's attention to earlier context.
    """

    prefill_tokens: int = 0
    prefill_attn_pairs: float = 0.0
    n_decodes: int = 0
    decode_ctx_tokens: int = 0
    decode_ctx_cv2: float = 0.0
    prefill_chunks: int = 0
    prefill_diag_pairs: float = 0.0

    @property
    def empty(self) -> bool:
        return self.prefill_tokens == 0 and self.n_decodes == 0


def length_cv2(ctx_tokens: np.ndarray | Sequence[int]) -> float:
    """Squared coefficient of variation of a set of lengths (0 for fewer than two).
    Integer lengths are summed exactly in int64 while n x max^2 stays below 2**63: (n *
    sum x^2 - (sum x)^2) / (sum x)^2 with one rounding, in a few numpy calls (the engine
    model asks on every batch change); floats otherwise."""
    if isinstance(ctx_tokens, list):  # a small decode table's column: the same integers, no numpy calls
        n = len(ctx_tokens)
        if n < 2:
            return 0.0
        s1, top = sum(ctx_tokens), max(ctx_tokens)
        if s1 > 0 and min(ctx_tokens) >= 0 and top * top * n < 2**63:
            return (n * sum(x * x for x in ctx_tokens) - s1 * s1) / (s1 * s1)
    arr = np.asarray(ctx_tokens)
    if arr.size < 2:
        return 0.0
    if arr.dtype.kind in "iu":
        ints = arr.astype(np.int64, copy=False)
        s1, top = int(ints.sum()), int(ints.max())
        if s1 > 0 and ints.min() >= 0 and top * top * ints.size < 2**63:
            return (ints.size * int(np.dot(ints, ints)) - s1 * s1) / (s1 * s1)
    arr = arr.astype(np.float64)
    mean = float(arr.mean())
    return float(arr.var() / (mean * mean)) if mean > 0 else 0.0


def chunk_attn_pairs(chunk_tokens: int, offset_tokens: int) -> float:
    """Causal attention query-key pairs of a prefill chunk at a context offset."""
    return chunk_tokens * (offset_tokens + (chunk_tokens + 1) / 2.0)


def chunk_diag_pairs(chunk_tokens: int) -> float:
    """Query-key pairs of a chunk attending to itself (its causal triangle)."""
    return chunk_tokens * (chunk_tokens + 1) / 2.0


def prefill_shape(chunk_tokens: int, offset_tokens: int = 0, n_decodes: int = 0,
                  decode_ctx_tokens: int = 0) -> BatchShape:
    """Shape of one prefill chunk at a context offset, beside optional decodes."""
    return BatchShape(prefill_tokens=chunk_tokens,
                      prefill_attn_pairs=chunk_attn_pairs(chunk_tokens, offset_tokens),
                      n_decodes=n_decodes, decode_ctx_tokens=decode_ctx_tokens,
                      prefill_chunks=1 if chunk_tokens else 0,
                      prefill_diag_pairs=chunk_diag_pairs(chunk_tokens))


def batch_shape(prefill_chunks: Sequence[tuple[int, int]],
                decode_ctx_tokens: Sequence[int] | np.ndarray) -> BatchShape:
    """Shape of a batch from its prefill chunks ``(chunk_tokens, offset_tokens)`` and its
    decode context lengths."""
    ctx = np.asarray(decode_ctx_tokens, dtype=np.int64)
    return BatchShape(
        prefill_tokens=sum(c for c, _ in prefill_chunks),
        prefill_attn_pairs=sum(chunk_attn_pairs(c, o) for c, o in prefill_chunks),
        n_decodes=int(ctx.size),
        decode_ctx_tokens=int(ctx.sum()),
        decode_ctx_cv2=length_cv2(ctx),
        prefill_chunks=sum(1 for c, _ in prefill_chunks if c > 0),
        prefill_diag_pairs=sum(chunk_diag_pairs(c) for c, _ in prefill_chunks),
    )


class PerfModel(ABC):
    """Iteration time of a batch, KV size, prefill and transfer time.

    Contract used by the simulator's closed-form advance: with everything else fixed,
    ``iteration_time_s`` is affine in ``decode_ctx_tokens``.
    """

    kv_bytes_per_token: int
    kv_capacity_tokens: int
    max_model_len: int | None = None  # the model's longest context (tokens); None: unknown

    @abstractmethod
    def iteration_time_s(self, shape: BatchShape) -> float:
        """Duration of one engine iteration with this batch, in seconds."""

    def chunk_time_fn(self, n_decodes: int, decode_ctx_tokens: int,
                      prompt_tokens: int = 0) -> Callable[[int], float]:
        """x -> the iteration time (s) of a prefill chunk of x tokens at offset
        ``max(0, prompt_tokens - x)`` beside ``n_decodes`` decodes of ``decode_ctx_tokens``
        context in all: ``iteration_time_s(prefill_shape(...))``, the same floats. A chunk
        search asks it many times for one batch; a model may fold what x leaves alone."""
        def chunk_time_s(x: int) -> float:
            return self.iteration_time_s(prefill_shape(x, max(0, prompt_tokens - x), n_decodes, decode_ctx_tokens))
        return chunk_time_s

    def kv_tokens_for(self, flags: "MemoryFlags") -> int:
        """KV capacity of one instance under these engine flags; a model without a
        memory model has a fixed capacity that only ``flags.kv_tokens`` overrides."""
        return flags.kv_tokens if flags.kv_tokens is not None else self.kv_capacity_tokens

    def prefill_time_s(self, prompt_tokens: int, chunk_tokens: int = 8192) -> float:
        """Time to prefill one prompt alone, in chunks of at most ``chunk_tokens``."""
        total, done = 0.0, 0
        while done < prompt_tokens:
            chunk = min(chunk_tokens, prompt_tokens - done)
            total += self.iteration_time_s(prefill_shape(chunk, done))
            done += chunk
        return total

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.kv_bytes_per_token

    @staticmethod
    def transfer_time_s(num_bytes: float, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
        """Time to move ``num_bytes`` over an uncontended link."""
        if bandwidth_bytes_per_s <= 0 or math.isinf(bandwidth_bytes_per_s):
            return latency_s
        return latency_s + num_bytes / bandwidth_bytes_per_s
