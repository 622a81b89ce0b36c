"""A performance model fitted by least squares to measured engine iterations.

For users who profile their own engine (``baton profile --engine URL`` writes one): a CSV with one row per measured iteration and
the columns ``prefill_tokens``, ``decode_requests``, ``decode_ctx_tokens`` and
``iteration_s`` (optional: ``prefill_attn_pairs``, ``decode_ctx_cv2``). The model is
``t = c0 + c1*prefill_tokens + c2*prefill_attn_pairs + c3*decode_requests
+ c4*decode_ctx_tokens + c5*decode_ctx_tokens*decode_ctx_cv2 + c6*tile_pad_tokens
+ c7*prefill_chunks`` with non-negative coefficients (scipy's NNLS, minimising squared
relative error), which keeps it affine in the decode context as the simulator's
closed-form advance requires. The last two are derived, not columns: the empty rows of the
last 128-row tile the batch's tokens fill (GPU matmuls run on whole tiles; a 130-token
batch costs nearly a 256-token one) and the number of prefill chunks (each has a fixed
attention cost per layer). An engine without such steps gets zero for them.

A ``.json`` file beside the CSV (``baton profile`` writes it) gives the engine's KV
capacity (``kv_capacity_tokens``), ``kv_bytes_per_token`` and ``max_model_len``; wherever
a preset name is accepted, the path of a profile CSV is too.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from baton.core.errors import ConfigError
from baton.perf.model import BatchShape, PerfModel

REQUIRED = ("prefill_tokens", "decode_requests", "decode_ctx_tokens", "iteration_s")
FEATURES = ("const", "prefill_tokens", "prefill_attn_pairs", "decode_requests",
            "decode_ctx_tokens", "decode_ctx_het", "tile_pad_tokens", "prefill_chunks")
TILE_TOKENS = 128  # rows per matmul tile of the GPU kernels vLLM runs (cuBLAS/CUTLASS)


def _features(prefill_tokens, attn_pairs, n_decodes, ctx_tokens, cv2, chunks=None) -> np.ndarray:
    tokens = np.asarray(prefill_tokens) + np.asarray(n_decodes)
    chunks = (np.asarray(prefill_tokens) > 0).astype(float) if chunks is None else chunks
    return np.column_stack([np.ones_like(prefill_tokens), prefill_tokens, attn_pairs,
                            n_decodes, ctx_tokens, ctx_tokens * cv2, -tokens % TILE_TOKENS, chunks])


class FittedModel(PerfModel):
    """Linear iteration-time model with coefficients in ``coef`` (seconds per unit)."""

    def __init__(self, coef: np.ndarray, kv_bytes_per_token: int, kv_capacity_tokens: int) -> None:
        self.coef = np.asarray(coef, dtype=np.float64)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.kv_capacity_tokens = kv_capacity_tokens

    def iteration_time_s(self, shape: BatchShape) -> float:
        if shape.empty:
            return 0.0
        tokens = shape.prefill_tokens + shape.n_decodes
        chunks = max(shape.prefill_chunks, 1) if shape.prefill_tokens else 0
        x = (1.0, shape.prefill_tokens, shape.prefill_attn_pairs, shape.n_decodes,
             shape.decode_ctx_tokens, shape.decode_ctx_tokens * shape.decode_ctx_cv2,
             -tokens % TILE_TOKENS, chunks)
        return float(np.dot(self.coef[:len(x)], x[:len(self.coef)]))

    @classmethod
    def fit(cls, rows: dict[str, np.ndarray], kv_bytes_per_token: int,
            kv_capacity_tokens: int) -> "FittedModel":
        """Fit from column arrays (see module docstring)."""
        n = len(rows["iteration_s"])
        zeros = np.zeros(n)
        a = _features(rows["prefill_tokens"], rows.get("prefill_attn_pairs", zeros),
                      rows["decode_requests"], rows["decode_ctx_tokens"],
                      rows.get("decode_ctx_cv2", zeros))
        y = rows["iteration_s"]
        if (y <= 0).any():
            raise ConfigError("profile: every iteration_s must be positive")
        # relative errors matter (a 5 ms miss is large on a 40 ms decode, small on a 600 ms
        # prefill): least squares on rows scaled by 1/t
        from scipy.optimize import nnls  # here: scipy.optimize costs 0.7 s at import, fitting is rare

        coef, _ = nnls(a / y[:, None], np.ones_like(y))
        return cls(coef, kv_bytes_per_token, kv_capacity_tokens)

    @classmethod
    def from_profile(cls, path: str | Path) -> "FittedModel":
        """Fit a profile CSV, with the engine facts from its ``.json`` sidecar."""
        path = Path(path)
        side = path.with_suffix(".json")
        try:
            facts = json.loads(side.read_text())
        except OSError:
            raise ConfigError(f"{path}: no {side.name} beside it with the engine's KV capacity "
                              f"(baton profile writes both)") from None
        except ValueError as exc:
            raise ConfigError(f"{side}: not valid JSON: {exc}") from None
        kv_tokens, kv_bytes = facts.get("kv_capacity_tokens"), facts.get("kv_bytes_per_token")
        for key, value in (("kv_capacity_tokens", kv_tokens), ("kv_bytes_per_token", kv_bytes)):
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{side}: {key}: expected a positive integer, got {value!r}")
        model = cls.from_csv(path, kv_bytes, kv_tokens)
        if isinstance(facts.get("max_model_len"), int):
            model.max_model_len = facts["max_model_len"]
        return model

    @classmethod
    def from_csv(cls, path: str | Path, kv_bytes_per_token: int,
                 kv_capacity_tokens: int) -> "FittedModel":
        """Fit from a CSV of measured iterations; errors name the file, line and column."""
        return cls.fit(read_profile_csv(path), kv_bytes_per_token, kv_capacity_tokens)


def read_profile_csv(path: str | Path) -> dict[str, np.ndarray]:
    """Read a profile CSV into float columns, validating every row."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot open profile: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}")
        cols = [c for c in reader.fieldnames or [] if c in REQUIRED or c in
                ("prefill_attn_pairs", "decode_ctx_cv2")]
        data: dict[str, list[float]] = {c: [] for c in cols}
        for line, row in enumerate(reader, start=2):
            for c in cols:
                try:
                    data[c].append(float(row[c]))
                except (TypeError, ValueError):
                    raise ConfigError(f"{path}:{line}: column {c!r}: expected a number, "
                                      f"got {row[c]!r}") from None
    if len(data["iteration_s"]) < len(FEATURES):
        raise ConfigError(f"{path}: need at least {len(FEATURES)} rows to fit, got "
                          f"{len(data['iteration_s'])}")
    return {c: np.asarray(v) for c, v in data.items()}
