"""The policy contract: stages composed into a scheduler.

A stage sees the cluster only through a ``ClusterView`` (whose ``now_s`` is the clock)
and acts only through its return values. Randomness and the performance model come in
a ``PolicyContext`` given at construction. Stages are pure and synchronous.

Hooks, each optional (the defaults do nothing):

- ``start(view)``: decisions at time 0 (for example initial roles).
- ``plan_arrival(view, request, plan)``: fill in or change the ``ArrivalPlan``
  (prefill instance, early decode binding, deflection chunk limit, rejection).
- ``choose_decode(view, request)``: late binding when the prefill ends (an instance id,
  or a ``DecodeChoice`` that also flips instances).
- ``tick(view)``: every ``tick_interval_s`` seconds: migrations, role changes, watches.
- ``on_threshold(view, req_id, context_tokens)``: a ``Watch`` this stage asked for fired.
- ``observe(view, observation)``: progress and completion events for estimators.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

import baton.core.settings as settings
from baton.core.decisions import ArrivalPlan, DecodeChoice, Decision
from baton.core.errors import ConfigError
from baton.core.events import Observation
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.perf.model import PerfModel


@dataclass(slots=True)
class PolicyContext:
    """What a stage may use besides the view: a seeded random generator, the
    performance model (for duration estimates) and the run's latency SLOs (seconds;
    None when the runtime has none) for SLO-aware stages."""

    rng: np.random.Generator
    perf: PerfModel
    extras: dict = field(default_factory=dict)
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None


@dataclass(frozen=True, slots=True)
class NoParams:
    """This stage takes no parameters."""


@dataclass(frozen=True, slots=True)
class BindingParams:
    """Parameters of the load-based and round-robin baselines."""

    early_binding: bool = setting(False, doc="choose the decode instance on arrival (as SIBYL's baselines do), "
                                             "not when the prefill ends")


def params_for(cls: type[Stage], params: Any, values: dict[str, Any]) -> Any:
    """A stage's parameters: ``params`` (a ``cls.Params``) as given, or one built from
    keyword ``values`` and checked against its settings (``core.settings``)."""
    if params is None:
        return settings.parse(cls.Params, values, cls.name)
    if values or not isinstance(params, cls.Params):
        raise TypeError(f"{cls.__name__}: give a {cls.Params.__name__} or keyword values, not both")
    return params


class Stage:
    """Base class of pipeline stages; subclasses override the hooks they need. A stage's
    parameters are its ``Params`` type (a settings dataclass: defaults, bounds, units and a
    description per field), built from the policy config by the catalog."""

    name = "stage"
    tick_interval_s: float | None = None
    needs_bookings = False  # reads per-request state only the router's own bookings have
    replans_prefills = False  # may return Deflect for queued prefills (the gateway then holds them)
    needs_qoe = False  # reads context.extras["qoe"] (a QoEModel the runtime fits for its perf model)
    needs_colocated = False  # places requests on mixed instances only (a PD cluster gives it nothing)
    needs_prefix_keys = False  # reads RequestState.block_keys (the runtime computes them only then)
    splices_streams = False  # may return Migrate: a runtime must move a live stream (baton epp cannot)

    Params: type = NoParams

    def __init__(self, context: PolicyContext) -> None:
        self.context = context

    def start(self, view: ClusterView) -> list[Decision]:
        return []

    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        return plan

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | DecodeChoice | None:
        return None

    def tick(self, view: ClusterView) -> list[Decision]:
        return []

    def on_threshold(self, view: ClusterView, req_id: int, context_tokens: int) -> list[Decision]:
        return []

    def observe(self, view: ClusterView, observation: Observation) -> None:
        return None

    def report(self) -> dict[str, float]:
        """Figures the stage measured about its own working, for run summaries."""
        return {}


def _overrides(stage: Stage, hook: str) -> bool:
    return getattr(type(stage), hook) is not getattr(Stage, hook)


class Scheduler:
    """Stages in pipeline order, e.g. arrival router -> decode assigner -> rebalancer ->
    role controller. The runtime calls only this object."""

    def __init__(self, name: str, stages: list[Stage]) -> None:
        self.name = name
        self.stages = stages
        self._observers = [s for s in stages if _overrides(s, "observe")]
        self.tickers = [(i, s.tick_interval_s) for i, s in enumerate(stages)
                        if s.tick_interval_s and _overrides(s, "tick")]

    def start(self, view: ClusterView) -> list[tuple[int, Decision]]:
        return [(i, d) for i, s in enumerate(self.stages) for d in s.start(view)]

    def plan_arrival(self, view: ClusterView, request: RequestState) -> ArrivalPlan:
        plan = ArrivalPlan()
        for i, stage in enumerate(self.stages):
            watch = plan.watch_context_tokens
            plan = stage.plan_arrival(view, request, plan)
            if plan.watch_context_tokens != watch:
                plan = replace(plan, watch_stage=i)
            if plan.rejected:
                break
        return plan

    def decode_choice(self, view: ClusterView, request: RequestState) -> DecodeChoice | None:
        """The first stage's late-binding answer, with any role changes it asks for."""
        for stage in self.stages:
            choice = stage.choose_decode(view, request)
            if choice is not None:
                return choice if isinstance(choice, DecodeChoice) else DecodeChoice(choice)
        return None

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        """Only the instance of ``decode_choice`` (runtimes use ``decode_choice``)."""
        choice = self.decode_choice(view, request)
        return None if choice is None else choice.instance

    def tick(self, stage_index: int, view: ClusterView) -> list[Decision]:
        return self.stages[stage_index].tick(view)

    def on_threshold(self, stage_index: int, view: ClusterView, req_id: int,
                     context_tokens: int) -> list[Decision]:
        return self.stages[stage_index].on_threshold(view, req_id, context_tokens)

    def observe(self, view: ClusterView, observation: Observation) -> None:
        for stage in self._observers:
            stage.observe(view, observation)

    def report(self) -> dict[str, float]:
        """Every stage's ``report``, merged."""
        out: dict[str, float] = {}
        for stage in self.stages:
            out.update(stage.report())
        return out

    @property
    def needs_bookings(self) -> bool:
        """Whether a stage reads per-request bookings (impossible for a /metrics-only router)."""
        return any(s.needs_bookings for s in self.stages)

    @property
    def needs_prefix_keys(self) -> bool:
        return any(s.needs_prefix_keys for s in self.stages)

    @property
    def needs_qoe(self) -> bool:
        return any(s.needs_qoe for s in self.stages)

    def check_cluster(self, prefill: int, decode: int, mixed: int) -> None:
        """ConfigError when the cluster cannot run this policy as it means to: a policy of
        colocated instances on a cluster with prefill or decode instances would serve
        everything some other way without a word."""
        needs = [s.name for s in self.stages if s.needs_colocated]
        if needs and (prefill or decode or not mixed):
            raise ConfigError(f"policy {self.name!r} ({', '.join(needs)}) runs on colocated instances only; "
                              f"this cluster has {prefill} prefill, {decode} decode and {mixed} mixed: "
                              "use --prefill 0 --decode 0 --mixed N (live: every engine role: mixed)")

    @property
    def replans_prefills(self) -> bool:
        """Whether a stage may re-plan queued prefills (``Deflect``)."""
        return any(s.replans_prefills and s.tick_interval_s for s in self.stages)

    @property
    def observes(self) -> bool:
        return bool(self._observers)
