"""Summary metrics of a run: latency percentiles, throughput, goodput, SLO attainment,
load balance over time, migrations and the optimal-assignment ratio."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from baton.metrics.records import RequestRecord
from baton.metrics.tbt import GapHistogram


@dataclass(slots=True, frozen=True)
class SLO:
    """Latency targets: time to first token and time per output token (seconds)."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1


@dataclass(slots=True)
class RunCounters:
    """Counts a runtime accumulates besides per-request records."""

    preemptions: int = 0
    migrations: int = 0
    migrations_refused: int = 0
    migration_bytes: float = 0.0
    transfer_bytes: float = 0.0
    role_changes: int = 0
    handoffs: int = 0
    handoffs_to_least_loaded: int = 0
    events: int = 0


@dataclass(slots=True)
class LoadSeries:
    """Per-instance token load sampled every ``interval_s`` (rows: samples)."""

    interval_s: float
    times_s: list[float] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)

    def matrix(self) -> np.ndarray:
        return np.vstack(self.rows) if self.rows else np.zeros((0, 0))

    def balance(self, columns: list[int] | None = None) -> dict[str, float]:
        """Mean over time of the across-instance variance and coefficient of variation."""
        m = self.matrix()
        if m.size == 0:
            return {"load_variance_tokens2": 0.0, "load_cv": 0.0}
        if columns is not None:
            m = m[:, columns]
        busy = m.sum(axis=1) > 0
        if not busy.any():
            return {"load_variance_tokens2": 0.0, "load_cv": 0.0}
        m = m[busy]
        var = m.var(axis=1)
        mean = m.mean(axis=1)
        return {"load_variance_tokens2": float(var.mean()),
                "load_cv": float((np.sqrt(var) / np.maximum(mean, 1e-9)).mean())}


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def summarize(records: list[RequestRecord], tbt: GapHistogram, counters: RunCounters,
              load: LoadSeries, slo: SLO, makespan_s: float,
              decode_columns: list[int] | None = None) -> dict[str, float]:
    """One flat dict of metrics; every key carries its unit."""
    done = [r for r in records if r.finished]
    ttft = np.array([r.ttft_s for r in done])
    tpot = np.array([r.tpot_s for r in done if r.output_tokens > 1])
    e2e = np.array([r.e2e_s for r in done])
    out_tokens = sum(r.output_tokens for r in done)
    good = sum(1 for r in done if r.ttft_s <= slo.ttft_s and
               (r.output_tokens <= 1 or r.tpot_s <= slo.tpot_s))
    span = makespan_s if makespan_s > 0 else float("nan")
    out = {
        "requests": len(records), "finished": len(done),
        "rejected": len(records) - len(done),
        "throughput_rps": len(done) / span, "throughput_tok_s": out_tokens / span,
        "goodput_rps": good / span, "slo_attainment": good / len(records) if records else 0.0,
        "mean_ttft_s": float(ttft.mean()) if ttft.size else float("nan"),
        "p50_ttft_s": _pct(ttft, 50), "p95_ttft_s": _pct(ttft, 95), "p99_ttft_s": _pct(ttft, 99),
        "mean_tpot_s": float(tpot.mean()) if tpot.size else float("nan"),
        "p50_tpot_s": _pct(tpot, 50), "p99_tpot_s": _pct(tpot, 99), "p99_9_tpot_s": _pct(tpot, 99.9),
        "mean_e2e_s": float(e2e.mean()) if e2e.size else float("nan"), "p99_e2e_s": _pct(e2e, 99),
        "makespan_s": makespan_s,
        "preemptions": counters.preemptions, "migrations": counters.migrations,
        "migrations_refused": counters.migrations_refused,
        "migration_bytes": counters.migration_bytes, "transfer_bytes": counters.transfer_bytes,
        "role_changes": counters.role_changes,
        "optimal_assignment_ratio": (counters.handoffs_to_least_loaded / counters.handoffs
                                     if counters.handoffs else float("nan")),
    }
    out.update(tbt.summary())
    out.update(load.balance(decode_columns))
    return out
