"""``baton profile --kind qoe``: CascadeInfer's QoE profile (section 4.1), run against the
simulator's perf model.

For each exponential length bucket [lo, 2 lo) and each batch size B in 1, 2, 4, ... (while
B requests of the bucket fit the KV cache, at most ``max_batch``), B requests with prompts
drawn from the bucket and ``output_tokens`` each start together on one colocated
instance, so the batch keeps B requests for their whole life (the paper holds the batch
size constant with a closed loop; requests that start together and have equal outputs do
the same here). Each request gives one row: the batch's features (its prompts, and
contexts at prompt + output / 2: the mean over the request's life) and its normalised
latency (end-to-end over output tokens). The fit's error is reported on a held-out 30% of
the (bucket, B) cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from baton.core.info import InfoModel, ViewMode
from baton.core.request import Request
from baton.perf import build
from baton.perf.qoe import QoEModel, features
from baton.policies import stage_types
from baton.sim import ClusterSpec, EngineConfig, simulate


@dataclass(slots=True)
class QoEProfile:
    """Rows of the profile, the fitted model and its errors (fractions)."""

    features: np.ndarray
    latency_s: np.ndarray
    cases: np.ndarray  # the (bucket, batch) case of each row
    model: QoEModel
    held_out_mape: float
    train_mape: float


def run_case(preset: str, lo: int, batch: int, output_tokens: int, engine: EngineConfig,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one (bucket, batch) case: features per request and normalised latencies."""
    prompts = rng.integers(lo, 2 * lo, batch)
    reqs = [Request(i, 0.0, int(p), output_tokens) for i, p in enumerate(prompts)]
    cluster = ClusterSpec(prefill=0, decode=0, mixed=1, preset=preset, engine=engine)
    res = simulate(reqs, cluster, "colocated", info=InfoModel(ViewMode.EXACT))
    f = features(prompts, prompts + output_tokens / 2.0)
    return np.tile(f, (batch, 1)), np.array([r.e2e_s / output_tokens for r in res.records])


def profile_qoe(preset: str, min_tokens: int = 128, max_tokens: int = 16384, output_tokens: int = 128,
                max_batch: int = 256, seed: int = 0) -> QoEProfile:
    """Profile, fit and hold out (see the module docstring)."""
    perf, rng = build(preset), np.random.default_rng(seed)
    engine = EngineConfig(max_num_batched_tokens=8192, max_num_seqs=max_batch)
    rows, ys, cases = [], [], []
    lo, case = min_tokens, 0
    while lo < max_tokens:
        batch = 1
        while batch <= max_batch and batch * (2 * lo + output_tokens) <= perf.kv_capacity_tokens:
            f, y = run_case(preset, lo, batch, output_tokens, engine, rng)
            rows.append(f), ys.append(y), cases.append(np.full(len(y), case))
            batch, case = batch * 2, case + 1
        lo *= 2
    x, y, c = np.vstack(rows), np.concatenate(ys), np.concatenate(cases)
    held = np.isin(c, rng.choice(case, max(1, int(0.3 * case)), replace=False))
    model = QoEModel.fit(x[~held], y[~held])
    return QoEProfile(x, y, c, model, float(model.relative_errors(x[held], y[held]).mean()),
                      float(model.relative_errors(x[~held], y[~held]).mean()))


@lru_cache(maxsize=8)
def qoe_for_preset(preset: str) -> QoEModel:
    """The fitted QoE model of a preset, profiled once per process."""
    return profile_qoe(preset).model


def extras_for(policy, preset: str) -> dict:
    """What a policy needs besides its config, for a runtime running ``preset``:
    CascadeInfer's QoE model (``{"qoe": ...}``) when a stage of ``policy`` reads it, else
    nothing. The simulator and the gateway are handed this by their callers."""
    if any(cls.needs_qoe for cls in stage_types(policy)):
        return {"qoe": qoe_for_preset(preset)}
    return {}
