"""SIBYL: bind each request's decode instance when it arrives, choosing the instance
with the least projected load at the moment its decode will start.

The projected load at handoff time τ = now + δ (δ: estimated queueing plus prefill time)
is the sum of
- Type 1, running decodes: (context + v_k (τ - now)) x Ŝ(l_k(τ)) / Ŝ(l_k(now)), with each
  request's observed decode rate v_k;
- Type 2, bound requests whose decode starts at τ_k <= τ: (prompt + (τ - τ_k) v̄) x Ŝ((τ - τ_k) v̄);
- Type 3, bound requests starting after τ: ReLU(prompt - v̄ (τ_k - τ)),
where Ŝ is the online survival table and v̄ the system-average decode rate (EMA over
observed iterations). Ablations switch the probability weighting off (PROB@1), drop a
type, or count requests instead of tokens (REQLEVEL).

Differences from the paper, on purpose: τ_k is refined to the real prefill-end time once
the prefill finishes, and δ includes the queueing ahead of the prompt on its prefill
instance (Baton binds at arrival, the paper at prefill start).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from baton.core.decisions import ArrivalPlan
from baton.core.events import Completed, DecodeProgress, Observation, PrefillDone
from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.perf.model import BatchShape
from baton.core.settings import setting
from baton.policies.base import PolicyContext, params_for
from baton.policies.least_loaded import LeastLoaded
from baton.policies.projection import ActiveCurves, PendingTable
from baton.predict.survival import SurvivalTable

_RATE_SMOOTHING = 0.05  # EMA weight of each decode iteration's rate in v̄_sys


@dataclass(frozen=True, slots=True)
class SibylParams:
    """SIBYL's parameters (Algorithm 1 and its appendix J ablations)."""

    delta_tokens: int = setting(64, gt=0, unit="tokens", doc="the survival table's bucket width Δ")
    alpha: float = setting(0.995, gt=0, le=1, doc="EMA smoothing α of the survival table")
    max_tokens: int = setting(65536, gt=0, unit="tokens", doc="longest output the survival table covers")
    prob: bool = setting(True, doc="weight projected loads by survival probability (false: PROB@1)")
    type1: bool = setting(True, doc="count Type 1: running decodes' projected load")
    type2: bool = setting(True, doc="count Type 2: bound requests whose decode starts by the handoff")
    type3: bool = setting(True, doc="count Type 3: bound requests starting after it (their prompts)")
    reqlevel: bool = setting(False, doc="count requests instead of tokens (REQLEVEL)")
    refresh_s: float = setting(1.0, ge=0, unit="s", doc="the oldest an instance's cached Type-1 curve may be")
    tick_s: float = setting(0.1, gt=0, unit="s", doc="how often stale curves are recomputed")
    refresh_budget: int = setting(64, ge=1, doc="instances whose curve one tick may recompute")


