"""Static prefill-deflection rules as production routers ship them (the baselines Kairos's
Figure 2 compares): each sends a request's prefill to a decode instance, which prefills it
in chunks of ``chunk_tokens`` (default 2,048, vLLM's usual ``--max-num-batched-tokens``
for online serving: the decode worker runs it as plain chunked prefill) between decode
iterations and decodes it there, when one
fixed condition holds; otherwise plain PD (least queued prefill work, then the least
token-loaded decode instance when the prefill ends).

- ``deflect-short`` (``max_prompt_tokens``): prompts under N tokens, as llm-d's PD decider
  runs short (non-cached) prompts on the decode worker;
- ``deflect-queue`` (``max_prefill_queue_tokens``): when even the least-loaded prefill
  instance has more than Q tokens queued, as Dynamo's conditional disaggregation does.

The decode instance chosen is the least token-loaded; neither rule looks at TBT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.core.decisions import ArrivalPlan
from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView
from baton.policies.base import PolicyContext, Stage, params_for


def _chunk_tokens() -> Any:
    return setting(2048, ge=1, unit="tokens", doc="chunk size a deflected prompt is prefilled in on its decode "
                                                  "instance, between decode iterations")


@dataclass(frozen=True, slots=True)
class DeflectShortParams:
    """The short-prompt rule's parameters."""

    max_prompt_tokens: int = setting(512, ge=0, unit="tokens",
                                     doc="prompts shorter than this are deflected to a decode instance")
    chunk_tokens: int = _chunk_tokens()


@dataclass(frozen=True, slots=True)
class DeflectQueueParams:
    """The queue-triggered rule's parameters."""

    max_prefill_queue_tokens: int = setting(8192, ge=0, unit="tokens",
                                            doc="deflect while even the least-loaded prefill instance has more than "
                                                "this many prompt tokens left to prefill")
    chunk_tokens: int = _chunk_tokens()


class _Rule(Stage):
    needs_bookings = True

    def __init__(self, context: PolicyContext, params: DeflectShortParams | DeflectQueueParams) -> None:
        super().__init__(context)
        self.params = params
        self.chunk_tokens = params.chunk_tokens

    def deflects(self, view: ClusterView, request: RequestState, queued_tokens: float) -> bool:
        raise NotImplementedError

    def plan_arrival(self, view: ClusterView, request: RequestState, plan: ArrivalPlan) -> ArrivalPlan:
        prefills = [(view.instance(p).prefill_queue_tokens, p) for p in view.prefill_ids]
        queued, p = min(prefills) if prefills else (float("inf"), None)
        decode = self.choose_decode(view, request)
        if decode is not None and (p is None or self.deflects(view, request, queued)):
            return ArrivalPlan(decode, decode, self.chunk_tokens, plan.reject_reason, plan.role_changes)
        return ArrivalPlan(p, None, None, plan.reject_reason, plan.role_changes)

    def choose_decode(self, view: ClusterView, request: RequestState) -> int | None:
        return view.least_token_load(view.decode_ids)


class DeflectShort(_Rule):
    """Deflect prompts shorter than ``max_prompt_tokens``."""

    name = "deflect-short"
    Params = DeflectShortParams

    def __init__(self, context: PolicyContext, params: DeflectShortParams | None = None, **values: Any) -> None:
        p = params_for(DeflectShort, params, values)
        super().__init__(context, p)
        self.max_prompt_tokens = p.max_prompt_tokens

    def deflects(self, view: ClusterView, request: RequestState, queued_tokens: float) -> bool:
        return request.request.prompt_tokens < self.max_prompt_tokens


class DeflectQueue(_Rule):
    """Deflect while the least-loaded prefill queue exceeds ``max_prefill_queue_tokens``."""

    name = "deflect-queue"
    Params = DeflectQueueParams

    def __init__(self, context: PolicyContext, params: DeflectQueueParams | None = None, **values: Any) -> None:
        p = params_for(DeflectQueue, params, values)
        super().__init__(context, p)
        self.max_prefill_queue_tokens = p.max_prefill_queue_tokens

    def deflects(self, view: ClusterView, request: RequestState, queued_tokens: float) -> bool:
        return queued_tokens > self.max_prefill_queue_tokens


STAGES = {"deflect-short": DeflectShort, "deflect-queue": DeflectQueue}
