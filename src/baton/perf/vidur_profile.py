"""Vidur's measured operator profiles turned into whole-iteration times.

Vidur (0.0.26, the PyPI wheel) predicts an iteration of a replica as 80 layers x (the
linear operators at the batch's token count rounded up to a multiple of 8, decode
attention keyed on the number of decodes and their mean context rounded up to 256,
prefill attention summed per request keyed on (context incl. the chunk, chunk rounded up
to 32), and two tensor-parallel all-reduces, each the profiled all-reduce time plus a
20 us CPU launch cost). It adds no embedding, LM head, sampler or CPU overhead. Vidur fits
random forests to the profile's medians; this module interpolates the medians linearly,
which lands within about 1% of the forests on average.

This is the reference that Baton's analytic presets are calibrated and tested against
(``tests/perf/test_calibration.py``) and that the fidelity benchmark compares with.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act",
              "input_layernorm", "post_attention_layernorm", "attn_rope", "add")
NCCL_LAUNCH_MS = 0.02        # Vidur's nccl_cpu_launch_overhead_ms
DECODE_BATCHING = 0.1        # Vidur's attention_decode_batching_overhead_fraction (GQA)
KV_GRANULARITY = 256         # Vidur's kv_cache_prediction_granularity
FILES = {"mlp": "a100_Llama-2-70b-hf_mlp.csv",
         "attention": "a100_attention_llama2-70b-tp2_from_commit_acb95f6.csv",
         "all_reduce": "a100_dgx_all_reduce.csv"}


def _rows(path: Path):
    with path.open() as handle:
        yield from csv.DictReader(handle)


def _curve(points: dict[float, list[float]]) -> tuple[np.ndarray, np.ndarray]:
    xs = np.array(sorted(points), dtype=np.float64)
    return xs, np.array([float(np.mean(points[x])) for x in xs])


def _ceil(x: float, step: int) -> int:
    return int(-(-int(x) // step) * step)


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
    """Llama-2-70B at TP2 on A100 (DGX), from Vidur's profile CSVs in ``directory``."""

    def __init__(self, directory: str | Path, tp: int = 2, layers: int = 80,
                 hidden: int = 8192) -> None:
        d = Path(directory)
        self.layers = layers
        lin: dict[float, list[float]] = defaultdict(list)
        for row in _rows(d / FILES["mlp"]):
            if int(row["num_tensor_parallel_workers"]) == tp:
                lin[float(row["num_tokens"])].append(
                    sum(float(row[f"time_stats.{op}.median"] or 0.0) for op in LINEAR_OPS))
        self._linear = _curve(lin)
        ar: dict[float, list[float]] = defaultdict(list)
        for row in _rows(d / FILES["all_reduce"]):
            if int(row["num_workers"]) == tp and int(row["devices_per_node"]) == tp:
                ar[float(row["size"]) / (hidden * 2)].append(float(row["time_stats.all_reduce.median"]))
        self._allreduce = _curve(ar)
        dec: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        pre: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for row in _rows(d / FILES["attention"]):
            if int(row["num_tensor_parallel_workers"]) != tp or row["block_size"] != "16":
                continue
            chunk, kv = int(row["prefill_chunk_size"]), float(row["kv_cache_size"])
            if chunk == 0:
                dec[int(row["batch_size"])][kv].append(float(row["time_stats.attn_decode.median"]))
            else:
                pre[chunk][kv].append(float(row["time_stats.attn_prefill.median"]))
        self._decode = {b: _curve(v) for b, v in dec.items()}
        self._prefill = {c: _curve(v) for c, v in pre.items()}
        self._chunks = np.array(sorted(self._prefill))

    def linear_ms(self, tokens: int) -> float:
        """All linear operators of one layer for ``tokens`` tokens (ms)."""
        return float(np.interp(_ceil(tokens, 8), *self._linear))

    def allreduce_ms(self, tokens: int) -> float:
        """One all-reduce of ``tokens`` activations plus its CPU launch (ms)."""
        return float(np.interp(_ceil(tokens, 8), *self._allreduce)) + NCCL_LAUNCH_MS

    def decode_attn_ms(self, contexts: list[int]) -> float:
        """Decode attention of one layer for requests with these contexts (ms)."""
        if not contexts:
            return 0.0
        b = len(contexts)
        kv = _ceil(int(np.mean(contexts)), KV_GRANULARITY)
        xs, ys = self._decode[min(b, max(self._decode))]
        return float(np.interp(kv, xs, ys)) * (1.0 + DECODE_BATCHING * (b > 1))

    def prefill_attn_ms(self, chunk: int, kv: int) -> float:
        """Prefill attention of one chunk whose context, chunk included, is ``kv`` (ms)."""
        kv, chunk = _ceil(kv, KV_GRANULARITY), _ceil(chunk, 32)
        i = int(np.searchsorted(self._chunks, chunk))
        hi = self._chunks[min(i, len(self._chunks) - 1)]
        lo = hi if hi == chunk or i == 0 else self._chunks[i - 1]
        at = lambda c: float(np.interp(kv, *self._prefill[int(c)]))  # noqa: E731
        w = 0.0 if hi == lo else (chunk - lo) / (hi - lo)
        return (1 - w) * at(lo) + w * at(hi)

    def iteration(self, chunks: list[tuple[int, int]], decode_contexts: list[int]) -> IterationParts:
        """One iteration: prefill ``chunks`` as (chunk tokens, tokens already done) and
        decodes with these context lengths (tokens already in the cache, plus one)."""
        tokens = sum(c for c, _ in chunks) + len(decode_contexts)
        return IterationParts(
            self.linear_ms(tokens), self.decode_attn_ms(decode_contexts),
            sum(self.prefill_attn_ms(c, done + c) for c, done in chunks),
            self.allreduce_ms(tokens), self.layers)
