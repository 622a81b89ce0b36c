"""The combined scheduler's role controller: flip an instance between prefill and decode
when the demand ratio has shifted for longer than the flip costs (Arrow's elastic pools,
driven by the balance of pressures instead of a single arrival or a slow window).

Pressures, read at every check, each 1.0 at its SLO:

- prefill: the prefill work waiting per prefill instance (predicted queueing delay, Arrow's
  quadratic), counting prompts deflected onto decode instances and still queued there,
  over the TTFT SLO. Deflection absorbs a burst; absorbing a sustained shift, it would hide
  the demand from the controller;
- decode: the larger of the decoding instances' mean reported token interval over the
  TPOT SLO (deflected chunks included: the compute deflection uses is not spare) and their
  mean running tokens over Max Running Tokens (Arrow's MRT: the KV and batch a TPOT-safe
  instance holds).

A flip is wanted towards the hotter side when that side stays the hotter one after it, the
pressures scaled by the instance counts the flip leaves (prefill x P / (P + k) and decode
x D / (D - k) for k decode instances turned to prefill, and the mirror): a flip that would
overshoot invites the flip back. One decision moves the largest such k, at most ``max(1,
share x (P + D))`` (P and D count the instances with one role each; ``share`` 0.125: one
at 4P4D, eight at 32P32D), so the pressure gap sets how many move and the cluster's size
how fast a large shift is absorbed. A controller that moved one instance per window
whatever the cluster's size (an earlier version) lost to Arrow on the reasoning workload
at 64 instances (95.9 against 121.7 req/s, `benchmarks/combined.py --scales 64 --workloads
reasoning`): turning 32P32D into the split that workload wants took minutes of simulated
time. The hotter pressure must also be at least ``min_pressure`` (0.25): below it nothing
misses its SLO whichever side has the instance. It must be wanted without a break for
``window_s`` plus the flip's own cost (a prefill instance turning to decode first drains
its queue: its predicted delay); after a decision the clock restarts, also when only some
of the k candidates had drained (the rest wait for the next window, judged on the
pressures the first flips leave). Neither side is left without an instance. A controller
that flipped on "prefill hot, decode cool" alone (an earlier version) ratcheted 4P4D to
7P1D under the Mooncake trace's long prompts, whose prefill demand never cools, and
sustained 1.60 req/s where flips off gave 2.81: the decode side's KV then bound, which
those tests did not weigh.

A prefill instance's flip cost also counts its prefix cache: the prefill seconds its
cache hits saved over the last window (``CacheSavings``), which the prompts it would have
served will cost elsewhere until another cache holds their prefixes. Candidates are taken
cheapest first, and a costly one waits until the shift has held that much longer (or its
savings have left the window). Without it the sessions workload's growing decode KV (half
of MRT, nothing near its TPOT) flipped cache-holding prefill instances to decode, and the
prompts of their prefixes then queued cold on the rest: over twelve seeds on 4P4D combined
sustained 29.9 req/s, and 35.4 with flips off (``benchmarks/combined.py --scales 8
--repeats 12 --workloads sessions mooncake``, its sessions table, commit 7a468a9).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from baton.core.decisions import ChangeRole
from baton.core.instance import Role
from baton.core.view import ClusterView
from baton.perf.model import PerfModel
from baton.policies.prefill_time import PrefillPredictor


class FlipController:
    """Decides the role changes of one decision (see the module docstring)."""

    def __init__(self, predictor: PrefillPredictor, perf: PerfModel, ttft_slo_s: float, tpot_slo_s: float,
                 max_running_tokens: int, window_s: float = 5.0, min_pressure: float = 0.25,
                 share: float = 0.125, savings: CacheSavings | None = None) -> None:
        if min_pressure < 0 or window_s < 0:
            raise ValueError("need flip_min_pressure >= 0 and flip_window_s >= 0")
        if not 0 < share <= 1:
            raise ValueError(f"flip_share: expected a share of the instances in (0, 1], got {share!r}")
        self.predictor, self.perf = predictor, perf
        self.ttft_slo_s, self.tpot_slo_s, self.mrt = ttft_slo_s, tpot_slo_s, max_running_tokens
        self.window_s, self.min_pressure, self.share = window_s, min_pressure, share
        self.savings = savings
        self.since: dict[Role, float] = {}  # direction -> when its condition began to hold

    # --- signals -------------------------------------------------------------------------
    def pressures(self, view: ClusterView, prefill: list[int], decode: list[int]) -> tuple[float, float]:
        """(prefill pressure, decode pressure), each 1.0 at its SLO (see the module docstring)."""
        delays = self.predictor.delays(view, prefill)
        deflected = float(self.predictor.delays(view, decode).sum())
        p = (float(delays.sum()) + deflected) / len(prefill) / self.ttft_slo_s
        tokens = view.running_tokens_of(decode)
        busy = [i for i, w in zip(decode, view.decode_works(decode).tolist()) if w]
        interval = float(np.mean(view.token_intervals(busy))) if busy else 0.0
        return p, max(interval / self.tpot_slo_s, float(np.mean(tokens)) / self.mrt)

    def wanted_flips(self, view: ClusterView, prefill: list[int], decode: list[int]) -> tuple[Role | None, int]:
        """(the role instances should move to now, how many), or (None, 0)."""
        if not prefill or not decode:
            return None, 0
        p, d = self.pressures(view, prefill, decode)
        if max(p, d) < self.min_pressure:
            return None, 0
        P, D = len(prefill), len(decode)
        budget = max(1, math.floor(self.share * (P + D) + 1e-9))  # 0.29 x 100 is 28.999...
        if p > d:
            return _flips(Role.PREFILL, p, P, d, D, budget)
        if d > p:
            return _flips(Role.DECODE, d, D, p, P, budget)
        return None, 0

    def wanted(self, view: ClusterView, prefill: list[int], decode: list[int]) -> Role | None:
        """The role an instance should move to now, if the demand ratio says so."""
        return self.wanted_flips(view, prefill, decode)[0]

    # --- the decision ----------------------------------------------------------------------
    def decide(self, view: ClusterView, blocked: frozenset[int]) -> list[ChangeRole]:
        """The role changes whose condition has held long enough (maybe none). ``blocked``:
        instances the conflict rules keep where they are."""
        prefill = [i for i in view.prefill_ids if not view.instance(i).role.decodes]
        decode = [i for i in view.decode_ids if not view.instance(i).role.prefills]
        want, count = self.wanted_flips(view, prefill, decode)
        now = view.now_s
        for role in list(self.since):
            if role is not want:
                del self.since[role]
        if want is None:
            return []
        held_s = now - self.since.setdefault(want, now)
        ready = [i for i, cost_s in self.candidates(view, want, prefill, decode, blocked)
                 if held_s >= self.window_s + cost_s][:count]
        if ready:
            self.since.clear()
        return [ChangeRole(i, want) for i in ready]

    def candidates(self, view: ClusterView, want: Role, prefill: list[int], decode: list[int],
                   blocked: frozenset[int]) -> list[tuple[int, float]]:
        """(instance, its flip cost s), best first: towards prefill the decode instances
        with the fewest running tokens and no deflected prefills (no cost); towards decode
        the prefill instances that cost least to give up: draining their queue, plus the
        prefill seconds their prefix cache was expected to save over the last window
        (``CacheSavings``: what the prompts it would have served will cost elsewhere until
        another cache holds their prefixes)."""
        if want is Role.PREFILL:
            free = [i for i in decode if i not in blocked and not view.instance(i).prefill_queue]
            return [(i, 0.0) for i in sorted(free, key=lambda i: (view.running_tokens(i), i))]
        saved = self.savings.saved_s if self.savings is not None else (lambda i, now_s: 0.0)
        return sorted(((i, self.predictor.delay(view, i) + saved(i, view.now_s)) for i in prefill if i not in blocked),
                      key=lambda pair: (pair[1], pair[0]))


class CacheSavings:
    """The prefill seconds each instance's prefix cache was expected to save, at
    placement, over the last ``window_s``: per placement with a cached prefix, the
    predicted prefill time of the whole prompt less that of its uncached tokens (a prompt
    re-planned elsewhere afterwards, or a hit the engine did not find, still counts: the
    router's view of the cache's worth, not the engine's)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.entries: dict[int, deque[tuple[float, float]]] = {}  # instance -> (time s, saved s)
        self.totals: dict[int, float] = {}

    def record(self, instance_id: int, now_s: float, saved_s: float) -> None:
        """A placement at ``now_s`` whose cache hit saves ``saved_s`` of prefill."""
        if saved_s > 0:
            self.saved_s(instance_id, now_s)  # entries out of the window go first: memory stays one window's
            self.entries.setdefault(instance_id, deque()).append((now_s, saved_s))
            self.totals[instance_id] = self.totals.get(instance_id, 0.0) + saved_s

    def saved_s(self, instance_id: int, now_s: float) -> float:
        """The seconds saved on the instance within the window ending at ``now_s``."""
        entries = self.entries.get(instance_id)
        if not entries:
            return 0.0
        while entries and entries[0][0] < now_s - self.window_s:
            self.totals[instance_id] -= entries.popleft()[1]
        if not entries:
            del self.entries[instance_id], self.totals[instance_id]
            return 0.0
        return self.totals[instance_id]


def _flips(towards: Role, hot: float, n_hot: int, cold: float, n_cold: int, budget: int) -> tuple[Role | None, int]:
    """(towards, the most instances, up to ``budget``, that can move from the cold side to
    the hot one with the hot side still the hotter and the cold side keeping one)."""
    k = 0
    while k < budget and n_cold - k > 1 and hot * n_hot / (n_hot + k + 1) >= cold * n_cold / (n_cold - k - 1):
        k += 1
    return (towards, k) if k else (None, 0)
