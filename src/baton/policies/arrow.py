"""Arrow: stateless instances in elastic pools, SLO-aware dispatch and instance flips
(Wu et al., "Arrow: Adaptive Scheduling Mechanisms for Disaggregated LLM Inference
Architecture", sections 4-5, Algorithms 1-4).

Pools. Every instance can run both kinds of work; its *role* says which new work it takes
and the work it still holds says which pool it is in (Figure 5):

- P: role prefill, no decode work;      D->P: role prefill, decodes still on it;
- D: role decode, no queued prefills;   P->D: role decode, prefills still queued on it.

A move is a ``ChangeRole``: pool membership only, no restart and no drain barrier; work
already queued finishes where it is, and the engine serves running decodes first, then
prefill chunks (vLLM's chunked prefill), so a transitional instance starts its new work at
once. Instances leave a transitional pool by themselves when the old work is done.

Predictors (section 5.3). ``pt(L)``, a quadratic in the prompt length fitted at start-up
to the performance model's single-request prefill times (live, the gateway's preset may
be a ``baton profile`` CSV of the engine, so the same fit is a fit of the engine);
instances are homogeneous, so one fit serves all. On ``llama-3.1-8b@h100`` the quadratic
is within 13% of the model from 512 to 32K tokens (the paper's own predictor shape). Prefill queueing delay of an instance is
the sum of ``pt`` over the prompt tokens still queued there (Eq. 1-2 with no idle gap).
Decode load is *running tokens*: context of decodes running or arriving, arriving
including handoffs queued for the instance's free blocks (section 5.4: a decode request is
on its instance from dispatch, in its migration queue until its KV is pulled; without them
a full decode side looks no busier than its KV cache, and Algorithm 2 never flips). Max Running
Tokens is the smaller of the KV capacity and the largest decode batch (requests of
``profile_context_tokens`` each) whose iteration meets the TPOT SLO.

Dispatch. Algorithm 1 (prefill): least delay in P meeting the TTFT SLO, then in D->P, then
``try_move_decode_to_prefill`` (Algorithm 3) if the decode load is low, else the least
delay in P. Algorithm 2 (decode): the prefill instance itself if it is now in D or P->D
(no KV transfer); else least running tokens in D, then P->D, each accepted only under Max
Running Tokens and with a token interval within the TPOT SLO; then
``try_move_prefill_to_decode`` (Algorithm 4); else the less loaded of the two.
Algorithms 3-4 keep at least one instance on the side they take from
(|I_D| + |I_P->D| > 1 before the move, and the mirror) and look in the transitional pool
first (undoing a recent flip is cheapest). On equal load, Algorithm 4 returns an instance
Algorithm 3 lent to prefill before taking one that started as prefill (a tie-break the
paper does not give).

Cluster monitor (a tick every ``monitor_interval_s``): flips one prefill instance to
decode (Algorithm 4) when the decode side's mean token interval has been above the TPOT
SLO for ``monitor_window_s``, or when a prefill instance is idle while the decode load is
not low. The monitor never flips towards prefill: only Algorithm 1 does (the paper's
asymmetry, section 5.5).

Choices the paper leaves open (named deviations):
- "decode load is low" (Algorithm 1): the decode side's running tokens spread over the
  instances that would remain after the move at most ``decode_low_load`` (0.7) x Max
  Running Tokens each, AND its mean token interval at most ``decode_low_load`` x the TPOT
  SLO. Counting the remaining instances matters in bursts: judged on the current mean,
  three flips in 0.6 s left one decode instance of 4P4D on the Azure code trace, and its
  KV filled (455k of 457k tokens);
- "decode instances are busy" (monitor): the same test without a move being "not low";
- the SLOs come from the run (``--ttft-slo``/``--tpot-slo``) unless given as parameters;
- after a monitor flip the interval history restarts, so one window passes between two
  monitor flips (the paper gives no window or cooldown);
- mixed instances (not used by Arrow's clusters) count on both sides.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from baton.core.decisions import ArrivalPlan, ChangeRole, DecodeChoice, Decision
from baton.core.instance import Role
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.perf.model import BatchShape, PerfModel
from baton.policies.base import PolicyContext, Stage, params_for
from baton.policies.prefill_time import PrefillPredictor

PAPER_TTFT_SLO_S, PAPER_TPOT_SLO_S = 3.0, 0.1  # Table 1, Azure code


def max_running_tokens(perf: PerfModel, tpot_slo_s: float, context_tokens: int, kv_tokens: int) -> int:
    """The smaller of ``kv_tokens`` and the largest decode batch (requests of
    ``context_tokens`` each) whose iteration time meets ``tpot_slo_s``; tokens."""
    def fits(n: int) -> bool:
        return perf.iteration_time_s(BatchShape(n_decodes=n, decode_ctx_tokens=n * context_tokens)) <= tpot_slo_s
    if not fits(1):
        return min(kv_tokens, context_tokens)
    lo, hi = 1, 2
    while fits(hi) and hi * context_tokens < kv_tokens:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return min(kv_tokens, lo * context_tokens)


@dataclass(frozen=True, slots=True)
class ArrowParams:
    """Arrow's parameters (SLOs, flips, and the thresholds the paper leaves open)."""

    ttft_slo_s: float | None = setting(None, gt=0, unit="s",
                                       doc="TTFT SLO a prefill instance's predicted queueing delay plus the prompt's "
                                           "prefill time must meet (unset: the run's, else the paper's 3 s)")
    tpot_slo_s: float | None = setting(None, gt=0, unit="s",
                                       doc="TPOT SLO behind Max Running Tokens and the decode side's token-interval "
                                           "tests (unset: the run's, else the paper's 0.1 s)")
    flips: bool = setting(True, doc="move instances between prefill and decode (false: the starting roles stay, "
                                    "the paper's Minimal Load ablation)")
    decode_low_load: float = setting(0.7, gt=0, le=1,
                                     doc="the decode side counts as lightly loaded at most this share of Max "
                                         "Running Tokens (running tokens per instance) and of the TPOT SLO (mean "
                                         "token interval)")
    monitor_interval_s: float = setting(0.5, gt=0, unit="s", doc="how often the cluster monitor runs")
    monitor_window_s: float = setting(3.0, gt=0, unit="s",
                                      doc="how long the decode side's mean token interval must stay above the TPOT "
                                          "SLO before the monitor flips a prefill instance to decode")
    profile_context_tokens: int = setting(1024, ge=1, unit="tokens",
                                          doc="context of each request in the decode batch that Max Running Tokens "
                                              "is sized for")


