"""The combined scheduler's role controller: flip an instance between prefill and decode
when the demand ratio has shifted for longer than the flip costs (Arrow's elastic pools,
driven by sustained demand instead of a single arrival or a slow window).

Signals, read every time ``decide`` is called:

- prefill *hot*: the prefill work waiting, per prefill instance, would take more than
  ``prefill_hot`` (0.5) x the TTFT SLO (predicted queueing delay, Arrow's quadratic),
  counting prompts deflected onto decode instances and still queued there: deflection
  absorbs a burst, but absorbing a sustained shift it hides the demand from this test (on
  the Mooncake trace no flip happened while deflection held the prefill queues short, and
  combined sustained a third of Arrow's rate);
- prefill *cool*: every prefill instance's delay is within ``prefill_cool`` (0.1) x the TTFT SLO;
- decode *hot*: the decode instances' mean decode-only iteration time (the perf model on
  each one's decodes, running and arriving) is above ``decode_hot`` (0.9) x the TPOT SLO,
  or their mean running tokens above ``decode_hot`` x Max Running Tokens (Arrow's MRT);
- decode *cool*: with one instance fewer, the mean running tokens would stay within
  ``decode_cool`` (0.7, Arrow's "decode load is low") x MRT, and so would the mean
  decode-only iteration time against the TPOT SLO.

The decode side is judged on its decodes alone, not on the token intervals it reports:
prompts deflected onto it stretch its iterations up to the TBT budget by design, and read
as "busy" that would forbid the flip exactly when prefill work spills onto decode (with
Arrow's interval test, no flip happened on the Azure code trace while deflections ran).

A flip towards prefill needs prefill hot and decode cool; towards decode, decode hot and
prefill cool; either must hold without a break for ``window_s`` plus the flip's own cost:
for a prefill instance turning to decode, the queue it must drain first (its predicted
delay); a decode instance turning to prefill keeps its decodes running, so nothing more.
After a flip both clocks restart. Neither side is left without an instance.
"""

from __future__ import annotations

import math

import numpy as np

from baton.core.decisions import ChangeRole
from baton.core.instance import Role
from baton.core.view import ClusterView
from baton.perf.model import BatchShape, PerfModel
from baton.policies.prefill_time import PrefillPredictor


class FlipController:
    """Decides at most one role change per call (see the module docstring)."""

    def __init__(self, predictor: PrefillPredictor, perf: PerfModel, ttft_slo_s: float, tpot_slo_s: float,
                 max_running_tokens: int, window_s: float = 3.0,
                 thresholds: tuple[float, float, float, float] = (0.5, 0.1, 0.9, 0.7)) -> None:
        prefill_hot, prefill_cool, decode_hot, decode_cool = thresholds
        if not (0 < prefill_cool < prefill_hot and 0 < decode_cool < decode_hot) or window_s < 0:
            raise ValueError("need 0 < prefill_cool < prefill_hot, 0 < decode_cool < decode_hot, flip_window_s >= 0")
        self.predictor, self.perf = predictor, perf
        self.ttft_slo_s, self.tpot_slo_s, self.mrt = ttft_slo_s, tpot_slo_s, max_running_tokens
        self.window_s, self.thresholds = window_s, thresholds
        self.since: dict[Role, float] = {}  # direction -> when its condition began to hold
        self.flips = {Role.PREFILL: 0, Role.DECODE: 0}

    # --- signals -------------------------------------------------------------------------
    def prefill_delays(self, view: ClusterView, ids: list[int]) -> list[float]:
        return [self.predictor.delay(view, i) for i in ids]

    def decode_signals(self, view: ClusterView, ids: list[int]) -> tuple[float, float]:
        """(mean running tokens, mean decode-only iteration time s) of the decode side."""
        if not ids:
            return 0.0, 0.0
        tokens = [view.running_tokens(i) for i in ids]
        iters = [self.perf.iteration_time_s(BatchShape(n_decodes=view.decode_work(i), decode_ctx_tokens=int(t)))
                 for i, t in zip(ids, tokens) if view.decode_work(i)]
        return float(np.mean(tokens)), float(np.mean(iters)) if iters else 0.0

    def wanted(self, view: ClusterView, prefill: list[int], decode: list[int]) -> Role | None:
        """The role an instance should move to now, if the demand ratio says so."""
        if not prefill or not decode:
            return None
        p_hot, p_cool, d_hot, d_cool = self.thresholds
        delays = self.prefill_delays(view, prefill)
        deflected = sum(self.predictor.delay(view, i) for i in decode if view.instance(i).prefill_queue)
        demand = (sum(delays) + deflected) / len(prefill)
        tokens, interval = self.decode_signals(view, decode)
        decode_hot = interval > d_hot * self.tpot_slo_s or tokens > d_hot * self.mrt
        spread = tokens * len(decode) / max(1, len(decode) - 1)
        decode_cool = spread <= d_cool * self.mrt and interval * len(decode) / max(1, len(decode) - 1) \
            <= d_cool * self.tpot_slo_s
        if demand > p_hot * self.ttft_slo_s and decode_cool and len(decode) > 1:
            return Role.PREFILL
        if decode_hot and max(delays) <= p_cool * self.ttft_slo_s and not deflected and len(prefill) > 1:
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
        self.flips[want] += 1
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
