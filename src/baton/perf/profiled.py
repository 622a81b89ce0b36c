"""A performance model read from measured operator profiles (Vidur's CSV format).

``vidur:DIR@GPU:tpN`` (or a YAML ``cluster.model: {profile: DIR, gpu: GPU, tp: N}``) builds
it: DIR holds the model's Hugging Face ``config.json`` and its Vidur profiles (``mlp.csv``,
``attention.csv``, ``all_reduce.csv`` for TP > 1; see ``baton.perf.vidur_tables``). The
GPU gives memory (KV capacity under the engine flags, as for every other model).

Iteration time = layers x (linear operators at the batch's tokens + decode attention +
prefill attention + 2 all-reduces with their CPU launch). It keeps the profiles' own
shapes (tile steps, short-context attention costs) where the roofline has formulas, and
differs from Vidur's own predictor where that predictor departs from its measurements:
prefill attention is read at the chunk's prior context (the profile's ``kv_cache_size``;
Vidur asks at the context including the chunk), no rounding of contexts to 256 tokens,
and decode attention affine in the batch's summed
context at a fixed batch size (a least-squares line per profiled batch size, evaluated at
the mean context), which the simulator's closed-form advance needs. Batches larger than
the profile's largest scale its line by batch size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from baton.core.errors import ConfigError
from baton.perf.hardware import HARDWARE
from baton.perf.hf_config import model_from_hf_config
from baton.perf.memory import MemoryFlags, kv_capacity_tokens
from baton.perf.model import BatchShape, PerfModel
from baton.perf.vidur_profile import DECODE_BATCHING, interp_chunk
from baton.perf.vidur_tables import NCCL_LAUNCH_MS, OperatorTables


def _interp(x: float, curve: tuple[np.ndarray, np.ndarray]) -> float:
    """Linear interpolation; past the last point, proportional to ``x`` (tokens)."""
    xs, ys = curve
    if x > xs[-1]:
        return float(ys[-1]) * x / float(xs[-1])
    return float(np.interp(x, xs, ys))


def _lines(decode: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, tuple[float, float]]:
    """Per batch size, (intercept ms, ms per context token) of a line through its curve."""
    out = {}
    for b, (xs, ys) in decode.items():
        ys = ys * (1.0 + DECODE_BATCHING * (b > 1))
        slope, intercept = np.polyfit(xs, ys, 1) if len(xs) > 1 else (0.0, float(ys[0]))
        out[b] = (float(intercept), max(float(slope), 0.0))
    return out


class ProfiledModel(PerfModel):
    """Iteration times from operator profiles of one model at one TP degree on one GPU."""

    def __init__(self, directory: str | Path, gpu: str, tp: int = 1) -> None:
        d = Path(directory)
        if not d.is_dir():
            raise ConfigError(f"{d}: not a folder of Vidur profile CSVs")
        if gpu not in HARDWARE:
            raise ConfigError(f"gpu: unknown GPU {gpu!r}; known GPUs: {', '.join(sorted(HARDWARE))}")
        if not (d / "config.json").is_file():
            raise ConfigError(f"{d}: no config.json; put the model's Hugging Face config.json "
                              "beside its Vidur profiles")
        self.spec, self.hardware, self.tp = model_from_hf_config(d / "config.json"), HARDWARE[gpu], tp
        self.tables = OperatorTables.from_dir(d, tp, self.spec.hidden)
        self._lines = _lines(self.tables.decode)
        self._max_batch = max(self._lines)
        self.kv_bytes_per_token = self.spec.kv_bytes_per_token
        self.max_model_len = self.spec.max_model_len
        if self.spec.weight_bytes >= self.hardware.hbm_bytes * tp:
            raise ConfigError(f"model {self.spec.name} does not fit on {tp} x {gpu}")
        self.kv_capacity_tokens = self.kv_tokens_for(MemoryFlags())

    def kv_tokens_for(self, flags: MemoryFlags) -> int:
        """KV capacity of one instance under these engine flags (vLLM's sizing)."""
        return kv_capacity_tokens(self.spec, self.hardware, self.tp, flags)

    def _decode_ms(self, n: int, ctx_tokens: int) -> float:
        if n == 0:
            return 0.0
        b = n if n in self._lines else min(self._lines, key=lambda k: (abs(k - n), k))
        intercept, slope = self._lines[min(b, self._max_batch)]
        scale = n / self._max_batch if n > self._max_batch else 1.0
        return scale * intercept + slope * ctx_tokens / n * scale

    def _prefill_ms(self, shape: BatchShape) -> float:
        if shape.prefill_tokens == 0:
            return 0.0
        n = max(shape.prefill_chunks, 1)
        chunk = shape.prefill_tokens / n
        offset = max(shape.prefill_attn_pairs / n / chunk - (chunk + 1) / 2.0, 0.0)
        return n * interp_chunk(self.tables.prefill, chunk, offset)

    def iteration_time_s(self, shape: BatchShape) -> float:
        tokens = shape.prefill_tokens + shape.n_decodes
        if tokens == 0:
            return 0.0
        t = self.tables
        per_layer = _interp(tokens, t.linear)
        per_layer += self._decode_ms(shape.n_decodes, shape.decode_ctx_tokens) + self._prefill_ms(shape)
        if t.allreduce is not None:
            per_layer += 2.0 * (_interp(tokens, t.allreduce) + NCCL_LAUNCH_MS)
        return self.spec.n_layers * per_layer * 1e-3
