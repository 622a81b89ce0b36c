"""``combined``: one scheduler built from the stages of the five papers and the field's
prefix-aware routing, with the conflicts between them resolved by one rule set, so that a
platform engineer need not know in advance which regime tomorrow's traffic is in.

Components (each can be switched off for ablations):

- ``prefill``: the prefill instance with the earliest predicted end of the prompt's
  prefill: its queue's predicted delay plus the prefill time of the prompt tokens not
  cached there (Arrow's quadratic for both), so a cached prefix and a short queue are
  traded in one unit, seconds. Where the cache is known from: ``prefix-approx`` (the
  default: the router's own history, no engine events needed), ``prefix-precise`` (the
  engines' caches, with predict-on-route entries), ``least-loaded`` (none: queue only).
  The peers' blends of a prefix share with request counts and scraped KV usage lost to
  queued prompt tokens where prompts share nothing (Azure conversation trace: attainment
  0.95 against 0.98 at 60 req/s on 4P4D). A queue is priced by the tokens its prompts
  will compute (``HitAwarePredictor``: the cached prefix expected at placement comes off
  until the prompt starts), in the placement of a prompt cached somewhere (one cached
  nowhere goes to the fewest booked tokens), deflection, re-plans and the flip
  controller's prefill pressure. Bookings count whole prompts: priced by them, the instance holding a
  popular prefix looked busiest exactly because it held it, the next prompts of that
  prefix went to cold instances and re-plans deflected queued prompts away from their
  cache (sessions workload on 4P4D, seeds 0-5 of ``benchmarks/combined.py --scales 8
  --workloads sessions``: max rate 23.8 req/s priced whole at commit f0c5784, 30.3 priced
  uncached at 7a468a9, prefix-precise 25.6);
- ``deflect``: Kairos's deflection, judged against the prefix-chosen prefill path (its
  predicted TTFT counts only the prompt tokens not already cached there: a cache hit is a
  reason to stay) and re-planned every tick for prompts still queued. Its TBT budget is
  ``deflect_tbt_share`` (0.8) x the TPOT SLO, not the SLO itself: decodes bound to the
  instance after a deflection was admitted lengthen its iterations until the next tick
  re-fits the chunk, and with the whole SLO as budget 19% of the Azure code trace's
  requests (short answers: a few iterations beside deflected chunks set their TPOT) missed
  the TPOT SLO at 5.4 req/s on 4P4D (1% at 0.8; Kairos alone: 20%). Chunks are sized
  with their attention to the prompt's earlier chunks counted (Kairos's
  ``chunk_attention``): on the Mooncake trace (12k-token prompts) leaving it out made 23%
  of requests miss the TPOT SLO at 1.5 req/s on 4P4D, counting it 0.2%;
- ``flips``: Arrow-style role changes when the prefill/decode demand ratio has shifted so
  far that the hotter side stays the hotter one after the flip, for longer than the flip costs
  (``combined_flips.FlipController``; ``flip_window_s`` 5 s: with 1 s the bursts of the
  Mooncake trace flipped instances 61 times in one run at 2 req/s on 4P4D, and the
  sessions workload lost 5% attainment at 12 req/s to flips that dropped prefill caches;
  with 5 s, 7 and 1 flips, while the reasoning workload's sustained decode demand still
  flips 9 times and lifts attainment from 0.30 to 0.99 at 4 req/s); one decision flips
  as many instances as the pressure gap allows without overshooting, at most
  ``flip_share`` (0.125) of the cluster; a prefill instance's flip costs the prefill
  seconds its prefix cache saved over the window, besides draining its queue;
- ``decode_binding``: ``iteration`` (by projected iteration time, ``iteration_binding``) or
  ``token-load``;
- ``migrate``: ARES's rebalancer, moving work only off instances whose projected KV exceeds
  their capacity within its horizon (``trigger: overflow``).

Conflict rules: who owns a request or an instance when two components want it.

1. A deflected prefill is never migrated before its first token: ARES sees only decodes
   running or preempted after producing tokens (a queued prompt is neither).
2. An instance flipped less than ``settle_s`` ago (this tick included) takes no deflection:
   its batch is changing, and the TBT check that admits a deflection reads a batch that
   will not be there.
3. An instance that is the source or target of a migration in flight is not flipped.
4. An instance flipped less than ``settle_s`` ago is neither a migration's source nor its
   target.
5. A decode instance with deflected prompts still queued, or targeted by one of this
   tick's deflection re-plans, is not flipped to prefill: they were admitted against its
   decode batch's TBT budget.
6. Order within a tick: deflection re-plans first (they drain the prefill queues the
   flip controller reads), then one flip decision, then migrations (rule 4 sees its flips).
7. Decode binding takes the prefill instance itself when it decodes (a deflected or
   colocated prompt: no KV transfer); it never sees an instance flipped to prefill.
8. A flip never leaves a side without an instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from baton.core.decisions import ArrivalPlan, Decision, Deflect
from baton.core.events import Observation
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.ares import Ares
from baton.policies.arrow import PAPER_TPOT_SLO_S, PAPER_TTFT_SLO_S, max_running_tokens
from baton.policies.base import PolicyContext, Stage, params_for
from baton.policies.combined_flips import CacheSavings, FlipController
from baton.policies.iteration_binding import bind_by_iteration
from baton.policies.kairos import Kairos
from baton.policies.prefill_time import HitAwarePredictor
from baton.policies.prefix_approx import PrefixApprox
from baton.policies.prefix_precise import PrefixPrecise
from baton.policies.selection import argmin_of

PREFILL_CHOICES = ("prefix-approx", "prefix-precise", "least-loaded")
BINDINGS = ("iteration", "token-load")


@dataclass(frozen=True, slots=True)
class CombinedParams:
    """The combined scheduler's components (each can be switched off) and their settings."""

    prefill: str = setting("prefix-approx", choices=PREFILL_CHOICES,
                           doc="the cache the prefill placement weighs: prefix-approx (the router's own history), "
                               "prefix-precise (the engines' caches), least-loaded (none: the least queued work)")
    deflect: bool = setting(True, doc="deflect prompts onto decode instances (Kairos) at arrival, and re-plan "
                                      "queued ones every tick")
    flips: bool = setting(True, doc="flip instances between prefill and decode when the demand ratio has "
                                    "shifted for longer than the flip costs")
    decode_binding: str = setting("iteration", choices=BINDINGS,
                                  doc="iteration: the decode instance whose projected next iteration with the "
                                      "request is shortest; token-load: the least token-loaded one")
    migrate: bool = setting(True, doc="migrate decodes (ARES) off instances whose projected KV would overflow")
    ttft_slo_s: float | None = setting(None, gt=0, unit="s",
                                       doc="the TTFT SLO deflection and the flips' prefill pressure aim at; "
                                           "unset: the run's, else 3 s")
    tpot_slo_s: float | None = setting(None, gt=0, unit="s",
                                       doc="the TPOT SLO: sets deflection's TBT budget, Max Running Tokens and "
                                           "the flips' decode pressure; unset: the run's, else 0.1 s")
    tick_s: float = setting(0.1, gt=0, unit="s", doc="how often deflections are re-planned and flips and "
                                                     "migrations are considered")
    flip_interval_s: float = setting(0.5, gt=0, unit="s", doc="least time between two checks for a flip")
    flip_window_s: float = setting(5.0, ge=0, unit="s",
                                   doc="how long a flip must be wanted without a break, besides its own cost, "
                                       "before it is made")
    settle_s: float = setting(3.0, ge=0, unit="s",
                              doc="how long a flipped instance takes no deflection, no migration and no flip")
    flip_min_pressure: float = setting(0.25, ge=0, doc="the hotter side's pressure (1.0 at its SLO) below which "
                                                       "nothing flips")
    flip_share: float = setting(0.125, gt=0, le=1, doc="most instances one flip decision moves, as a share of "
                                                       "the cluster (at least one)")
    migrate_interval_s: float = setting(1.0, gt=0, unit="s", doc="least time between two ARES migration rounds")
    max_chunk_tokens: int = setting(2048, ge=1, unit="tokens",
                                    doc="largest chunk of a deflected prompt a decode instance prefills per "
                                        "iteration; iteration binding counts a queued chunk of at most this")
    fixed_chunk: bool = setting(False, doc="deflect only where a whole max_chunk_tokens chunk keeps the TBT "
                                           "budget, never refitted (live vLLM: no per-request chunk limit)")
    deflect_tbt_share: float = setting(0.8, gt=0, le=1, doc="deflection's TBT budget, as a share of the TPOT SLO")
    chunk_attention: bool = setting(True, doc="size deflected chunks with their attention to the prompt's "
                                              "earlier chunks counted")


