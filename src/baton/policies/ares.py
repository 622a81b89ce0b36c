"""ARES: periodic decode-to-decode rescheduling that minimises the time-weighted variance
of token load across decode instances (ARES section 5, Algorithm 1).

Token load of an instance at horizon step t (t = 0 is now) is the sum over its requests of
``ctx + t*s`` while the request is predicted to still run (``remaining > t*s``), where s is
the tokens each request generates per step; incoming KV counts as load throughout. Each
round:
1. classify: w_i = Σ β_t N̂_i(t) (β normalised to sum 1); overloaded if w_i > (1+θ) w̄,
   candidate target if N_i(0) < (1+θ) w̄;
2. enumerate (request, source, target): predicted remaining tokens above the migration
   cost in iterations (KV transfer time / source iteration time), and the target's peak
   predicted load over the horizon plus the request's predicted final size (context plus
   predicted remaining) within the target's KV capacity;
3. pick the move with the largest drop of Var(N(0)) + Σ β_t Var(N̂(t)); none if no move
   lowers it (targets limited to the ``max_targets`` least loaded candidates). With
   ``max_migrations > 1`` further moves are chosen greedily on the updated loads. At most ``max_per_instance`` migrations touch an instance at once.

Requests preempted on an instance and waiting there to recompute count as its load (ARES
counts only running requests: a deviation). With ``move_preempted`` (off by default, also
a deviation) they are candidates too and move by recompute, i.e. to the target's queue.

The horizon is ``horizon_tokens`` (default 2,000) in ``horizon_steps`` (8) steps: about
a median request's remaining life on the ARES reasoning workload (outputs with a median of
1,500-2,000 tokens). The earlier 8 x 50 tokens (about 8 s) saw almost no request end
inside the horizon, so the predicted-remaining term had nearly nothing to act on.

With ``trigger: overflow`` (Baton's, used by the combined scheduler) only instances whose
projected load exceeds ``memory_headroom`` x their KV capacity within the horizon are
sources: ARES's variance objective still picks the move, but nothing moves for balance alone.

Remaining lengths come from any ``LengthEstimator`` (``estimator`` by name, its keyword
parameters in ``estimator_params``); predictions are refreshed every
``repredict_tokens`` generated tokens (section 5.3), i.e. a request's prediction is made at
the last multiple of k tokens and counted down since.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from baton.core.decisions import Decision, Migrate, MigrationMode
from baton.core.events import Observation
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, Stage, params_for
from baton.predict import ESTIMATORS, NoPrediction, build_estimator


@dataclass(frozen=True, slots=True)
class AresParams:
    """ARES's parameters and those of the deviations the module docstring names."""

    estimator: str = setting("survival", choices=tuple(ESTIMATORS),
                             doc="remaining-length estimator that projects each request's load over the horizon "
                                 "(none: its current context throughout, and no worth-it filter)")
    interval_s: float = setting(1.0, gt=0, unit="s", doc="how often a rescheduling round runs")
    horizon_tokens: int = setting(2000, ge=1, unit="tokens",
                                  doc="tokens a request generates over the whole look-ahead horizon")
    horizon_steps: int = setting(8, ge=1, doc="steps the horizon is divided into; the load is projected at each")
    beta: float = setting(0.8, gt=0, doc="decay β of the future steps' weights (β^t, normalised to sum 1) in "
                                         "the classification and the objective")
    theta: float = setting(0.1, ge=0, doc="margin θ: overloaded above (1+θ) x the mean weighted future load, "
                                          "a candidate target when its current load is below that")
    max_migrations: int = setting(1, ge=1, doc="migrations one round may start (after the first, chosen greedily "
                                               "on the updated loads)")
    max_per_instance: int = setting(1, ge=1, doc="migrations in flight an instance may take part in, as source "
                                                 "or target")
    mode: str = setting("live", choices=tuple(m.value for m in MigrationMode),
                        doc="how a running decode moves: live (pre-copy), stop-copy or recompute (a waiting "
                            "preempted request always moves by recompute)")
    repredict_tokens: int = setting(20, ge=1, unit="tokens",
                                    doc="generated tokens between two predictions of a request's remaining length "
                                        "(k; counted down in between)")
    memory_headroom: float = setting(0.95, gt=0, le=1,
                                     doc="share of an instance's KV capacity a move may fill (the target's peak "
                                         "projected load plus the request's predicted final size); with trigger "
                                         "overflow, sources are instances projected beyond it")
    max_targets: int = setting(32, ge=1, doc="least-loaded candidate targets a round considers (bounds its cost "
                                             "at scale)")
    move_preempted: bool = setting(False, doc="also move requests preempted and waiting to recompute (by "
                                              "recompute, to the target's queue)")
    estimator_params: dict[str, Any] | None = setting(None, doc="keyword parameters of the estimator (for example "
                                                                "weights for learned)")
    trigger: str = setting("variance", choices=("variance", "overflow"),
                           doc="variance: any overloaded instance is a source (ARES); overflow: only those whose "
                               "projected load passes memory_headroom x their KV capacity within the horizon")


