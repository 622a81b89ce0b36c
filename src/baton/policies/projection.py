"""Incremental projected-load state for SIBYL-style decode assignment.

``ActiveCurves`` holds, per decode instance, the Type-1 projected load of its running
decodes as a function of the look-ahead horizon, computed at a refresh time t0 on a fixed
grid of horizons and interpolated at decision time; so a decision costs O(instances),
not O(requests). ``PendingTable`` holds requests bound to a decode instance that have
not joined its batch yet (Types 2 and 3), in flat arrays aggregated with one bincount.
"""

from __future__ import annotations

import numpy as np

from baton.core.view import ClusterView
from baton.predict.survival import SurvivalTable

# Horizons (s) at which Type-1 load is precomputed: a uniform grid, so that finding a
# horizon's cell is one multiply. Longer horizons use the last point.
HORIZON_STEP_S = 0.1
HORIZONS_S = np.arange(0.0, 12.0 + HORIZON_STEP_S / 2, HORIZON_STEP_S)


def observed_rates(view: ClusterView, instance_id: int) -> np.ndarray:
    """Each running request's observed decode rate on this instance (tokens/s) since it
    joined the batch; the instance's current rate for requests without a history yet."""
    inst = view.instance(instance_id)
    table, now = inst.decodes, view.now_s
    made = (table.col("generated") + inst.iterations_since_sync(now) - table.col("joined_generated"))
    elapsed = now - table.col("joined_us") * 1e-6
    ok = (elapsed > 1e-6) & (made > 0)
    fallback = view.instance_rate_tokens_per_s(instance_id)
    return np.where(ok, made / np.where(ok, elapsed, 1.0), fallback)


class ActiveCurves:
    """Type-1 load curves L_I(h) per instance id, with each request's contribution kept so
    that a completion is subtracted without recomputing the instance."""

    def __init__(self, size: int = 0) -> None:
        self.curves = np.zeros((size, HORIZONS_S.size))
        self.t0_s = np.full(size, -np.inf)
        self.rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def ensure(self, size: int) -> None:
        if size > self.t0_s.size:
            extra = size - self.t0_s.size
            self.curves = np.vstack([self.curves, np.zeros((extra, HORIZONS_S.size))])
            self.t0_s = np.concatenate([self.t0_s, np.full(extra, -np.inf)])

    def refresh(self, view: ClusterView, instance_id: int, survival: SurvivalTable,
                weighted: bool, token_level: bool = True) -> np.ndarray:
        """Recompute one instance's curve at ``view.now_s``; returns its running req ids.
        Requests preempted there and waiting to recompute count too (they will decode
        there again), growing at the instance's rate."""
        req_ids, ctx, gen = view.decode_snapshot(instance_id)
        rates = observed_rates(view, instance_id)
        waiting = view.waiting_decodes(instance_id)
        if waiting:
            req_ids = np.concatenate([req_ids, np.array(waiting, dtype=np.int64)])
            ctx = np.concatenate([ctx, [view.context_tokens(r) for r in waiting]])
            gen = np.concatenate([gen, [view.generated_tokens(r) for r in waiting]])
            rates = np.concatenate([rates, np.full(len(waiting), view.instance_rate_tokens_per_s(instance_id))])
        self.t0_s[instance_id] = view.now_s
        if req_ids.size == 0:
            self.curves[instance_id] = 0.0
            self.rows.pop(instance_id, None)
            return req_ids
        grown = rates[:, None] * HORIZONS_S[None, :]
        rows = ctx[:, None] + grown if token_level else np.ones_like(grown)
        if weighted:
            rows = rows * survival.conditional(gen[:, None], gen[:, None] + grown)
        self.curves[instance_id] = rows.sum(axis=0)
        self.rows[instance_id] = (req_ids, rows)
        return req_ids

    def forget(self, instance_id: int, req_id: int) -> None:
        """Take a finished request's contribution out of its instance's curve."""
        entry = self.rows.get(instance_id)
        if entry is None:
            return
        hit = np.flatnonzero(entry[0] == req_id)
        if hit.size:
            self.curves[instance_id] -= entry[1][hit[0]]
            entry[0][hit[0]] = -1  # counted once even if reported twice

    def evaluate(self, ids: np.ndarray, tau_s: float) -> np.ndarray:
        """Projected Type-1 load at time ``tau_s`` for each instance id in ``ids`` (every
        curve's t0 is at or before now, so the horizon is never negative)."""
        x = np.minimum((tau_s - self.t0_s[ids]) * (1.0 / HORIZON_STEP_S), HORIZONS_S.size - 1.000001)
        k = x.astype(np.int64)
        idx = ids * HORIZONS_S.size + k
        flat = self.curves.ravel()
        lo = flat.take(idx)
        return lo + (x - k) * (flat.take(idx + 1) - lo)

    def due(self, ids: np.ndarray, now_s: float, max_age_s: float, budget: int) -> list[int]:
        """Instances never computed, plus up to ``budget`` older than ``max_age_s``, oldest first."""
        age = now_s - self.t0_s[ids]
        never = np.isinf(age)
        stale = np.flatnonzero((age > max_age_s) & ~never) if budget else np.zeros(0, dtype=np.int64)
        if stale.size > budget > 0:
            stale = stale[np.argpartition(-age[stale], budget - 1)[:budget]]
        return [int(i) for i in ids[never]] + [int(i) for i in ids[stale]]


