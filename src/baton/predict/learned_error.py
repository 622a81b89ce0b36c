"""The learned predictor's measured error, replayed on the oracle (for simulations).

A simulated request has no hidden state, but its true remaining length is known. This
estimator perturbs the truth with an error drawn from the distribution the learned
predictor showed on real generations (``benchmarks/length_predictor.py`` writes it), per
bucket of tokens generated so far, so that ARES can be simulated at any scale with the
predictor's real accuracy.

The error file (JSON) has ``buckets``: ``[{"lo": g0, "hi": g1, "n": samples,
"abs_quantiles": [...], "log_ratio_quantiles": [...]}, ...]``, each list the 0th..100th
percentiles of ``prediction - truth`` (tokens) or of ``ln((prediction + 1) / (truth + 1))``.
``mode="ratio"`` (default) applies the log-ratio: the predictor was measured on a small
model's answers of at most 1,024 tokens, and a relative error carries over to the long
outputs of the ARES workloads where an absolute one would not (a deviation to be aware
of: the predictor's relative accuracy on 10,000-token answers is not measured).
``mode="absolute"`` adds the token error. Generated lengths past the last bucket use it.

One draw per request per re-prediction point (``generated`` as the policy passes it, the
last multiple of k), from the injected generator: the prediction then stays fixed until
the next re-prediction, as a real predictor's would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from baton.core.errors import ConfigError
from baton.core.events import Completed, Observation
from baton.core.paths import cache_dir
from baton.core.view import ClusterView
from baton.predict.base import LengthEstimator

REPOSITORY_COPY = Path(__file__).resolve().parents[3] / "examples" / "predictor" / "error_by_bucket.json"


def default_paths() -> tuple[Path, Path]:
    """The full build's error file in the cache (``$BATON_CACHE``), then the repository's copy."""
    return cache_dir() / "predictor" / "error_by_bucket.json", REPOSITORY_COPY


def load_errors(path: str | Path | None) -> dict:
    """The error file at ``path``, else the cached one, else the repository's copy."""
    candidates = [Path(path).expanduser()] if path else [p for p in default_paths() if p.exists()]
    if not candidates:
        raise ConfigError("learned-error: no error file; run benchmarks/length_predictor.py or pass errors: "
                          f"PATH (looked in {', '.join(str(p) for p in default_paths())})")
    try:
        data = json.loads(candidates[0].read_text())
        buckets = data["buckets"]
        for b in buckets:
            if len(b["abs_quantiles"]) < 2 or len(b["log_ratio_quantiles"]) < 2 or b["hi"] <= b["lo"]:
                raise ValueError(f"bucket {b.get('lo')}-{b.get('hi')} is malformed")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"learned-error: {candidates[0]}: {e}") from e
    if not buckets:
        raise ConfigError(f"learned-error: {candidates[0]} has no buckets")
    return data


class LearnedErrorLength(LengthEstimator):
    """The oracle perturbed by the learned predictor's measured error (module docstring)."""

    name = "learned-error"
    needs_rng = True

    def __init__(self, rng: np.random.Generator, errors: str | None = None, mode: str = "ratio") -> None:
        if mode not in ("ratio", "absolute"):
            raise ConfigError(f"learned-error: mode must be 'ratio' or 'absolute', got {mode!r}")
        data = load_errors(errors)
        self.rng, self.mode = rng, mode
        self.upper = np.array([b["hi"] for b in data["buckets"]], dtype=np.float64)
        key = "log_ratio_quantiles" if mode == "ratio" else "abs_quantiles"
        self.quantiles = [np.asarray(b[key], dtype=np.float64) for b in data["buckets"]]
        self.drawn: dict[int, tuple[int, float]] = {}  # req id -> (generated at the draw, error)

    def error_at(self, req_id: int, generated: int) -> float:
        hit = self.drawn.get(req_id)
        if hit is not None and hit[0] == generated:
            return hit[1]
        bucket = min(int(np.searchsorted(self.upper, generated, side="right")), len(self.quantiles) - 1)
        q = self.quantiles[bucket]
        err = float(np.interp(self.rng.random() * (q.size - 1), np.arange(q.size), q))
        self.drawn[req_id] = (generated, err)
        return err

    def observe(self, view: ClusterView, observation: Observation) -> None:
        if isinstance(observation, Completed):
            self.drawn.pop(observation.req_id, None)

    def remaining_tokens(self, view: ClusterView, req_id: int) -> float:
        g = view.generated_tokens(req_id)
        return float(self.remaining_batch(view, np.array([req_id]), np.array([g]))[0])

    def remaining_batch(self, view: ClusterView, req_ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
        out = np.empty(len(req_ids))
        for i, (r, g) in enumerate(zip(req_ids, generated)):
            truth = view.request(int(r)).request.output_tokens - float(g)
            err = self.error_at(int(r), int(g))
            out[i] = (truth + 1.0) * np.exp(err) - 1.0 if self.mode == "ratio" else truth + err
        return np.maximum(out, 0.0)