class Ares(Stage):
    """Decode rebalancer. See the module docstring for the algorithm."""

    splices_streams = True  # returns Migrate
    name = "ares"
    needs_bookings = True
    Params = AresParams

    def __init__(self, context: PolicyContext, params: AresParams | None = None, **values: Any) -> None:
        super().__init__(context)
        p = self.params = params_for(Ares, params, values)
        if p.horizon_tokens < p.horizon_steps:
            raise ValueError("need horizon_tokens >= horizon_steps")
        self.trigger = p.trigger
        # decode instances another stage owns at the moment (a composed scheduler's conflict
        # rules): neither source nor target; none when ARES runs alone
        self.exclude: frozenset[int] = frozenset()
        step_tokens = p.horizon_tokens // p.horizon_steps
        self.move_preempted = p.move_preempted
        self.tick_interval_s = p.interval_s
        self.estimator = build_estimator(p.estimator, rng=context.rng, **(p.estimator_params or {}))
        # Without a prediction, a request's load is its current context for the whole
        # horizon and the worth-it filter cannot apply ("rescheduling without prediction").
        self.static = isinstance(self.estimator, NoPrediction)
        self.horizon, self.step_tokens, self.theta = p.horizon_steps, step_tokens, p.theta
        betas = p.beta ** np.arange(1, p.horizon_steps + 1)
        self.beta = betas / betas.sum()
        self.weights = np.concatenate([[1.0], self.beta])  # σ0² plus the weighted future terms
        self.max_migrations, self.max_per_instance = p.max_migrations, p.max_per_instance
        self.mode = MigrationMode(p.mode)
        self.k = max(1, p.repredict_tokens)
        self.headroom = p.memory_headroom
        self.max_targets = max(1, p.max_targets)
        self.in_flight: dict[int, tuple[int, int]] = {}  # req id -> (source, target)

    def observe(self, view: ClusterView, observation: Observation) -> None:
        self.estimator.observe(view, observation)

    def report(self) -> dict[str, float]:
        """The learned estimator's prediction count (live: one per hidden state received)."""
        count = getattr(self.estimator, "predictions", None)
        return {} if count is None else {"length_predictions": float(count)}

    # --- the load model ----------------------------------------------------------------
    def snapshot(self, view: ClusterView, ids: np.ndarray):
        """Every instance's requests: running decodes, then those preempted there and
        waiting to recompute (load all the same: they decode there again). Returns
        (req ids, owner position, ctx, remaining, waiting mask)."""
        id_list = ids.tolist()
        req_ids, ctx, gen, owner = view.decode_snapshots(id_list)
        waiting = np.zeros(req_ids.size, dtype=bool)
        extra = [(pos, r) for pos, i in enumerate(id_list) if view.instance(i).prefill_queue
                 for r in view.waiting_decodes(i)]
        if extra:
            w_owner = np.array([p for p, _ in extra], dtype=np.int64)
            w_ids = np.array([r for _, r in extra], dtype=np.int64)
            order = np.argsort(np.concatenate([owner, w_owner]), kind="stable")  # each instance's rows together
            req_ids = np.concatenate([req_ids, w_ids])[order]
            ctx = np.concatenate([ctx, [view.context_tokens(r) for _, r in extra]])[order]
            gen = np.concatenate([gen, [view.generated_tokens(r) for _, r in extra]])[order]
            owner = np.concatenate([owner, w_owner])[order]
            waiting = np.concatenate([waiting, np.ones(len(extra), dtype=bool)])[order]
        ctx, gen = ctx.astype(np.float64), gen.astype(np.float64)
        since = gen % self.k  # tokens since the last (re-)prediction
        remaining = np.maximum(self.estimator.remaining_batch(view, req_ids, gen - since) - since, 0.0)
        return req_ids, owner, ctx, remaining, waiting

    def trajectories(self, ctx: np.ndarray, remaining: np.ndarray) -> np.ndarray:
        """Each request's token load at steps 0..H (rows: requests)."""
        if self.static:
            return np.repeat(ctx[:, None], self.horizon + 1, axis=1)
        grown = self.step_tokens * np.arange(self.horizon + 1, dtype=np.float64)[None, :]
        alive = (remaining[:, None] > grown) | (grown == 0)
        return np.where(alive, ctx[:, None] + np.minimum(grown, remaining[:, None]), 0.0)

    def instance_loads(self, view: ClusterView, ids: np.ndarray, owner: np.ndarray,
                       traj: np.ndarray) -> np.ndarray:
        """Token load per instance position and step (rows: instances)."""
        loads = np.column_stack([np.bincount(owner, weights=traj[:, c], minlength=ids.size)
                                 for c in range(self.horizon + 1)])
        incoming = np.array([view.incoming_tokens(int(i)) for i in ids], dtype=np.float64)
        return loads + incoming[:, None]

    def objective(self, loads: np.ndarray) -> float:
        """Var(N(0)) + Σ β_t Var(N̂(t)), tokens²."""
        return float(loads.var(axis=0) @ self.weights)

    # --- the round -------------------------------------------------------------------------
    def _purge(self, view: ClusterView) -> None:
        """Forget migrations that have finished or were refused, and those of requests
        that ended (live, an ended request is gone from the view)."""
        for rid in [r for r in self.in_flight if not view.has_request(r) or not view.request(r).migrating]:
            del self.in_flight[rid]

    def _busy(self, ids: np.ndarray) -> np.ndarray:
        """Instances already at the concurrent-migration cap (by position)."""
        pos = {int(i): p for p, i in enumerate(ids)}
        count = np.zeros(ids.size, dtype=np.int64)
        for src, dst in self.in_flight.values():
            for inst in (src, dst):
                if inst in pos:
                    count[pos[inst]] += 1
        for inst in self.exclude:
            if inst in pos:
                count[pos[inst]] = self.max_per_instance
        return count >= self.max_per_instance

    def classify(self, loads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Phase 1: (overloaded, candidate targets) as boolean masks over positions."""
        w = loads[:, 1:] @ self.beta
        bar = w.mean()
        return w > (1 + self.theta) * bar, loads[:, 0] < (1 + self.theta) * bar

    def candidates(self, iter_s: np.ndarray, owner: np.ndarray, ctx: np.ndarray,
                   remaining: np.ndarray, over: np.ndarray, req_ids: np.ndarray, link: np.ndarray) -> np.ndarray:
        """Phase 2 (first filter): rows of requests on overloaded instances whose predicted
        remaining tokens exceed the migration cost in iterations (its KV over the link of
        the instance it is on, ``link`` in bytes/s by position)."""
        rows = np.flatnonzero(over[owner])
        if rows.size == 0:
            return rows
        cost_iters = self.context.perf.kv_bytes(1) * ctx[rows] / link[owner[rows]] / iter_s[owner[rows]]
        keep = (remaining[rows] > cost_iters) | (self.static & (remaining[rows] >= 0))
        moving = np.isin(req_ids[rows], np.fromiter(self.in_flight, dtype=np.int64, count=len(self.in_flight)))
        return rows[keep & ~moving]

    def targets(self, loads: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Candidate targets: the ``max_targets`` least loaded (by weighted future load) of
        ``mask``; all of them when there are fewer. Bounds a round's cost at scale."""
        pos = np.flatnonzero(mask)
        if pos.size > self.max_targets:
            w = loads[pos] @ self.weights
            pos = np.sort(pos[np.argpartition(w, self.max_targets - 1)[: self.max_targets]])
        return pos

    def best_move(self, loads: np.ndarray, traj: np.ndarray, rows: np.ndarray, owner: np.ndarray,  # noqa: PLR0913
                  targets: np.ndarray, capacity: np.ndarray, need: np.ndarray) -> tuple[int, int, float] | None:
        """Phase 2 (memory) and 3: the (row, target position, Δobjective) with the lowest
        Δ < 0, or None. Δ of moving x from s to t, per step: 2x(x - L_s + L_t)/n."""
        if rows.size == 0 or targets.size == 0:
            return None
        x = traj[rows]  # (R, H+1)
        ls = loads[owner[rows]]
        n = loads.shape[0]
        own = (x * (x - ls)) @ self.weights  # (R,)
        cross = (x * self.weights) @ loads[targets].T  # (R, T)
        delta = 2.0 / n * (own[:, None] + cross)
        fits = loads[targets].max(axis=1)[None, :] + need[rows][:, None] <= capacity[targets][None, :]
        delta = np.where(fits & (owner[rows][:, None] != targets[None, :]), delta, np.inf)
        r, t = np.unravel_index(int(np.argmin(delta)), delta.shape)
        return (int(rows[r]), int(targets[t]), float(delta[r, t])) if delta[r, t] < -1e-9 else None

    def tick(self, view: ClusterView) -> list[Decision]:
        self._purge(view)
        ids = np.array(view.decode_ids, dtype=np.int64)
        if ids.size < 2:
            return []
        req_ids, owner, ctx, remaining, waiting = self.snapshot(view, ids)
        if req_ids.size == 0:
            return []
        traj = self.trajectories(ctx, remaining)
        loads = self.instance_loads(view, ids, owner, traj)
        capacity = np.array([view.instance(int(i)).kv_blocks_total * view.instance(int(i)).block_size_tokens
                             for i in ids], dtype=np.float64) * self.headroom
        iter_s = np.array([max(view.token_interval_s(int(i)), 1e-4) for i in ids])
        link = np.array([view.link_bytes_per_s(int(i)) for i in ids])
        busy = self._busy(ids)
        need = np.where(self.static, ctx, ctx + remaining)  # the request's final size
        if not self.move_preempted:
            remaining = np.where(waiting, -1.0, remaining)  # load, but never a candidate
        decisions: list[Decision] = []
        while len(decisions) < self.max_migrations:
            over, under = self.classify(loads)
            if self.trigger == "overflow":  # sources only where projected KV outgrows the capacity
                over &= loads.max(axis=1) > capacity
            rows = self.candidates(iter_s, owner, ctx, remaining, over & ~busy, req_ids, link)
            move = self.best_move(loads, traj, rows, owner, self.targets(loads, under & ~busy), capacity, need)
            if move is None:
                break
            row, tgt, _ = move
            src = int(owner[row])
            loads[src] -= traj[row]
            loads[tgt] += traj[row]
            remaining[row] = -1.0  # never chosen twice
            rid = int(req_ids[row])
            self.in_flight[rid] = (int(ids[src]), int(ids[tgt]))
            # a waiting request has no KV to copy: it moves to the target's queue
            decisions.append(Migrate(rid, int(ids[tgt]), MigrationMode.RECOMPUTE if waiting[row] else self.mode))
            busy = self._busy(ids)
        return decisions


STAGES = {"ares": Ares}
