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

A flip is wanted towards the hotter side when that side stays the hotter one after it,
the pressures scaled by the instance counts the flip leaves (prefill x P / (P + 1) and
decode x D / (D - 1) for a decode instance turned to prefill, and the mirror): a flip that
would overshoot invites the flip back. The hotter pressure must also be at least
``min_pressure`` (0.25): below it nothing misses its SLO whichever side has the instance. It must be wanted
without a break for ``window_s`` plus the flip's own cost (a prefill instance turning to
decode first drains its queue: its predicted delay); after a flip the clock restarts.
Neither side is left without an instance. A controller that flipped on "prefill hot,
decode cool" alone (an earlier version) ratcheted 4P4D to 7P1D under the Mooncake trace's
long prompts, whose prefill demand never cools, and sustained 1.60 req/s where flips off
gave 2.81: the decode side's KV then bound, which those tests did not weigh.
"""

from __future__ import annotations

import math

import numpy as np

from baton.core.decisions import ChangeRole
from baton.core.instance import Role
from baton.core.view import ClusterView
from baton.perf.model import PerfModel
from baton.policies.prefill_time import PrefillPredictor


class FlipController:
    """Decides at most one role change per call (see the module docstring)."""

    def __init__(self, predictor: PrefillPredictor, perf: PerfModel, ttft_slo_s: float, tpot_slo_s: float,
                 max_running_tokens: int, window_s: float = 5.0, min_pressure: float = 0.25) -> None:
        if min_pressure < 0 or window_s < 0:
            raise ValueError("need flip_min_pressure >= 0 and flip_window_s >= 0")
        self.predictor, self.perf = predictor, perf
        self.ttft_slo_s, self.tpot_slo_s, self.mrt = ttft_slo_s, tpot_slo_s, max_running_tokens
        self.window_s, self.min_pressure = window_s, min_pressure
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

    def wanted(self, view: ClusterView, prefill: list[int], decode: list[int]) -> Role | None:
        """The role an instance should move to now, if the demand ratio says so."""
        if not prefill or not decode:
            return None
        p, d = self.pressures(view, prefill, decode)
        if max(p, d) < self.min_pressure:
            return None
        P, D = len(prefill), len(decode)
        if p > d and D > 1 and p * P / (P + 1) >= d * D / (D - 1):
            return Role.PREFILL
        if d > p and P > 1 and d * D / (D + 1) >= p * P / (P - 1):
            return Role.DECODE
        return None

    # --- the decision ----------------------------------------------------------------------
    def decide(self, view: ClusterView, blocked: frozenset[int]) -> ChangeRole | None:
        """A role change whose condition has held long enough, or None. ``blocked``:
        instances the conflict rules keep where they are."""
        prefill = [i for i in view.prefill_ids if not view.instance(i).role.decodes]
        decode = [i for i in view.decode_ids if not view.instance(i).role.prefills]
        want = self.wanted(view, prefill, decode)
        now = view.now_s
        for role in list(self.since):
            if role is not want:
                del self.since[role]
        if want is None:
            return None
        start = self.since.setdefault(want, now)
        candidate, cost_s = self.candidate(view, want, prefill, decode, blocked)
        if candidate is None or now - start < self.window_s + cost_s:
            return None
        self.since.clear()
        return ChangeRole(candidate, want)

    def candidate(self, view: ClusterView, want: Role, prefill: list[int], decode: list[int],
                  blocked: frozenset[int]) -> tuple[int | None, float]:
        """(the instance to flip, its flip cost s): towards prefill the decode instance with
        the fewest running tokens and no deflected prefills; towards decode the prefill
        instance with the shortest queue."""
        if want is Role.PREFILL:
            free = [i for i in decode if i not in blocked and not view.instance(i).prefill_queue]
            if not free:
                return None, math.inf
            return min(free, key=lambda i: (view.running_tokens(i), i)), 0.0
        free = [i for i in prefill if i not in blocked]
        if not free:
            return None, math.inf
        delay, pick = min((self.predictor.delay(view, i), i) for i in free)
        return pick, delay
