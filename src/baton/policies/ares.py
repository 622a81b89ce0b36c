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

import numpy as np

from baton.core.decisions import Decision, Migrate, MigrationMode
from baton.core.events import Observation
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, Stage
from baton.predict import NoPrediction, build_estimator


class Ares(Stage):
    """Decode rebalancer. See the module docstring for the algorithm and parameters."""

    splices_streams = True  # returns Migrate
    name = "ares"
    needs_bookings = True

    def __init__(self, context: PolicyContext, estimator: str = "survival", interval_s: float = 1.0,
                 horizon_tokens: int = 2000, horizon_steps: int = 8, beta: float = 0.8, theta: float = 0.1,
                 max_migrations: int = 1, max_per_instance: int = 1, mode: str = "live",
                 repredict_tokens: int = 20, memory_headroom: float = 0.95,
                 max_targets: int = 32, move_preempted: bool = False, estimator_params: dict | None = None,
                 trigger: str = "variance") -> None:
        super().__init__(context)
        if interval_s <= 0 or horizon_steps < 1 or horizon_tokens < horizon_steps or max_migrations < 1:
            raise ValueError("need interval_s > 0, horizon_steps >= 1, horizon_tokens >= horizon_steps, "
                             "max_migrations >= 1")
        if trigger not in ("variance", "overflow"):
            raise ValueError(f"trigger: expected 'variance' or 'overflow', got {trigger!r}")
        self.trigger = trigger
        # decode instances another stage owns at the moment (a composed scheduler's conflict
        # rules): neither source nor target; none when ARES runs alone
        self.exclude: frozenset[int] = frozenset()
        step_tokens = horizon_tokens // horizon_steps
        self.move_preempted = move_preempted
        self.tick_interval_s = interval_s
        self.estimator = build_estimator(estimator, rng=context.rng, **(estimator_params or {}))
        # Without a prediction, a request's load is its current context for the whole
        # horizon and the worth-it filter cannot apply ("rescheduling without prediction").
        self.static = isinstance(self.estimator, NoPrediction)
        self.horizon, self.step_tokens, self.theta = horizon_steps, step_tokens, theta
        betas = beta ** np.arange(1, horizon_steps + 1)
        self.beta = betas / betas.sum()
        self.weights = np.concatenate([[1.0], self.beta])  # σ0² plus the weighted future terms
        self.max_migrations, self.max_per_instance = max_migrations, max_per_instance
        self.mode = MigrationMode(mode)
        self.k = max(1, repredict_tokens)
        self.headroom = memory_headroom
        self.max_targets = max(1, max_targets)
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
