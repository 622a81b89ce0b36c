"""CascadeInfer: colocated instances as a pipeline over sequence length (section 4).

Stages take contiguous length ranges; a request enters the earliest stage whose range
covers its prompt, on that stage's least token-loaded instance, and migrates (live) to
the next stage when its context crosses the stage's upper bound, so batches stay nearly
length-homogeneous.

- **Planning** (4.2): every ``plan_interval_s`` the stages are re-planned with
  ``cascade_plan`` (exact DP by default, ``exact: false`` for the two-phase heuristic),
  costed by the QoE model the runtime fits for its perf model (``context.extras["qoe"]``),
  on the period's statistics: the snapshots of sequences in flight (queued prefills
  included) taken at every tick of the period, pooled and thinned by the number of snapshots
  to one concurrent population (``plan_window: false`` plans on the snapshot at planning
  time). Prefills are weighed by their residence in a stage (``prefill_residence_tokens``,
  the QoE profile's output length; see ``cascade_plan``). Instances go to stages in order of
  the median context they hold (``assign: stable``; ``id`` for id order), so an instance
  keeps the lengths it has; after a re-plan, sequences beyond their instance's new range
  hand over to the stage that covers them and the rest watch their new bound (``rewatch``).
  Work already on an instance stays. Before the first plan there is one stage.
- **Boundaries** are ``Watch``es set at arrival (``ArrivalPlan.watch_context_tokens``). A
  migrated request gets its next stage's watch on the first tick after its move lands
  (the contract has no migration-done event; lengths at least double between cuts, so a
  tick's delay is small).
- **Range refinement** (4.3), each tick, per stage bound: the stage's sequences merged with
  an even share of the next stage's (the average successor), split where
  Q(left) + Q(right) is least; the bound moves to that length by an EMA (``ema``, 0.5)
  and is frozen below ``freeze_below`` (5) sequences. ``refine: count`` / ``memory``
  split into equal counts / equal context tokens instead (the paper's ablations). One
  bound per stage (the paper lets each instance keep its own).
- **Bid-ask** (4.4) for handovers: all next-stage instances are asked; the more-loaded half
  (token load) is dropped, the 3 with the earliest start (least KV already on its way to
  them) are kept, and the first reply wins: Baton models reply order by that same start time
  (then load, then id). A receiver with ``max_moves`` (3) transfers arriving, or without
  free KV for the request, does not bid; with no bidder the request retries ``retry_tokens``
  later, unless every candidate is only full of transfers (or the sender already sends
  ``max_moves``: the limit holds both ways): then the ask waits in the stage's queue of
  asks, which receivers serve as transfers land in order of the sender's token load (most
  loaded first), except that an ask waiting ``starvation_s`` (2 s) or longer goes first
  (oldest first). Every ask goes to every candidate of its stage and all of them rank asks
  alike, so one queue per stage, served by whichever receiver frees a slot, stands for the
  paper's per-receiver queues. Within a stage, an instance ``outlier`` (25%) above the
  stage's mean token load gives its longest request to a peer by the same auction.
  ``balance: rr`` hands over round-robin; ``balance: inter`` skips the intra-stage part. A
  move is costed at the cluster's link for KV (``ClusterView.link_bytes_per_s``).
- ``layout: chain`` fixes one instance per stage on the length tiers; ``nopipe`` keeps
  one stage (the layout ablations).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from baton.core.decisions import ArrivalPlan, Decision, Migrate, MigrationMode, Watch
from baton.core.errors import ConfigError
from baton.core.events import DecodeProgress, Observation
from baton.core.request import Phase, RequestState
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, Stage, params_for
from baton.policies.cascade_guard import Arrivals, PlanGuard, current_stages
from baton.policies.cascade_params import CascadeParams
from baton.policies.cascade_stats import decoding_contexts, sequences_in_flight
from baton.policies.cascade_plan import PlanCost, exact_plan, heuristic_plan, split_point


class Cascade(Stage):
    """The CascadeInfer pipeline (see the module docstring)."""

    splices_streams = True  # returns Migrate
    name = "cascade"
    needs_bookings = True
    needs_qoe = True
    needs_colocated = True
    Params = CascadeParams

    def __init__(self, context: PolicyContext, params: CascadeParams | None = None, **values: Any) -> None:
        super().__init__(context)
        p = self.params = params_for(Cascade, params, values)
        self.layout, self.exact, self.refine, self.balance = p.layout, p.exact, p.refine, p.balance
        self.tick_interval_s, self.plan_interval_s = p.tick_interval_s, p.plan_interval_s
        self.ema, self.freeze_below, self.outlier, self.max_moves = p.ema, p.freeze_below, p.outlier, p.max_moves
        self.retry_tokens, self.first_cut, self.max_context = p.retry_tokens, p.first_cut, p.max_context
        self.mean_output, self.assign, self.rewatch, self.plan_window = (p.mean_output_tokens, p.assign, p.rewatch,
                                                                         p.plan_window)
        self.members: list[list[int]] = []  # instances by stage
        self.bounds: list[float] = []  # the stages' upper bounds (context tokens)
        self.moving: dict[int, int] = {}  # request -> target of its handover, until it lands
        self.guard = PlanGuard(p.hysteresis, p.prefill_share) if p.hysteresis is not None or p.prefill_share else None
        self.arrivals: list[int] = []  # prompt tokens of this period's arrivals
        self._period_start_s, self._rr = 0.0, itertools.count()
        self.residence, self.starvation_s, self.next_plan_s = p.prefill_residence_tokens, p.starvation_s, p.warmup_s
        self.window: list[tuple[np.ndarray, np.ndarray]] = []  # this period's snapshots
        self.asks: dict[int, tuple[int, float]] = {}  # request -> (target stage, asked at s)
        self.granted: dict[int, int] = {}  # receiver -> handovers arriving, not yet in its incoming
        self.sending: dict[int, int] = {}  # sender -> handovers under way
        self.output_tokens: dict[int, float] = {}  # instance -> tokens decoded this period
        self.stage_cvs: list[float] = []  # per stage and period: CV of output tokens per instance

    @property
    def qoe(self):
        return self.context.extras["qoe"]

    # --- layout --------------------------------------------------------------------------
    def start(self, view: ClusterView) -> list[Decision]:
        if "qoe" not in self.context.extras and (self.layout == "plan" or self.refine == "qoe"):
            raise ConfigError("cascade needs a QoE model in context.extras['qoe'] (simulate() and "
                              "baton serve fit one for their preset)")
        ids = sorted(view.decode_ids)
        if self.layout == "chain":
            self.members = [[i] for i in ids]
            self.bounds = [float(self.first_cut * 2 ** k) for k in range(len(ids) - 1)] + [math.inf]
        else:
            self.members, self.bounds = [ids], [math.inf]
        return []

    def stage_of(self, instance_id: int) -> int:
        return next((s for s, m in enumerate(self.members) if instance_id in m), len(self.members) - 1)

    def _period(self, view: ClusterView) -> tuple[np.ndarray, np.ndarray]:
        """The period's population: its snapshots pooled and thinned to one snapshot's worth
        (Eq. 1's n is a concurrent batch), or the snapshot now without ``plan_window``."""
        if not (self.plan_window and self.window):
            return sequences_in_flight(view, sorted(view.decode_ids))
        prompt = np.concatenate([w[0] for w in self.window])
        ctx = np.concatenate([w[1] for w in self.window])
        keep = self.context.rng.random(len(ctx)) < 1.0 / len(self.window)
        self.window = []
        return prompt[keep], ctx[keep]

    def _forget_ended(self, view: ClusterView) -> None:
        """Drop asks and handovers of requests that ended (the live view forgets them)."""
        for book in (self.asks, self.moving):
            for rid in [r for r in book if not view.has_request(r)]:
                del book[rid]

    def observe(self, view: ClusterView, observation: Observation) -> None:
        if isinstance(observation, DecodeProgress):  # ended requests are dropped by _forget_ended
            i = observation.instance_id
            self.output_tokens[i] = self.output_tokens.get(i, 0.0) + observation.iterations * view.instance(i).decodes.n

    def _close_period(self) -> None:
        """The CV of output tokens per instance within each stage of two or more instances
        over the period that ends (the paper's Figure 16 metric)."""
        for members in self.members:
            tokens = np.array([self.output_tokens.get(i, 0.0) for i in members])
            if len(members) > 1 and tokens.mean() > 0:
                self.stage_cvs.append(float(tokens.std() / tokens.mean()))
        self.output_tokens = {}

    def report(self) -> dict[str, float]:
        cvs = self.stage_cvs
        return {"stage_output_cv": float(np.mean(cvs)) if cvs else float("nan"), "stage_periods": float(len(cvs)),
                **{f"cascade_plans_{k}": float(v) for k, v in (self.guard.counts if self.guard else {}).items()}}

    def _replan(self, view: ClusterView) -> None:
        prompt, ctx = self._period(view)
        if len(ctx) < self.freeze_below:
            return
        link = view.link_bytes_per_s(*view.decode_ids)  # the runtime's; a move may cross any of them
        cost = PlanCost(prompt, ctx, self.qoe, self.context.perf.kv_bytes_per_token, link, self.mean_output,
                        self.first_cut, self.max_context, self.residence)
        ids = sorted(view.decode_ids)
        plan = (exact_plan if self.exact else heuristic_plan)(cost, len(ids))
        if self.guard is not None:
            plan = self.guard.admit(plan, cost, self._current(cost), self._decoding(view), self._arrival_load(view),
                                    len(ids))
            if plan is None:
                return
        if self.assign == "stable":
            median = {i: float(np.median(c)) if len(c := view.decode_snapshot(i)[1]) else 0.0 for i in ids}
            ids.sort(key=lambda i: (median[i], i))
        it = iter(ids)
        self.members = [[next(it) for _ in range(k)] for k in plan.instances]
        self.bounds = list(plan.bounds)
        self.asks = {}  # re-asked by the re-watch against the new stages

    def _current(self, cost: PlanCost) -> list[tuple[int, int, int]]:
        """The stages now, on the plan's tier edges (a refined bound at its nearest edge)."""
        return current_stages(cost, self.bounds, [len(m) for m in self.members])

    def _decoding(self, view: ClusterView) -> np.ndarray:
        return decoding_contexts(view, sorted(view.decode_ids))

    def _arrival_load(self, view: ClusterView) -> Arrivals:
        """The period's arrivals for the guard's capacity rule; a new period starts."""
        prompts, self.arrivals = np.array(self.arrivals, dtype=float), []
        period_s, self._period_start_s = max(view.now_s - self._period_start_s, 1e-9), view.now_s
        chunk = 2048
        return Arrivals(prompts, period_s, chunk / max(self.context.perf.prefill_time_s(chunk, chunk), 1e-9))

    # --- routing -------------------------------------------------------------------------
    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        tokens = request.request.prompt_tokens
        if self.guard is not None:  # its capacity rule reads the period's arrivals
            self.arrivals.append(tokens)
        s = next(k for k, b in enumerate(self.bounds) if tokens < b)
        live = [i for i in self.members[s] if view.instance(i).healthy] or view.decode_ids
        inst = min(live, key=lambda i: (view.token_load(i), i))
        bound = self.bounds[s]
        return ArrivalPlan(inst, inst, None, plan.reject_reason, plan.role_changes,
                           None if math.isinf(bound) else int(bound))

    def on_threshold(self, view: ClusterView, req_id: int, context_tokens: int) -> list[Decision]:
        self.granted, self.sending = self._under_way(view)
        st = view.request(req_id)
        if st.done or st.decode_instance is None or st.migrating or req_id in self.asks:
            return []
        s = self.stage_of(st.decode_instance)
        if s + 1 >= len(self.members) or context_tokens < self.bounds[s]:
            return [] if s + 1 >= len(self.members) else [Watch(req_id, int(self.bounds[s]))]
        return self._hand_over(view, req_id, s + 1, context_tokens)

    def _hand_over(self, view: ClusterView, req_id: int, stage: int, context_tokens: int) -> list[Decision]:
        """Ask stage ``stage`` to take ``req_id``: a migration, a queued ask (every receiver
        busy with transfers) or a retry after ``retry_tokens`` (no receiver has room)."""
        sender_busy = self._sender_busy(view, req_id)
        target = None if sender_busy else self.choose_receiver(view, self.members[stage], context_tokens)
        if target is not None:
            self.asks.pop(req_id, None)
            return [self._move(view, req_id, target)]
        if self.balance == "bidask" and (sender_busy or self._only_busy(view, self.members[stage], context_tokens)):
            self.asks.setdefault(req_id, (stage, view.now_s))
            return []
        return [Watch(req_id, context_tokens + self.retry_tokens)]

    def _move(self, view: ClusterView, req_id: int, target: int) -> Migrate:
        """A handover, counted against the target's and the sender's transfer slots."""
        self.moving[req_id] = target
        self.granted[target] = self.granted.get(target, 0) + 1
        sender = view.request(req_id).decode_instance
        self.sending[sender] = self.sending.get(sender, 0) + 1
        return Migrate(req_id, target, MigrationMode.LIVE)

    def _sender_busy(self, view: ClusterView, req_id: int) -> bool:
        """The request's instance already sends ``max_moves`` requests away."""
        return self.sending.get(view.request(req_id).decode_instance, 0) >= self.max_moves

    def _under_way(self, view: ClusterView) -> tuple[dict[int, int], dict[int, int]]:
        """Handovers decided and not landed: per receiver those not yet in its ``incoming``
        (the gateway registers a move only once the continuation answers), per sender all."""
        arriving: dict[int, int] = {}
        sending: dict[int, int] = {}
        for rid, target in self.moving.items():
            src = view.request(rid).decode_instance if view.has_request(rid) else None
            if src is None or src == target:
                continue
            sending[src] = sending.get(src, 0) + 1
            if rid not in view.instance(target).incoming:
                arriving[target] = arriving.get(target, 0) + 1
        return arriving, sending

    def _has_room(self, view: ClusterView, i: int, context_tokens: int) -> bool:
        """Instance ``i`` is healthy and has free KV for the request (its transfer slots aside)."""
        inst = view.instance(i)
        return inst.healthy and inst.kv_blocks_free_at(view.now_s) * inst.block_size_tokens > context_tokens

    def _slot_free(self, view: ClusterView, i: int) -> bool:
        return len(view.instance(i).incoming) + self.granted.get(i, 0) < self.max_moves

    def _only_busy(self, view: ClusterView, candidates: list[int], context_tokens: int) -> bool:
        """Some candidate would bid for the request but for its ``max_moves`` transfers."""
        return any(self._has_room(view, i, context_tokens) and not self._slot_free(view, i) for i in candidates)

    def ask_order(self, view: ClusterView) -> list[int]:
        """Queued asks in the order receivers serve them: starving ones (waited at least
        ``starvation_s``) first, oldest first; then by the sender's token load, highest first."""
        def key(rid: int) -> tuple:
            since = self.asks[rid][1]
            if view.now_s - since >= self.starvation_s:
                return (0, since, 0.0, rid)
            sender = view.request(rid).decode_instance
            return (1, 0.0, -(view.token_load(sender) if sender is not None else 0.0), rid)
        return sorted(self.asks, key=key)

    def _serve_asks(self, view: ClusterView) -> list[Decision]:
        out: list[Decision] = []
        for rid in self.ask_order(view):
            st = view.request(rid)
            if st.migrating or st.decode_instance is None:
                continue  # moving or recovering: asked again once it is back on an instance
            stage, _ = self.asks[rid]
            if self._sender_busy(view, rid):
                continue
            target = self.choose_receiver(view, self.members[stage], view.context_tokens(rid))
            if target is not None:
                del self.asks[rid]
                out.append(self._move(view, rid, target))
        return out

    def choose_receiver(self, view: ClusterView, candidates: list[int], context_tokens: int) -> int | None:
        """The bid-ask auction (or round-robin with ``balance: rr``) over ``candidates``."""
        bidders = [i for i in candidates if self._has_room(view, i, context_tokens) and self._slot_free(view, i)]
        if not bidders:
            return None
        if self.balance == "rr":
            return bidders[next(self._rr) % len(bidders)]
        by_load = sorted(bidders, key=lambda i: (view.token_load(i), i))[: (len(bidders) + 1) // 2]
        # of the three earliest starts the first to reply wins, and replies come in start order
        return min(by_load, key=lambda i: (view.incoming_tokens(i), view.token_load(i), i))

    # --- ticks ---------------------------------------------------------------------------
    def tick(self, view: ClusterView) -> list[Decision]:
        self._forget_ended(view)
        out = self._landed(view)
        self.granted, self.sending = self._under_way(view)
        period_ends = view.now_s >= self.next_plan_s
        if period_ends:
            self.next_plan_s = view.now_s + self.plan_interval_s
            self._close_period()
        if period_ends and self.layout == "plan":
            self._replan(view)
            if self.rewatch:
                out += self._rewatch(view)
        elif self.refine != "off" and self.layout != "nopipe":
            self._refine(view)
        if self.layout == "plan" and self.plan_window:
            self.window.append(sequences_in_flight(view, sorted(view.decode_ids)))
        out += self._serve_asks(view)
        if self.balance == "bidask":
            out += self._intra_stage(view)
        return out

    def _rewatch(self, view: ClusterView) -> list[Decision]:
        """After a re-plan: a sequence beyond its instance's new range hands over to the
        stage that covers it; the others watch their stage's new bound."""
        out: list[Decision] = []
        for s, members in enumerate(self.members):
            for i in members:
                rids, ctx, _ = view.decode_snapshot(i)
                for r, c in zip(rids.tolist(), ctx.tolist()):
                    if r in self.moving or r in self.asks or view.request(r).migrating:
                        continue
                    t = next(k for k, b in enumerate(self.bounds) if c < b)
                    if t > s:
                        out += self._hand_over(view, r, t, int(c))
                    elif not math.isinf(self.bounds[s]):
                        out.append(Watch(r, int(self.bounds[s])))
        return out

    def _landed(self, view: ClusterView) -> list[Decision]:
        out = []
        for rid, target in list(self.moving.items()):
            st = view.request(rid)
            if st.decode_instance == target and not st.migrating and st.phase is Phase.DECODE:
                del self.moving[rid]
                s = self.stage_of(target)
                if not math.isinf(self.bounds[s]):
                    out.append(Watch(rid, int(self.bounds[s])))
            elif not st.migrating and st.decode_instance != target and rid not in view.instance(target).incoming:
                # refused or failed: it stayed put; its watch fires again a little later
                del self.moving[rid]
                out.append(Watch(rid, view.context_tokens(rid) + self.retry_tokens))
        return out

    def _refine(self, view: ClusterView) -> None:
        for s in range(len(self.members) - 1):
            own, nxt = decoding_contexts(view, self.members[s]), decoding_contexts(view, self.members[s + 1])
            m = len(self.members[s + 1])
            merged = np.sort(np.concatenate([own, np.sort(nxt)[min(m // 2, max(len(nxt) - 1, 0))::m]]))
            if len(merged) < self.freeze_below:
                continue
            raw = split_point(merged, self.refine, self.qoe.d if self.refine == "qoe" else None)
            self.bounds[s] = (1 - self.ema) * self.bounds[s] + self.ema * raw
            if s > 0:
                self.bounds[s] = max(self.bounds[s], self.bounds[s - 1] + 1)

    def _intra_stage(self, view: ClusterView) -> list[Decision]:
        out: list[Decision] = []
        for members in self.members:
            if len(members) < 2:
                continue
            loads = {i: view.token_load(i) for i in members}
            mean = sum(loads.values()) / len(loads)
            for i in members:
                if mean <= 0 or loads[i] <= (1 + self.outlier) * mean or self.sending.get(i, 0) >= self.max_moves:
                    continue
                rids, ctx, _ = view.decode_snapshot(i)
                free = [(int(c), int(r)) for r, c in zip(rids, ctx)
                        if int(r) not in self.moving and int(r) not in self.asks]
                if not free:
                    continue
                c, rid = max(free)
                target = self.choose_receiver(view, [j for j in members if j != i], c)
                if target is not None and loads[target] + c < loads[i] - c:
                    out.append(self._move(view, rid, target))
        return out


STAGES = {"cascade": Cascade}