class Arrow(Stage):
    """Arrow's dispatcher, instance scheduler and cluster monitor (see the module docstring)."""

    name = "arrow"
    needs_bookings = True
    Params = ArrowParams

    def __init__(self, context: PolicyContext, params: ArrowParams | None = None, **values: Any) -> None:
        super().__init__(context)
        p = self.params = params_for(Arrow, params, values)
        if p.monitor_window_s < p.monitor_interval_s:
            raise ValueError("need monitor_interval_s <= monitor_window_s")
        self.ttft_slo_s = p.ttft_slo_s or context.ttft_slo_s or PAPER_TTFT_SLO_S
        self.tpot_slo_s = p.tpot_slo_s or context.tpot_slo_s or PAPER_TPOT_SLO_S
        self.flips, self.decode_low_load = p.flips, p.decode_low_load
        self.tick_interval_s = p.monitor_interval_s if p.flips else None
        self.window_s = p.monitor_window_s
        self.predictor = PrefillPredictor(context.perf)
        self.mrt = max_running_tokens(context.perf, self.tpot_slo_s, p.profile_context_tokens,
                                      context.perf.kv_capacity_tokens)
        self.intervals: deque[tuple[float, float]] = deque()
        self.lent: set[int] = set()  # decode instances Algorithm 3 moved to prefill
        self._roles_src: tuple[list[int] | None, list[int] | None] = (None, None)
        self._ids = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self._mixed = (np.zeros(0, dtype=bool), np.zeros(0, dtype=bool))  # role takes both kinds

    # --- pools ---------------------------------------------------------------------------
    def pools(self, view: ClusterView) -> Pools:
        """Healthy instances by pool: P, DP (D->P), D, PD (P->D), read as columns."""
        pids, dids = view.prefill_ids, view.decode_ids
        if pids is not self._roles_src[0] or dids is not self._roles_src[1]:  # roles changed
            self._roles_src = (pids, dids)
            self._ids = (np.array(pids, dtype=np.int64), np.array(dids, dtype=np.int64))
            for ids in self._ids:  # read-only: the columns may keep their slots until roles change
                ids.flags.writeable = False
            self._mixed = (np.array([view.instance(i).role.decodes for i in pids], dtype=bool),
                           np.array([view.instance(i).role.prefills for i in dids], dtype=bool))
        pside, dside = self._ids
        dp = (view.decode_works(pside) > 0) & ~self._mixed[0] if pside.size else self._mixed[0]
        pd = (view.prefill_moments(dside)[0] > 0) & ~self._mixed[1] if dside.size else self._mixed[1]
        return Pools(pside, dside, {"P": (pside, ~dp), "DP": (pside, dp), "D": (dside, ~pd), "PD": (dside, pd)})

    def decode_load_low(self, view: ClusterView, pools: Pools, lend: int = 0) -> bool:
        """Whether the decode side (D and P->D) is lightly loaded: its running tokens,
        spread over its instances less ``lend`` (those about to leave it), at most
        ``decode_low_load`` x Max Running Tokens, and its mean token interval at most
        ``decode_low_load`` x the TPOT SLO."""
        side = np.concatenate([pools["D"], pools["PD"]])
        if len(side) <= lend:
            return False
        if not side.size:
            return True
        tokens = float(view.running_tokens_of(side).sum()) / (len(side) - lend)
        interval = float(np.mean(view.token_intervals(side)))
        return tokens <= self.decode_low_load * self.mrt and interval <= self.decode_low_load * self.tpot_slo_s

    # --- Algorithms 3 and 4 --------------------------------------------------------------
    def move_decode_to_prefill(self, view: ClusterView, pools: Pools) -> int | None:
        """Algorithm 3: the least-loaded decode-side instance (P->D first), if another stays."""
        if not self.flips or len(pools["D"]) + len(pools["PD"]) <= 1:
            return None
        side = pools["PD"] if pools["PD"].size else pools["D"]
        moved = self._lowest(side, view.running_tokens_of(side))
        self.lent.add(moved)
        return moved

    def move_prefill_to_decode(self, view: ClusterView, pools: Pools,
                               candidates: np.ndarray | None = None) -> int | None:
        """Algorithm 4: the prefill-side instance with the least queued work (D->P first;
        on a tie, one that was lent to prefill goes back first), among ``candidates`` if
        given."""
        if not self.flips or len(pools["P"]) + len(pools["DP"]) <= 1:
            return None
        pick = next(c for c in (candidates, pools["DP"], pools["P"]) if c is not None and c.size)
        moved = self._lowest(pick, self.predictor.delays(view, pick))
        self.lent.discard(moved)
        return moved

    def _lowest(self, ids: np.ndarray, keys) -> int:
        """The id with the smallest key; on a tie one that was lent first, then the lowest id."""
        tied = ids[keys == keys.min()].tolist()
        return min(tied, key=lambda i: (i not in self.lent, i))

    # --- Algorithm 1 ---------------------------------------------------------------------
    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        pools = self.pools(view)
        pt = self.predictor.pt(request.request.prompt_tokens)
        ttft_slo_s = request.request.ttft_slo_s or self.ttft_slo_s  # its own, else the run's
        best: dict[str, int | None] = {}
        delays = self.predictor.delays(view, pools.prefill_side)  # the whole side: its slots are kept
        for k in ("P", "DP"):
            delay, best[k] = _least(pools[k], pools.of(k, delays))
            if delay is not None and delay + pt <= ttft_slo_s:
                return _prefill_on(plan, best[k])
        if self.decode_load_low(view, pools, lend=1):
            moved = self.move_decode_to_prefill(view, pools)
            if moved is not None:
                return _prefill_on(plan, moved, ChangeRole(moved, Role.PREFILL))
        fallback = best["P"] if best["P"] is not None else best["DP"]
        if fallback is None:  # no prefill-side instance at all: any instance can prefill
            fallback = min(view.decode_ids, key=lambda i: (self.predictor.delay(view, i), i), default=None)
        return plan if fallback is None else _prefill_on(plan, fallback)

    # --- Algorithm 2 ---------------------------------------------------------------------
    def choose_decode(self, view: ClusterView, request: RequestState) -> int | DecodeChoice | None:
        src = request.prefill_instance
        if src is not None and view.instance(src).role.decodes and view.instance(src).healthy:
            return src  # the prompt's KV is already here: no transfer
        pools = self.pools(view)
        best: list[tuple[float, int]] = []
        running = view.running_tokens_of(pools.decode_side)
        tpot_slo_s = request.request.tpot_slo_s or self.tpot_slo_s  # its own, else the run's
        for k in ("D", "PD"):
            if pools[k].size:
                tokens, i = _least(pools[k], pools.of(k, running))
                if tokens <= self.mrt and view.token_interval_s(i) <= tpot_slo_s:
                    return i
                best.append((tokens, i))
        moved = self.move_prefill_to_decode(view, pools)
        if moved is not None:
            return DecodeChoice(moved, (ChangeRole(moved, Role.DECODE),))
        return min(best)[1] if best else None

    # --- cluster monitor -----------------------------------------------------------------
    def tick(self, view: ClusterView) -> list[Decision]:
        pools = self.pools(view)
        if self._decode_slow(view, pools):
            moved = self.move_prefill_to_decode(view, pools)
        elif not self.decode_load_low(view, pools):  # decode busy: lend it an idle prefill instance
            idle = pools["P"][view.prefill_moments(pools["P"])[0] == 0] if pools["P"].size else pools["P"]
            moved = self.move_prefill_to_decode(view, pools, idle) if idle.size else None
        else:
            moved = None
        if moved is None:
            return []
        self.intervals.clear()
        return [ChangeRole(moved, Role.DECODE)]

    def _decode_slow(self, view: ClusterView, pools: Pools) -> bool:
        """Whether the decode side's mean token interval stayed above the TPOT SLO for a
        whole window (samples from instances that are decoding)."""
        both = np.concatenate([pools["D"], pools["PD"]])
        side = both[view.decode_works(both) > 0] if both.size else both
        now = view.now_s
        if side.size:
            self.intervals.append((now, float(np.mean(view.token_intervals(side)))))
        while self.intervals and self.intervals[0][0] < now - self.window_s - 1e-9:
            self.intervals.popleft()
        full = bool(self.intervals) and self.intervals[0][0] <= now - self.window_s + 1e-9
        return full and all(v > self.tpot_slo_s for _, v in self.intervals)


