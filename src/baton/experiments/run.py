"""One simulation, kept with the per-request and per-instance data that reports plot."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from baton.core.request import Request
from baton.experiments.config import Experiment
from baton.metrics.tbt import PERCENTILES
from baton.profiling.qoe import extras_for
from baton.sim import simulate
from baton.sim.simulator import SimResult


@dataclass(slots=True)
class RunData:
    """A finished run: its summary plus the arrays behind the report's figures.

    ``ttft_s``/``tpot_s`` hold one value per finished request (TPOT only for outputs of
    two tokens or more); ``load_tokens`` is samples x instances of token load, with the
    sample times in ``load_times_s`` and one label per column.
    """

    name: str
    summary: dict[str, float]
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    tbt_percentiles_s: dict[float, float]
    load_times_s: np.ndarray
    load_tokens: np.ndarray
    instance_labels: list[str]
    role_log: list[tuple[float, int, str]] = field(default_factory=list)  # (time s, instance, role)
    arrival_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def from_result(cls, name: str, result: SimResult, summary: dict[str, float]) -> "RunData":
        done = [r for r in result.records if r.finished]
        cols = result.decode_columns or list(range(result.load.matrix().shape[1]))
        m = result.load.matrix()
        return cls(
            name=name, summary=summary,
            ttft_s=np.array([r.ttft_s for r in done]),
            tpot_s=np.array([r.tpot_s for r in done if r.output_tokens > 1]),
            tbt_percentiles_s={q: result.tbt.percentile_s(q) for q in PERCENTILES},
            load_times_s=np.array(result.load.times_s),
            load_tokens=m[:, cols] if m.size else np.zeros((0, len(cols))),
            instance_labels=[result.instance_names[c] if result.instance_names else f"instance {c}" for c in cols],
            role_log=list(result.role_log),
            arrival_s=np.array([r.arrival_s for r in result.records]),
            prompt_tokens=np.array([r.prompt_tokens for r in result.records]))


def policy_label(policy: str | Mapping[str, Any]) -> str:
    """The display name of a policy given by name or by stage config."""
    if isinstance(policy, str):
        return policy
    return str(policy.get("name", "custom")) if isinstance(policy, Mapping) else "custom"


def run_experiment(exp: Experiment, closed_form: bool = True,
                   progress: Callable[[float, int, int], None] | None = None,
                   name: str | None = None, requests: list[Request] | None = None) -> tuple[SimResult, RunData]:
    """Simulate ``exp`` once; returns the raw result and the report data. ``requests``,
    when given, is ``exp``'s workload already loaded (so a comparison reads it once)."""
    if requests is None:
        requests = exp.workload.load(exp.seed)
    result = simulate(requests, exp.cluster, exp.policy, seed=exp.seed, closed_form=closed_form,
                      progress=progress, info=exp.view, slo=exp.slo,
                      extras=extras_for(exp.policy, exp.cluster.preset), flow=exp.flow_control)
    summary = result.summary(exp.slo, exp.warmup_s)
    return result, RunData.from_result(name or policy_label(exp.policy), result, summary)
