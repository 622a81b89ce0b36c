"""Decode binding by projected iteration time: the combined scheduler's decode choice.

At the handoff, each decode instance's next iteration is projected with the request added:
its decodes (running and with KV on the way) plus one, their contexts plus the request's,
and a chunk of any prompt deflected onto it still queued (at most ``chunk_tokens``), timed by
the performance model. The request goes where that iteration is shortest, i.e. where its
tokens (and everyone else's there) come fastest. Token load (SIBYL's projection, Baton's
least-loaded) weighs a token of context the same on every instance and request counts
weigh a request the same whatever its context; the perf model weighs both as the engine
does (batch size drives the weight reads, contexts the KV reads). Instances whose KV could
not hold the request's context on top of their load are taken only when none can; ties go
to the lower token load, then the lower id.
"""

from __future__ import annotations

import numpy as np

from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.perf.model import PerfModel, prefill_shape


def projected_iteration_s(view: ClusterView, perf: PerfModel, instance_id: int, context_tokens: int,
                          chunk_tokens: int) -> float:
    """The instance's next iteration time (s) with a decode of ``context_tokens`` added."""
    queued = min(view.queued_prefill_moments(instance_id)[1], chunk_tokens)
    shape = prefill_shape(queued, 0, view.decode_work(instance_id) + 1,
                          int(view.running_tokens(instance_id)) + context_tokens)
    return perf.iteration_time_s(shape)


def bind_by_iteration(view: ClusterView, perf: PerfModel, request: RequestState, ids: list[int],
                      chunk_tokens: int, loads: np.ndarray | None = None) -> int | None:
    """The instance of ``ids`` whose projected iteration with the request is shortest
    (``loads``: their ``token_loads`` where the caller has read them)."""
    if not ids:
        return None
    ctx = view.context_tokens(request.req_id)
    loads = view.token_loads(ids) if loads is None else loads
    best, best_key = None, None
    for i, load in zip(ids, loads.tolist()):
        inst = view.instance(i)
        overflows = load + ctx > inst.kv_blocks_total * inst.block_size_tokens
        key = (overflows, projected_iteration_s(view, perf, i, ctx, chunk_tokens), load, i)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best
