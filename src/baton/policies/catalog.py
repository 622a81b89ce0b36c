"""Stage types by name, named policies, and building a scheduler from config.

A policy config is either a name from ``POLICIES`` or a mapping
``{"name": ..., "stages": [{"stage": <stage name>, <param>: <value>, ...}, ...]}``.
Adding a stage: write its module with a ``STAGES`` mapping and list the module here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import baton.core.settings as settings
from baton.core.errors import ConfigError, did_you_mean
import baton.policies.ares as ares
import baton.policies.arrow as arrow
import baton.policies.cache_aware as cache_aware
import baton.policies.cascade as cascade
import baton.policies.colocated as colocated
import baton.policies.combined as combined
import baton.policies.deflect_rules as deflect_rules
import baton.policies.kairos as kairos
import baton.policies.kv_cost as kv_cost
import baton.policies.least_loaded as least_loaded
import baton.policies.llumnix as llumnix
import baton.policies.prefix_approx as prefix_approx
import baton.policies.prefix_precise as prefix_precise
import baton.policies.round_robin as round_robin
import baton.policies.sibyl as sibyl
from baton.perf.model import PerfModel
from baton.policies.base import PolicyContext, Scheduler, Stage

STAGE_TYPES: Mapping[str, type[Stage]] = {
    **round_robin.STAGES, **least_loaded.STAGES, **colocated.STAGES, **sibyl.STAGES,
    **ares.STAGES, **arrow.STAGES, **kairos.STAGES, **deflect_rules.STAGES, **cascade.STAGES,
    **llumnix.STAGES, **prefix_precise.STAGES, **prefix_approx.STAGES, **kv_cost.STAGES, **cache_aware.STAGES,
    **combined.STAGES,
}

# Stable names users and configs refer to.
POLICIES: Mapping[str, list[dict[str, Any]]] = {
    "round-robin": [{"stage": "round-robin"}],
    "least-loaded": [{"stage": "least-loaded"}],
    "least-kv": [{"stage": "least-kv"}],
    "least-requests": [{"stage": "least-requests"}],
    "power-of-two": [{"stage": "power-of-two"}],
    "colocated": [{"stage": "colocated"}],
    "colocated-rr": [{"stage": "colocated", "routing": "round-robin"}],
    "static-xpyd": [{"stage": "static-xpyd"}],
    # SIBYL's baselines bind the decode instance when the request arrives. ILS ranks by the
    # engines' running counts only (as scraped); least-outstanding by the router's own
    # bookings, requests still prefilling elsewhere included (SIBYL's REQLEVEL without
    # survival weighting).
    "rr-early": [{"stage": "round-robin", "early_binding": True}],
    "ils": [{"stage": "least-running", "early_binding": True}],
    "least-outstanding": [{"stage": "least-requests", "early_binding": True}],
    "sibyl": [{"stage": "sibyl"}],
    # SIBYL ablations (paper appendix J).
    "sibyl-prob1": [{"stage": "sibyl", "prob": False}],
    "sibyl-no-type1": [{"stage": "sibyl", "type1": False}],
    "sibyl-no-type2": [{"stage": "sibyl", "type2": False}],
    "sibyl-no-type3": [{"stage": "sibyl", "type3": False}],
    "sibyl-reqlevel": [{"stage": "sibyl", "reqlevel": True}],
    # ARES and the baselines of its paper: PD with current-KV-load balancing and no
    # migration ("vllm" there), rescheduling on current load only, and the oracle.
    "pd-kv": [{"stage": "least-kv"}],
    "ares-none": [{"stage": "least-kv"}, {"stage": "ares", "estimator": "none"}],
    "ares": [{"stage": "least-kv"}, {"stage": "ares", "estimator": "survival"}],
    "ares-oracle": [{"stage": "least-kv"}, {"stage": "ares", "estimator": "oracle"}],
    # the oracle perturbed by the learned predictor's measured error (benchmarks/length_predictor.py)
    "ares-learned-error": [{"stage": "least-kv"}, {"stage": "ares", "estimator": "learned-error"}],
    # Arrow (elastic pools, SLO-aware dispatch, instance flips) and its "Minimal Load"
    # ablation: the same dispatch with the starting roles fixed.
    "arrow": [{"stage": "arrow"}],
    "arrow-static": [{"stage": "arrow", "flips": False}],
    # Kairos (TBT-safe prefill deflection onto decode instances), plain PD, and the static
    # deflection rules production routers ship (llm-d's short-prompt decider, Dynamo's
    # queue-triggered conditional disaggregation)
    "kairos": [{"stage": "kairos"}],
    "kairos-reactive": [{"stage": "kairos", "proactive": False}],
    "pd": [{"stage": "least-loaded"}],
    "deflect-short": [{"stage": "deflect-short"}],
    "deflect-queue": [{"stage": "deflect-queue"}],
    # CascadeInfer (a length-aware pipeline of colocated instances), its layout, refinement
    # and balancing ablations, and Llumnix-style migration balancing (its baseline)
    "cascade": [{"stage": "cascade"}],
    "cascade-chain": [{"stage": "cascade", "layout": "chain"}],
    "cascade-nopipe": [{"stage": "cascade", "layout": "nopipe"}],
    "cascade-refine-count": [{"stage": "cascade", "refine": "count"}],
    "cascade-refine-memory": [{"stage": "cascade", "refine": "memory"}],
    "cascade-rr-handover": [{"stage": "cascade", "balance": "rr"}],
    "cascade-interstage-only": [{"stage": "cascade", "balance": "inter"}],
    # Baton's guard on the planner (policies/cascade_guard.py): the first plan after 10 s
    # of statistics, a new plan only when it gains more than its moves cost plus 5%, and
    # every stage left the instances its arrivals' prefills need
    "cascade-guarded": [{"stage": "cascade", "warmup_s": 10.0, "hysteresis": 0.05, "prefill_share": 0.5}],
    "llumnix": [{"stage": "llumnix"}],
    # prefix-aware routing as the field runs it (llm-d's precise and approximate prefix
    # scorers, Dynamo's KV router, SGLang's cache-aware policy); decodes bound by token load
    "prefix-precise": [{"stage": "prefix-precise"}],
    "prefix-approx": [{"stage": "prefix-approx"}],
    "kv-cost": [{"stage": "kv-cost"}],
    "cache-aware": [{"stage": "cache-aware"}],
    # composed: the prefill chosen by prefix, the decode instance by SIBYL's projection
    "prefix-precise+sibyl": [{"stage": "prefix-precise", "bind_decode": False}, {"stage": "sibyl"}],
    # Baton's own: prefix-aware prefill, Kairos deflection, Arrow-style flips on sustained
    # demand shifts, decode binding by projected iteration time, ARES migration only when
    # projected KV overflows, under one conflict rule set (policies/combined.py)
    "combined": [{"stage": "combined"}],
}


def _build_stage(spec: Any, where: str, context: PolicyContext) -> Stage:
    if not isinstance(spec, Mapping) or "stage" not in spec:
        raise ConfigError(f"{where}: expected a mapping with a 'stage' key")
    name = spec["stage"]
    cls = _stage_type(name, where)
    params = settings.parse(cls.Params, {k: v for k, v in spec.items() if k != "stage"}, where)
    try:
        return cls(context, params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: stage {name!r}: {exc}") from None


def check_policy(config: Any) -> None:
    """ConfigError naming the first thing wrong with a policy config (an unknown name or
    stage, a parameter unknown, mistyped or out of range), without building it."""
    name, stages = _stage_specs(config)
    for i, spec in enumerate(stages):
        where = f"policy.stages[{i}]"
        if not isinstance(spec, Mapping) or "stage" not in spec:
            raise ConfigError(f"{where}: expected a mapping with a 'stage' key")
        cls = _stage_type(spec["stage"], where)
        settings.parse(cls.Params, {k: v for k, v in spec.items() if k != "stage"}, where)


def _stage_type(name: Any, where: str) -> type[Stage]:
    cls = STAGE_TYPES.get(name)
    if cls is None:
        raise ConfigError(f"{where}.stage: unknown stage {name!r}{did_you_mean(str(name), STAGE_TYPES)}; "
                          f"known: {', '.join(sorted(STAGE_TYPES))}")
    return cls


def _stage_specs(config: Any) -> tuple[str, list[Any]]:
    if isinstance(config, str):
        if config not in POLICIES:
            raise ConfigError(f"policy: unknown policy {config!r}{did_you_mean(config, POLICIES)}; "
                              f"known: {', '.join(sorted(POLICIES))}")
        return config, POLICIES[config]
    if isinstance(config, Mapping):
        stages = config.get("stages")
        if not isinstance(stages, list) or not stages:
            raise ConfigError("policy.stages: expected a non-empty list of stages")
        unknown = sorted(set(config) - {"name", "stages"})
        if unknown:
            raise ConfigError(f"policy.{unknown[0]}: unknown key; known: name, stages")
        return str(config.get("name", "custom")), stages
    raise ConfigError(f"policy: expected a name or a mapping, got {type(config).__name__}")


def build_scheduler(config: str | Mapping[str, Any], context: PolicyContext) -> Scheduler:
    """Build a scheduler from a policy name or a stage-list mapping."""
    name, stages = _stage_specs(config)
    built = [_build_stage(s, f"policy.stages[{i}]", context) for i, s in enumerate(stages)]
    return Scheduler(name, built)


def scheduler_for(config: str | Mapping[str, Any], perf: PerfModel, seed: int = 0,
                  ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
                  extras: Mapping[str, Any] | None = None) -> Scheduler:
    """The scheduler a runtime runs: ``config`` built with a generator seeded from
    ``seed``, the runtime's perf model and SLOs (seconds), and ``extras`` the caller
    prepared for it (e.g. CascadeInfer's QoE model: ``baton.profiling.qoe.extras_for``).
    The simulator and the gateway both build their scheduler here."""
    context = PolicyContext(np.random.default_rng(seed), perf, dict(extras or {}),
                            ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)
    return build_scheduler(config, context)


def stage_types(config: str | Mapping[str, Any]) -> list[type[Stage]]:
    """The stage classes a policy config names (unknown names are skipped: building the
    scheduler reports them)."""
    if isinstance(config, str):
        specs = POLICIES.get(config, [])
    elif isinstance(config, Mapping) and isinstance(config.get("stages"), list):
        specs = config["stages"]
    else:
        specs = []
    found = (STAGE_TYPES.get(s.get("stage")) for s in specs if isinstance(s, Mapping))
    return [cls for cls in found if cls is not None]