class Sibyl(LeastLoaded):
    """Early decode binding by projected load at the handoff moment (SIBYL, Algorithm 1).

    Prefills go to the instance with the least queued prefill work (as ``least-loaded``).
    The survival table projects each decoding request's remaining load; an instance's
    Type-1 curve is recomputed by a periodic ``tick`` when older than ``refresh_s``, at
    most ``refresh_budget`` instances per tick, so decisions only interpolate. Between
    refreshes a curve is kept exact for completions (their contribution is subtracted)
    and for joins (a request stays in the pending table until its instance is refreshed).
    """

    name = "sibyl"
    needs_bookings = True
    Params = SibylParams

    def __init__(self, context: PolicyContext, params: SibylParams | None = None, **values: Any) -> None:
        super().__init__(context)
        p = self.params = params_for(Sibyl, params, values)
        self.tick_interval_s = p.tick_s
        self.survival = SurvivalTable(p.delta_tokens, p.alpha, p.max_tokens)
        self.prob, self.types, self.reqlevel = p.prob, (p.type1, p.type2, p.type3), p.reqlevel
        self.refresh_s, self.refresh_budget = p.refresh_s, p.refresh_budget
        self.curves = ActiveCurves()
        self.pending = PendingTable()
        perf = context.perf
        self.v_sys = 1.0 / perf.iteration_time_s(BatchShape(n_decodes=32, decode_ctx_tokens=32 * 1500))
        self._prefill_grid = np.unique(np.geomspace(1, 1 << 18, 48).astype(np.int64))
        self._prefill_s = np.array([perf.prefill_time_s(int(t)) for t in self._prefill_grid])
        self._queue_s_per_token = perf.prefill_time_s(8192) / 8192
        self._ids_src: list[int] | None = None
        self._ids = np.zeros(0, dtype=np.int64)

    # --- estimates -----------------------------------------------------------------------
    def prefill_delay_s(self, view: ClusterView, prefill_instance: int, prompt_tokens: int) -> float:
        """δ: queued prefill work ahead of the prompt plus its own prefill time (s)."""
        queued = view.instance(prefill_instance).prefill_queue_tokens
        own = float(np.interp(prompt_tokens, self._prefill_grid, self._prefill_s))
        return queued * self._queue_s_per_token + own

    def _decode_ids(self, view: ClusterView) -> np.ndarray:
        ids = view.decode_ids
        if ids is not self._ids_src:
            self._ids_src, self._ids = ids, np.array(ids, dtype=np.int64)
            self.curves.ensure(int(self._ids.max()) + 1 if ids else 0)
            self._refresh(view, self._ids, np.inf, 0)  # curves of instances never seen
        return self._ids

    def _refresh(self, view: ClusterView, ids: np.ndarray, max_age_s: float, budget: int) -> None:
        for inst in self.curves.due(ids, view.now_s, max_age_s, budget):
            joined = self.curves.refresh(view, inst, self.survival, self.prob and not self.reqlevel,
                                         token_level=not self.reqlevel)
            for rid in joined.tolist():
                self.pending.remove(rid)

    def projected_loads(self, view: ClusterView, tau_s: float) -> tuple[np.ndarray, np.ndarray]:
        """(decode instance ids, projected load of each at ``tau_s``) in tokens, or in
        requests under REQLEVEL."""
        ids = self._decode_ids(view)
        if ids.size == 0:
            return ids, np.zeros(0)
        size = self.curves.t0_s.size
        if self.reqlevel:
            return ids, self.curves.evaluate(ids, tau_s) + self.pending.counts(size)[ids]
        load = self.curves.evaluate(ids, tau_s) if self.types[0] else np.zeros(ids.size)
        if self.types[1] or self.types[2]:
            load = load + self.pending.loads(tau_s, self.v_sys, self.survival, self.prob, size,
                                             self.types[1], self.types[2])[ids]
        return ids, load

    def assign(self, view: ClusterView, tau_s: float) -> int | None:
        """The decode instance with the least projected load at ``tau_s`` (ties: lowest id)."""
        ids, load = self.projected_loads(view, tau_s)
        return int(ids[load.argmin()]) if ids.size else None

    # --- hooks ---------------------------------------------------------------------------
    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        plan = super().plan_arrival(view, request, plan)
        if plan.decode_instance is not None or plan.prefill_instance is None:
            return plan
        prompt = request.request.prompt_tokens
        tau = view.now_s + self.prefill_delay_s(view, plan.prefill_instance, prompt)
        choice = self.assign(view, tau)
        if choice is None:
            return plan
        self.pending.add(request.req_id, choice, tau, prompt)
        return ArrivalPlan(plan.prefill_instance, choice, plan.prefill_chunk_limit_tokens)

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        choice = self.assign(view, view.now_s)
        if choice is not None:
            self.pending.add(request.req_id, choice, view.now_s, request.request.prompt_tokens)
        return choice

    def tick(self, view: ClusterView) -> list:
        """Off the decision path: recompute curves older than ``refresh_s`` (oldest first)."""
        self._refresh(view, self._decode_ids(view), self.refresh_s, self.refresh_budget)
        return []

    def observe(self, view: ClusterView, observation: Observation) -> None:
        if isinstance(observation, Completed):
            self.survival.update(observation.output_tokens)
            self.pending.remove(observation.req_id)
            st = view.ended_request(observation.req_id)  # None once a runtime forgot it
            if st is not None and st.decode_instance is not None:
                self.curves.forget(st.decode_instance, observation.req_id)
        elif isinstance(observation, PrefillDone):
            self.pending.set_start(observation.req_id, observation.now_s)
        elif isinstance(observation, DecodeProgress) and observation.mean_iteration_s > 0:
            # one EMA step per iteration the report covers, at its mean rate: v̄_sys does not
            # depend on how the runtime groups iterations into reports
            rate = 1.0 / observation.mean_iteration_s
            weight = _RATE_SMOOTHING if observation.iterations <= 1 else \
                1.0 - (1.0 - _RATE_SMOOTHING) ** observation.iterations
            self.v_sys += weight * (rate - self.v_sys)


STAGES = {"sibyl": Sibyl}