class PendingTable:
    """Requests bound to a decode instance but not yet in its batch."""

    def __init__(self, capacity: int = 256) -> None:
        self.instance = np.zeros(capacity, dtype=np.int64)
        self.start_s = np.zeros(capacity)
        self.prompt_tokens = np.zeros(capacity)
        self.start_s = np.full(capacity, np.inf)
        self.live = np.zeros(capacity, dtype=bool)
        self.slot: dict[int, int] = {}
        self._free = list(range(capacity - 1, -1, -1))

    def __len__(self) -> int:
        return len(self.slot)

    def _grow(self) -> None:
        n = self.live.size
        self.instance = np.concatenate([self.instance, np.zeros(n, dtype=np.int64)])
        self.start_s = np.concatenate([self.start_s, np.full(n, np.inf)])
        self.prompt_tokens = np.concatenate([self.prompt_tokens, np.zeros(n)])
        self.live = np.concatenate([self.live, np.zeros(n, dtype=bool)])
        self._free = list(range(2 * n - 1, n - 1, -1))

    def add(self, req_id: int, instance_id: int, start_s: float, prompt_tokens: int) -> None:
        """Bind ``req_id`` to ``instance_id``; its decode is expected to start at ``start_s``."""
        self.remove(req_id)
        if not self._free:
            self._grow()
        i = self._free.pop()
        self.instance[i], self.start_s[i], self.prompt_tokens[i] = instance_id, start_s, prompt_tokens
        self.live[i] = True
        self.slot[req_id] = i

    def set_start(self, req_id: int, start_s: float) -> None:
        i = self.slot.get(req_id)
        if i is not None:
            self.start_s[i] = start_s

    def remove(self, req_id: int) -> None:
        i = self.slot.pop(req_id, None)
        if i is not None:
            self.live[i] = False
            self.prompt_tokens[i], self.start_s[i] = 0.0, np.inf
            self._free.append(i)

    def loads(self, tau_s: float, v_sys: float, survival: SurvivalTable, weighted: bool,
              size: int, type2: bool = True, type3: bool = True) -> np.ndarray:
        """Per instance id: Type-2 expected load plus Type-3 interference at ``tau_s``.
        Free slots have no prompt and start at +inf, so they add nothing."""
        gap = (tau_s - self.start_s) * v_sys  # tokens decoded by τ (negative: starts later)
        pressure = self.prompt_tokens + gap
        pre = gap > 0
        l2 = pressure * survival.survival(np.maximum(gap, 0.0)) if weighted else pressure
        value = np.where(pre, l2 if type2 else 0.0, np.maximum(pressure, 0.0) if type3 else 0.0)
        return np.bincount(self.instance, weights=value, minlength=size)

    def counts(self, size: int) -> np.ndarray:
        """Pending requests per instance id."""
        return np.bincount(self.instance[self.live], minlength=size)
