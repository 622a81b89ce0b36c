"""Vidur's measured operator profiles turned into whole-iteration times, as Vidur does it.

Vidur (0.0.26, the PyPI wheel) predicts an iteration of a replica as layers x (the linear
operators at the batch's token count rounded up to a multiple of 8, decode attention keyed
on the number of decodes and their mean context rounded up to 256, prefill attention
summed per request keyed on (context incl. the chunk, chunk rounded up to 32), and two
tensor-parallel all-reduces, each the profiled all-reduce time plus a 20 us CPU launch
cost). It adds no embedding, LM head, sampler or CPU overhead. Vidur fits random forests
to the profile's medians; this module interpolates the medians linearly, which lands
within about 1-4% of the forests (``benchmarks/calibrate_vidur.py`` measures it).

This is the reference that Baton's analytic presets are calibrated and tested against
(``tests/perf/test_calibration.py``) and that the fidelity benchmark compares with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from baton.perf.vidur_tables import LINEAR_OPS, NCCL_LAUNCH_MS, OperatorTables

__all__ = ["DECODE_BATCHING", "FILES", "IterationParts", "KV_GRANULARITY", "LINEAR_OPS",
           "NCCL_LAUNCH_MS", "VidurProfile"]

DECODE_BATCHING = 0.1        # Vidur's attention_decode_batching_overhead_fraction (GQA)
KV_GRANULARITY = 256         # Vidur's kv_cache_prediction_granularity
# the A100 Llama-2-70B TP2 profiles as ../shared/peers/vidur names them
FILES = {"mlp": "a100_Llama-2-70b-hf_mlp.csv",
         "attention": "a100_attention_llama2-70b-tp2_from_commit_acb95f6.csv",
         "all_reduce": "a100_dgx_all_reduce.csv"}


def _ceil(x: float, step: int) -> int:
    return int(-(-int(x) // step) * step)


def interp_chunk(prefill: dict[int, tuple[np.ndarray, np.ndarray]], chunk: float, kv: float) -> float:
    """Prefill attention (ms) of a ``chunk`` at context ``kv`` (chunk included): linear in
    the context along each profiled chunk size, then between the two nearest sizes."""
    chunks = np.array(sorted(prefill))
    i = int(np.searchsorted(chunks, chunk))
    hi = chunks[min(i, len(chunks) - 1)]
    lo = hi if hi == chunk or i == 0 else chunks[i - 1]
    at = lambda c: float(np.interp(kv, *prefill[int(c)]))  # noqa: E731
    if hi == lo:
        return at(hi) * (chunk / hi if chunk > hi else 1.0)  # past the largest: per token
    w = (chunk - lo) / (hi - lo)
    return (1 - w) * at(lo) + w * at(hi)


@dataclass(slots=True)
class IterationParts:
    """Milliseconds per layer of each part of one iteration, and the total in seconds."""

    linear_ms: float
    decode_attn_ms: float
    prefill_attn_ms: float
    allreduce_ms: float
    layers: int

    @property
    def total_s(self) -> float:
        per_layer = self.linear_ms + self.decode_attn_ms + self.prefill_attn_ms + 2 * self.allreduce_ms
        return self.layers * per_layer * 1e-3


class VidurProfile:
    """Vidur's iteration time over operator tables; by default Llama-2-70B at TP2 on A100
    (DGX), from the CSVs in ``directory`` (named as in ``FILES``)."""

    def __init__(self, directory: str | Path | None = None, tp: int = 2, layers: int = 80,
                 hidden: int = 8192, tables: OperatorTables | None = None) -> None:
        if tables is None:
            d = Path(directory or ".")
            tables = OperatorTables.from_files(d / FILES["mlp"], d / FILES["attention"],
                                               d / FILES["all_reduce"], tp, hidden)
        self.layers, self.tables = layers, tables

    def linear_ms(self, tokens: int) -> float:
        """All linear operators of one layer for ``tokens`` tokens (ms)."""
        return float(np.interp(_ceil(tokens, 8), *self.tables.linear))

    def allreduce_ms(self, tokens: int) -> float:
        """One all-reduce of ``tokens`` activations plus its CPU launch (ms); 0 at TP 1."""
        if self.tables.allreduce is None:
            return 0.0
        return float(np.interp(_ceil(tokens, 8), *self.tables.allreduce)) + NCCL_LAUNCH_MS

    def decode_attn_ms(self, contexts: list[int]) -> float:
        """Decode attention of one layer for requests with these contexts (ms)."""
        if not contexts:
            return 0.0
        b, decode = len(contexts), self.tables.decode
        kv = _ceil(int(np.mean(contexts)), KV_GRANULARITY)
        xs, ys = decode[min(b, max(decode))]
        return float(np.interp(kv, xs, ys)) * (1.0 + DECODE_BATCHING * (b > 1))

    def prefill_attn_ms(self, chunk: int, kv: int) -> float:
        """Prefill attention of one chunk looked up at context ``kv`` (ms). Vidur's profile
        measured a chunk after ``kv_cache_size`` tokens of prior context; Vidur's predictor
        asks with the context including the chunk (``iteration`` passes done + chunk), so
        it charges a chunk at offset o what the profile measured at o + chunk. Pass the
        prior context to read the row as measured."""
        return interp_chunk(self.tables.prefill, _ceil(chunk, 32), _ceil(kv, KV_GRANULARITY))

    def iteration(self, chunks: list[tuple[int, int]], decode_contexts: list[int]) -> IterationParts:
        """One iteration: prefill ``chunks`` as (chunk tokens, tokens already done) and
        decodes with these context lengths (tokens already in the cache, plus one)."""
        tokens = sum(c for c, _ in chunks) + len(decode_contexts)
        return IterationParts(
            self.linear_ms(tokens), self.decode_attn_ms(decode_contexts),
            sum(self.prefill_attn_ms(c, done + c) for c, done in chunks),
            self.allreduce_ms(tokens), self.layers)