@dataclass(slots=True)
class Pools:
    """Arrow's four pools as masks over the two sides' id arrays (read-only, in id
    order): reads of a whole side keep their slots, and a pool is a mask of them."""

    prefill_side: np.ndarray
    decode_side: np.ndarray
    masks: dict[str, tuple[np.ndarray, np.ndarray]]  # pool -> (its side, mask over it)

    def __getitem__(self, pool: str) -> np.ndarray:
        # built per access on purpose: caching them read-only made decisions slower (each
        # new read-only array takes a place in the load columns' slot cache)
        side, mask = self.masks[pool]
        return side[mask]

    def of(self, pool: str, side_values: np.ndarray) -> np.ndarray:
        """The values of a pool's members, from values read over its whole side."""
        return side_values[self.masks[pool][1]]


def _least(ids: np.ndarray, keys) -> tuple[float | None, int | None]:
    """(the smallest key, the lowest id having it): ``min`` over (key, id) pairs, read
    from a column of keys aligned with ``ids`` (in id order: the first has the lowest)."""
    if not ids.size:
        return None, None
    j = int(np.argmin(keys))
    return keys[j].item(), int(ids[j])


def _prefill_on(plan: ArrivalPlan, instance: int, *changes: ChangeRole) -> ArrivalPlan:
    return replace(plan, prefill_instance=instance, role_changes=plan.role_changes + changes)


STAGES = {"arrow": Arrow}