class Combined(Stage):
    """The combined scheduler (see the module docstring for components and rules)."""

    name = "combined"
    needs_bookings = True
    replans_prefills = True
    needs_prefix_keys = True
    Params = CombinedParams

    def __init__(self, context: PolicyContext, params: CombinedParams | None = None, **values: Any) -> None:
        p = self.params = params_for(Combined, params, values)
        super().__init__(context)
        self.ttft_slo_s = p.ttft_slo_s or context.ttft_slo_s or PAPER_TTFT_SLO_S
        self.tpot_slo_s = p.tpot_slo_s or context.tpot_slo_s or PAPER_TPOT_SLO_S
        self.prefix = {"prefix-approx": PrefixApprox, "prefix-precise": PrefixPrecise}.get(p.prefill)
        self.prefix = self.prefix(context, bind_decode=False) if self.prefix else None
        self.kairos = Kairos(context, ttft_slo_s=self.ttft_slo_s, tbt_slo_s=p.deflect_tbt_share * self.tpot_slo_s,
                             max_chunk_tokens=p.max_chunk_tokens, fixed_chunk=p.fixed_chunk,
                             chunk_attention=p.chunk_attention) if p.deflect else None
        mrt = max_running_tokens(context.perf, self.tpot_slo_s, 1024, context.perf.kv_capacity_tokens)
        self.predictor = HitAwarePredictor(context.perf)
        if self.kairos is not None:
            self.kairos.predictor = self.predictor  # re-plans price a queued prompt by its uncached tokens
        self.savings = CacheSavings(p.flip_window_s)
        self.flipper = FlipController(self.predictor, context.perf, self.ttft_slo_s, self.tpot_slo_s, mrt,
                                      p.flip_window_s, p.flip_min_pressure, p.flip_share,
                                      self.savings) if p.flips else None
        self.ares = Ares(context, trigger="overflow", interval_s=p.migrate_interval_s) if p.migrate else None
        self.decode_binding, self.chunk_tokens = p.decode_binding, p.max_chunk_tokens
        self.settle_s, self.flip_interval_s = p.settle_s, p.flip_interval_s
        self.tick_interval_s = p.tick_s if (p.deflect or p.flips or p.migrate) else None
        self._next_flip_s = self._next_migrate_s = 0.0
        self.flipped_at: dict[int, float] = {}
        self.counts = {"deflected_at_arrival": 0, "deflected_replanned": 0, "flips": 0, "migrations": 0,
                       "bindings": 0, "bindings_off_token_load": 0, "placements": 0, "matched_blocks": 0}

    # --- ownership ---------------------------------------------------------------------------
    def settling(self, now_s: float) -> frozenset[int]:
        """Instances flipped less than ``settle_s`` ago (rules 2 and 4)."""
        return frozenset(i for i, t in self.flipped_at.items() if now_s - t < self.settle_s)

    def migrating(self) -> frozenset[int]:
        """Sources and targets of migrations in flight (rule 3)."""
        if self.ares is None:
            return frozenset()
        return frozenset(i for pair in self.ares.in_flight.values() for i in pair)

    # --- arrival -------------------------------------------------------------------------------
    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        if plan.prefill_instance is not None or not (view.prefill_ids or view.decode_ids):
            return plan
        p, matched = self._pick_prefill(view, request)
        target = p
        if self.kairos is not None and _has_decode_only(view):
            self.kairos.exclude = self.settling(view.now_s)
            deflect = self._deflection(view, request, p, matched)
            if deflect is not None:
                target, chunk = deflect
                self.counts["deflected_at_arrival"] += 1
                self._placed(view, request, target, 0)
                return ArrivalPlan(target, target, chunk, plan.reject_reason, plan.role_changes)
        if target is None:
            return plan
        self._placed(view, request, target, matched)
        decode = target if view.instance(target).role.decodes else plan.decode_instance
        return ArrivalPlan(target, decode, plan.prefill_chunk_limit_tokens, plan.reject_reason, plan.role_changes)

    def _pick_prefill(self, view: ClusterView, request: RequestState) -> tuple[int | None, int]:
        """(the prefill instance with the earliest predicted prefill end, its cached blocks)."""
        ids = view.prefill_ids
        if not ids:
            return None, 0
        cached = self.prefix.cached_blocks(view, request) if self.prefix is not None else {}
        if not cached:
            return argmin_of(ids, view.prefill_loads(ids)), 0
        predictor, tokens = self.predictor, request.request.prompt_tokens
        best, best_key = None, None
        for i in ids:
            m = cached.get(i, 0)
            key = (predictor.delay(view, i) + predictor.pt(max(1, tokens - m * view.instance(i).block_size_tokens)), i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best, cached.get(best, 0)

    def _deflection(self, view: ClusterView, request: RequestState, p: int | None,
                    matched: int) -> tuple[int, int] | None:
        """(decode instance, chunk) when Kairos's rule prefers the decode path to prefill
        on ``p`` with its ``matched`` cached blocks; None to stay on ``p``."""
        kairos, tokens = self.kairos, request.request.prompt_tokens
        best = kairos.best_decode(view, tokens)
        if best is None:
            return None
        if p is None:
            return best[1], best[2]
        uncached = max(1, tokens - matched * view.instance(p).block_size_tokens)
        ttft_pf = kairos.predictor.delay(view, p) + kairos.predictor.pt(uncached) + kairos.transfer_s(view, tokens, p)
        return (best[1], best[2]) if kairos.qualifies(best[0], ttft_pf, request) else None

    def _placed(self, view: ClusterView, request: RequestState, instance_id: int, matched: int) -> None:
        self.counts["placements"] += 1
        self.counts["matched_blocks"] += matched
        if matched:
            tokens, cached = request.request.prompt_tokens, matched * view.instance(instance_id).block_size_tokens
            self.predictor.expect(instance_id, request.req_id, cached)
            pt = self.predictor.pt
            self.savings.record(instance_id, view.now_s, pt(tokens) - pt(max(1, tokens - cached)))
        if self.prefix is not None:
            self.prefix.record_placement(view, request, instance_id)

    # --- handoff -------------------------------------------------------------------------------
    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        src = request.prefill_instance
        if src is not None and view.has_instance(src):
            inst = view.instance(src)
            if inst.role.decodes and inst.healthy:
                return src
        ids = view.decode_ids
        if self.decode_binding == "token-load" or not ids:
            return view.least_token_load(ids)
        loads = view.token_loads(ids)
        by_load = int(ids[int(np.argmin(loads))])  # least_token_load's pick: the first of equals
        choice = bind_by_iteration(view, self.context.perf, request, ids, self.chunk_tokens, loads)
        self.counts["bindings"] += 1
        self.counts["bindings_off_token_load"] += choice != by_load
        return choice

    # --- tick ------------------------------------------------------------------------------------
    def tick(self, view: ClusterView) -> list[Decision]:
        now = view.now_s
        out: list[Decision] = []
        replans: list[Deflect] = []
        if self.kairos is not None and self.kairos.tick_interval_s and _has_decode_only(view):
            self.kairos.exclude = self.settling(now)
            replans = [d for d in self.kairos.tick(view) if isinstance(d, Deflect)]
            self.counts["deflected_replanned"] += sum(
                1 for d in replans if view.request(d.req_id).prefill_instance != d.instance)
            out += replans
        if self.flipper is not None and now >= self._next_flip_s:
            self._next_flip_s = now + self.flip_interval_s
            replanned = frozenset(d.instance for d in replans)  # rule 5 for this tick's deflections
            for flip in self.flipper.decide(view, self.settling(now) | self.migrating() | replanned):
                self.flipped_at[flip.instance_id] = now
                self.counts["flips"] += 1
                out.append(flip)
        if self.ares is not None and now >= self._next_migrate_s:
            self._next_migrate_s = now + self.ares.tick_interval_s
            self.ares.exclude = self.settling(now)
            moves = self.ares.tick(view)
            self.counts["migrations"] += len(moves)
            out += moves
        return out

    def observe(self, view: ClusterView, observation: Observation) -> None:
        if self.ares is not None:
            self.ares.observe(view, observation)

    def report(self) -> dict[str, float]:
        """Each component's activity: how often it acted (its contribution in the run)."""
        c = self.counts
        return {
            "combined_deflected_at_arrival": float(c["deflected_at_arrival"]),
            "combined_deflected_replanned": float(c["deflected_replanned"]),
            "combined_flips": float(c["flips"]),
            "combined_migrations": float(c["migrations"]),
            "combined_bindings_off_token_load_share":
                c["bindings_off_token_load"] / c["bindings"] if c["bindings"] else 0.0,
            "combined_matched_blocks_mean": c["matched_blocks"] / c["placements"] if c["placements"] else 0.0,
        }


def _has_decode_only(view: ClusterView) -> bool:
    """Whether any decode-only instance exists (deflection needs one)."""
    return any(not view.instance(i).role.prefills for i in view.decode_ids)


STAGES = {Combined.name: Combined}
