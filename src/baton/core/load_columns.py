"""Every instance's load terms as columns, so that a policy reads the load of a thousand
instances in a few vectorised operations instead of a Python call chain per instance.

Instances mark themselves dirty when a load term changes (``InstanceState.touch``); the
columns copy only the dirty rows before a read. Reads are exactly the scalar ones: the
closed-form iteration count below is ``Segment.iterations_done`` done on arrays with the
same floating-point operations in the same order, so a vectorised argmin picks the
instance the per-instance loop would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from baton.core.instance import InstanceState

_SCALAR_BELOW = 24  # rows to compute at most, where per-instance reads beat vectorised ones
_PRUNE_ABOVE = 128  # candidates above which a least-load read prunes by lower bounds first
_SLICE_FROM = 256  # below it a gather costs fewer numpy calls than a slice and a copy
_INT_COLUMNS = ("base", "ctx", "n", "prefill", "reqs", "seg_max", "queued", "sq", "incoming_n", "incoming",
                "tabled", "floor")
_FLOAT_COLUMNS = ("seg_start", "iter0", "slope", "s_interval", "s_kv")


class LoadColumns:
    """Struct-of-arrays copy of the load terms of the instances of one mapping.

    Per slot: ``base`` (decode contexts at the last sync + incoming + queued prefill
    tokens), ``ctx`` (decode contexts at the last sync), ``n`` (running decodes),
    ``prefill`` (queued prefill tokens), ``queued`` and ``sq`` (queued prompts and the sum
    of their squares), ``incoming_n`` and ``incoming`` (KV on its way: requests, tokens),
    ``reqs`` (outstanding requests), the last scrape's token interval and KV usage
    (``s_interval`` s, ``s_kv``; 0 before the first) and the running decode segment
    (``seg_start``, ``iter0``, ``slope`` in s; ``seg_max`` iterations, 0 without one;
    ``tabled`` 1 where its iteration times are listed, not affine: read per instance), and
    ``floor``, a lower bound of the token load from ``_k_now_s`` on: ``base`` plus the
    running decodes times the iterations known done (kept with the counts, so that a
    least-load read over a thousand instances is a view, not a computation).
    """

    def __init__(self, instances: Mapping[int, InstanceState]) -> None:
        self._instances = instances
        self.dirty: set[int] = set()
        self._slot: dict[int, int] = {}
        self._at_slot: list[InstanceState] = []
        self._cols: dict[str, np.ndarray] = {}
        for name in _INT_COLUMNS:
            self._cols[name] = np.zeros(16, dtype=np.int64)
        for name in _FLOAT_COLUMNS:
            self._cols[name] = np.zeros(16, dtype=np.float64)
        self._slots_cache: dict[int, tuple[Sequence[int], np.ndarray]] = {}
        self._runs: dict[int, tuple[np.ndarray, slice]] = {}  # id(cached slots) -> them as a slice
        self._slot_of = np.full(16, -1, dtype=np.int64)  # instance id -> slot (-1: none yet)
        # iterations done by each slot at _k_now_s, valid where _k_valid: a decision reads
        # several columns at one instant, and the closed form is the costly part
        self._k_now_s = float("nan")
        self._k_all = np.zeros(16, dtype=np.int64)
        self._k_valid = np.zeros(16, dtype=bool)
        self._k_next_dt = np.zeros(16, dtype=np.float64)

    # --- slots --------------------------------------------------------------------------
    def _register(self, inst: InstanceState) -> int:
        slot = self._slot.get(inst.instance_id)
        if slot is None:
            slot = self._slot[inst.instance_id] = len(self._slot)
            self._at_slot.append(inst)
            if slot == self._cols["base"].size:
                self._cols = {k: np.concatenate([v, np.zeros_like(v)]) for k, v in self._cols.items()}
                self._k_all = np.concatenate([self._k_all, np.zeros_like(self._k_all)])
                self._k_valid = np.zeros(self._k_all.size, dtype=bool)
                self._k_next_dt = np.zeros(self._k_all.size, dtype=np.float64)
                self._cols["floor"][:] = self._cols["base"]  # no count is known any more
        self._at_slot[slot] = inst
        inst.load_dirty = self.dirty
        self.dirty.add(inst.instance_id)
        return slot

    def slots(self, ids: Sequence[int]) -> np.ndarray:
        """The slots of ``ids`` (instances new to the columns are registered). Instance
        objects replaced under an id are seen after ``revalidate`` (the view calls it
        whenever roles, health or membership change)."""
        hit = self._slots_cache.get(id(ids))
        if hit is not None and hit[0] is ids:
            return hit[1]
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and int(arr.max()) >= self._slot_of.size:
            grown = np.full(max(int(arr.max()) + 1, 2 * self._slot_of.size), -1, dtype=np.int64)
            grown[: self._slot_of.size] = self._slot_of
            self._slot_of = grown
        slots = self._slot_of[arr]
        if arr.size and slots.min() < 0:
            for i in arr[slots < 0].tolist():
                self._slot_of[i] = self._register(self._instances[i])
            slots = self._slot_of[arr]
        # the view's candidate lists live until roles change, as do id arrays a policy
        # owns and made read-only (a view of another array's data might change under it)
        if isinstance(ids, list) or (isinstance(ids, np.ndarray) and not ids.flags.writeable and ids.base is None):
            if len(self._slots_cache) >= 8:
                self._slots_cache.clear()
                self._runs.clear()
            self._slots_cache[id(ids)] = (ids, slots)
            if slots.size >= _SLICE_FROM and int(slots[-1]) - int(slots[0]) == slots.size - 1 \
                    and (np.diff(slots) == 1).all():
                self._runs[id(slots)] = (slots, slice(int(slots[0]), int(slots[-1]) + 1))
        return slots

    def _rows(self, slots: np.ndarray) -> np.ndarray | slice:
        """``slots`` as a slice where they are a cached run of at least ``_SLICE_FROM``
        consecutive slots (a view's candidate list usually is): a column read through it is
        a view, not a gather. Only for reads whose results are not handed out as they are."""
        hit = self._runs.get(id(slots)) if self._runs else None
        return hit[1] if hit is not None and hit[0] is slots else slots

    def revalidate(self) -> None:
        """Re-register instances replaced under their id, and forget cached id lists."""
        self._slots_cache.clear()
        self._runs.clear()
        for iid, inst in self._instances.items():
            if inst.load_dirty is not self.dirty:
                self._slot_of[iid] = self._register(inst) if iid < self._slot_of.size else -1

    def _refresh(self) -> None:
        if not self.dirty:
            return
        c, insts = self._cols, self._instances
        for iid in self.dirty:
            inst = insts.get(iid)
            if inst is None or inst.load_dirty is not self.dirty:
                continue  # gone, or replaced by a new object (registered on its next read)
            s = self._slot[iid]
            self._k_valid[s] = False
            table, seg = inst.decodes, inst.segment
            c["ctx"][s], c["n"][s] = table.ctx_sum, table.n
            c["prefill"][s] = inst.prefill_queue_tokens
            c["base"][s] = c["floor"][s] = table.ctx_sum + inst.incoming_tokens + inst.prefill_queue_tokens
            c["reqs"][s] = len(inst.prefill_queue) + len(inst.incoming) + table.n
            c["queued"][s], c["sq"][s] = len(inst.prefill_queue), inst.prefill_queue_sq_tokens
            c["incoming_n"][s], c["incoming"][s] = len(inst.incoming), inst.incoming_tokens
            sample = inst.sample
            c["s_interval"][s] = sample.token_interval_s if sample is not None else 0.0
            c["s_kv"][s] = sample.kv_usage if sample is not None else 0.0
            if seg is None:
                c["seg_max"][s] = 0
            else:
                c["seg_start"][s], c["iter0"][s], c["slope"][s] = seg.start_s, seg.iter0_s, seg.slope_s
                c["seg_max"][s], c["tabled"][s] = seg.max_iters, bool(seg.ends_s)
        self.dirty.clear()

    # --- reads --------------------------------------------------------------------------
    def iterations_done(self, slots: np.ndarray, now_s: float) -> np.ndarray:
        """Decode iterations each instance finished since its table was written.

        A slot's count stays valid until its segment reaches the end of its next
        iteration (``_k_next_dt``), so a read recomputes only the instances that crossed
        an iteration boundary or changed since the last read: a handful, not the cluster.
        """
        self._refresh()
        c = self._cols
        if now_s < self._k_now_s:
            self._k_valid[:] = False  # time went back (a live clock): nothing is known
            c["floor"][:] = c["base"]
        self._k_now_s = now_s
        stale = ~self._k_valid[slots] | (now_s - c["seg_start"][slots] >= self._k_next_dt[slots])
        todo = slots[stale]
        if 0 < todo.size <= _SCALAR_BELOW:  # numpy's per-call overhead dominates: the scalar reads
            self._scalar_iterations(todo, now_s)
        elif todo.size:
            kmax = c["seg_max"][todo]
            k = np.zeros(todo.size, dtype=np.int64)
            next_dt = np.full(todo.size, np.inf)
            live = np.flatnonzero(kmax > 0)
            if live.size:
                s = todo[live]
                iter0, slope = c["iter0"][s], c["slope"][s]
                k[live] = kl = _iterations(now_s - c["seg_start"][s], iter0, slope, kmax[live])
                next_dt[live] = np.where(kl < kmax[live], _elapsed(kl + 1, iter0, slope), np.inf)
            self._k_all[todo] = k
            c["floor"][todo] = c["base"][todo] + c["n"][todo] * k
            self._k_next_dt[todo] = next_dt
            self._k_valid[todo] = True
            tabled = todo[c["tabled"][todo] > 0]
            if tabled.size:  # listed iteration times: the affine read above does not apply
                self._scalar_iterations(tabled, now_s)
        return self._k_all[slots]

    def _scalar_iterations(self, slots: np.ndarray, now_s: float) -> None:
        at, c = self._at_slot, self._cols
        base, n, floor = c["base"], c["n"], c["floor"]
        for slot in slots.tolist():
            seg = at[slot].segment
            k = seg.iterations_done(now_s) if seg is not None else 0
            self._k_all[slot] = k
            floor[slot] = base[slot] + n[slot] * k
            self._k_next_dt[slot] = seg.elapsed_s(k + 1) if seg is not None and k < seg.max_iters else np.inf
        self._k_valid[slots] = True

    def token_loads(self, slots: np.ndarray, now_s: float) -> np.ndarray:
        """``InstanceState.token_load`` of each slot at ``now_s`` (tokens)."""
        n, k = self._decode_iterations(slots, now_s)
        base = self._cols["base"][slots]
        return base + n * k if k is not None else base

    def prefill_loads(self, slots: np.ndarray, now_s: float) -> np.ndarray:
        """``InstanceState.prefill_load`` of each slot at ``now_s``: queued prefill tokens,
        decode context (tokens) x 1e-9 as a tie-break. Without any decode context (prefill
        instances, idle ones) the tie-break adds 0 and is skipped."""
        rows = self._rows(slots)
        n, k = self._decode_iterations(slots, now_s, rows)
        prefill, ctx = self._cols["prefill"][rows], self._cols["ctx"][rows]
        if k is not None:
            ctx = ctx + n * k
        return prefill + ctx * 1e-9 if ctx.any() else prefill.astype(np.float64)

    def decode_ctx_tokens(self, slots: np.ndarray, now_s: float) -> np.ndarray:
        """``InstanceState.decode_ctx_tokens`` of each slot at ``now_s`` (tokens)."""
        n, k = self._decode_iterations(slots, now_s)
        ctx = self._cols["ctx"][slots]
        return ctx + n * k if k is not None else ctx

    def least_token_load(self, slots: np.ndarray, now_s: float) -> int:
        """The position in ``slots`` of the least token load at ``now_s`` (the first of
        equals, as ``argmin`` of ``token_loads``). A slot's load only grows while its
        segment runs, so the count last computed for it bounds its load from below; the
        closed form runs only for slots whose bound does not already rule them out (above
        ``_PRUNE_ABOVE`` slots: below, one vectorised pass costs fewer numpy calls)."""
        if slots.size <= _PRUNE_ABOVE:
            return int(np.argmin(self.token_loads(slots, now_s)))
        floor = self.token_load_floors(slots, now_s)
        j = int(floor.argmin())
        best = self._at_slot[int(slots[j])].token_load(now_s)
        near = np.flatnonzero(floor <= best)
        if near.size > _SCALAR_BELOW:
            return int(near[int(np.argmin(self.token_loads(slots[near], now_s)))])
        loads = self._scalar_loads(slots[near], now_s)
        return int(near[loads.index(min(loads))])

    def token_loads_at_least(self, slots: np.ndarray, now_s: float, tokens: int) -> bool:
        """Whether every slot's token load at ``now_s`` is at least ``tokens``; exact
        loads only where the lower bounds leave it open."""
        floor = self.token_load_floors(slots, now_s)
        below = floor < tokens
        if not below.any():
            return True
        j = int(floor.argmin())  # the likeliest to be below: one scalar read may settle it
        if self._at_slot[int(slots[j])].token_load(now_s) < tokens:
            return False
        below[j] = False  # read once
        low = slots[below]
        if low.size > _SCALAR_BELOW:
            return bool(self.token_loads(low, now_s).min() >= tokens)
        return min(self._scalar_loads(low, now_s), default=tokens) >= tokens

    def _scalar_loads(self, slots: np.ndarray, now_s: float) -> list[int]:
        """The instances' own ``token_load`` reads (a few slots: cheaper than the vectorised
        closed form's fixed numpy calls; the same values)."""
        at = self._at_slot
        return [at[s].token_load(now_s) for s in slots.tolist()]

    def token_load_floors(self, slots: np.ndarray, now_s: float) -> np.ndarray:
        """Lower bounds of the slots' token loads at ``now_s`` (exact where the count is
        current): the iterations known done, 0 where none is known. Read only: a view of
        the column where the slots are a cached run."""
        self._refresh()
        if not now_s >= self._k_now_s:  # before the counts (or none yet): base alone
            return self._cols["base"][slots]
        return self._cols["floor"][self._rows(slots)]

    def _decode_iterations(self, slots: np.ndarray, now_s: float,
                           rows: np.ndarray | slice | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(running decodes, ``iterations_done``) of each slot, the count left 0 where a
        slot runs no decodes: the loads multiply it by n, so instances without decodes
        (prefill instances in PD) cost no closed form. None for the counts when no slot
        decodes (n x k would add 0 everywhere). ``rows``: the slots as ``_rows`` gives them,
        for a caller that copies what it returns."""
        self._refresh()
        n = self._cols["n"][slots if rows is None else rows]
        busy = n > 0
        if not busy.any():  # no decodes anywhere (prefill instances, idle ones)
            return n, None
        if busy.all():
            return n, self.iterations_done(slots, now_s)
        k = np.zeros(slots.size, dtype=np.int64)
        k[busy] = self.iterations_done(slots[busy], now_s)
        return n, k

    def column_min(self, name: str, slots: np.ndarray) -> int | float:
        """The least value of a time-independent column at the slots (no copy)."""
        self._refresh()
        return self._cols[name][self._rows(slots)].min().item()

    def column(self, name: str, slots: np.ndarray) -> np.ndarray:
        """A time-independent column (``prefill``, ``reqs``, ``n``, ``queued``, ...) at the
        slots (a copy: callers may write to it)."""
        self._refresh()
        rows = self._rows(slots)
        return self._cols[name][slots] if rows is slots else self._cols[name][rows].copy()


def _iterations(dt: np.ndarray, iter0: np.ndarray, slope: np.ndarray, kmax: np.ndarray) -> np.ndarray:
    """``Segment.iterations_done`` on arrays (same operations, same order)."""
    k = np.zeros(dt.size, dtype=np.float64)
    a, b = slope / 2.0, iter0 - slope / 2.0
    quad = (a > 1e-300) & (dt > 0.0)
    lin = ~(a > 1e-300) & (dt > 0.0)
    if quad.any():
        aq, bq = a[quad], b[quad]
        k[quad] = (-bq + np.sqrt(bq * bq + 4.0 * aq * dt[quad])) / (2.0 * aq)
    if lin.any():
        k[lin] = dt[lin] / iter0[lin]
    k = np.minimum(np.maximum(np.trunc(k), 0.0), kmax).astype(np.int64)
    while True:
        over = (k > 0) & (_elapsed(k, iter0, slope) > dt)
        if not over.any():
            break
        k -= over
    while True:
        under = (k < kmax) & (_elapsed(k + 1, iter0, slope) <= dt)
        if not under.any():
            break
        k += under
    return k


def _elapsed(k: np.ndarray, iter0: np.ndarray, slope: np.ndarray) -> np.ndarray:
    kf = k.astype(np.float64)
    return kf * iter0 + slope * kf * (kf - 1.0) / 2.0
