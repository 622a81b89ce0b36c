"""Several chunked-prefill iterations as one segment.

A prompt of a few thousand tokens takes several iterations of ``max_num_batched_tokens``
chunks; while the same decodes run beside it and nothing else changes, those iterations
are planned at once (``plan_prefill_run``) and the simulator processes them as one event.
The plan stops before the first iteration in which vLLM's scheduler would do something
else: a prefill finished in the iteration before (it leaves the prefill batch), a decode
finishes or reaches a watched length (``DecodeTable.horizon``), the KV blocks for the next
iteration's tokens are not free (the scheduler would preempt), budget is left over while a
request waits (it would be admitted), or the batch starts or stops holding a deflected
prefill's chunk (its token gaps are counted apart). Each iteration's duration comes from the
performance model on that iteration's own shape, so times are those of per-iteration mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from baton.engine_model.batch import chunk_of, iteration_shape
from baton.engine_model.work import PrefillItem
from baton.perf.model import PerfModel

MAX_RUN_ITERS = 4096


@dataclass(slots=True)
class PrefillRun:
    """A planned run: iteration k's duration ``iters_s[k]`` (s), its chunks ``chunks[k]``
    (item, tokens, the item's computed tokens after it), and the prefill blocks taken
    beyond iteration 0's once iteration k is under way (``blocks[k]``, cumulative)."""

    iters_s: list[float]
    chunks: list[list[tuple[PrefillItem, int, int]]]
    blocks: list[int] = field(default_factory=lambda: [0])


@dataclass(slots=True)
class RunLimits:
    """What bounds a run: decode iterations before the batch must change (``horizon``),
    decode blocks taken by iteration k (``decode_growth``), free blocks after iteration 0
    (``free_blocks``), the prefill budget per iteration (tokens), whether a request waits
    for admission, and the block size (tokens)."""

    horizon: int
    decode_growth: Callable[[int], int]
    free_blocks: int
    budget: int
    waiting: bool
    block_size: int


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _chunks(items: list[PrefillItem], done: dict[int, int], budget: int) -> list[tuple[PrefillItem, int]]:
    """The running prefills' chunks of one iteration (``_running_needs``'s order and rule)."""
    out: list[tuple[PrefillItem, int]] = []
    for item in items:
        if budget <= 0:
            break
        chunk = chunk_of(item, budget, out, done[item.req_id])
        if chunk > 0:
            out.append((item, chunk))
            budget -= chunk
    return out


def plan_prefill_run(first: list[tuple[PrefillItem, int]], iter0_s: float, items: list[PrefillItem],
                     decodes: tuple[int, int, float], limits: RunLimits, perf: PerfModel) -> PrefillRun:
    """Plan iterations after the first (``first``: its chunks, already given their blocks;
    ``items``: the admitted prefills in running order; ``decodes``: (rows, their context
    tokens now, the context length CV^2 the engine uses))."""
    n, ctx_sum, cv2 = decodes
    bs, budget, growth = limits.block_size, limits.budget, limits.decode_growth
    done = {it.req_id: it.done_tokens for it in items}
    blocks = {it.req_id: it.blocks for it in items}
    run = PrefillRun([iter0_s], [[]])
    for item, chunk in first:
        done[item.req_id] += chunk
        run.chunks[0].append((item, chunk, done[item.req_id]))
    deflected = any(it.chunk_limit is not None for it, _ in first)
    head, extra, j = items[0], 0, 1
    ended = any(d >= it.total_tokens for it, _, d in run.chunks[0])
    while not ended and j < min(limits.horizon, MAX_RUN_ITERS):
        if head.chunk_limit is None and head.total_tokens - done[head.req_id] > budget:
            if deflected:
                break  # the usual case, the oldest prompt taking the whole budget, holds no deflected chunk
            chunks = [(head, budget)]
        else:
            chunks = _chunks(items, done, budget)
            if not chunks or (limits.waiting and sum(c for _, c in chunks) < budget):
                break
            if any(it.chunk_limit is not None for it, _ in chunks) != deflected:
                break
        grow = 0
        for it, c in chunks:
            grow += max(0, _ceil_div(done[it.req_id] + c, bs) - blocks[it.req_id])
        if (growth(j) if n else 0) + extra + grow > limits.free_blocks:
            break
        shape = iteration_shape([(c, done[it.req_id]) for it, c in chunks], n, ctx_sum + n * j, cv2)
        run.iters_s.append(perf.iteration_time_s(shape))
        extra += grow
        run.blocks.append(extra)
        last = []
        for it, c in chunks:
            d = done[it.req_id] = done[it.req_id] + c
            blocks[it.req_id] = max(blocks[it.req_id], _ceil_div(d, bs))
            last.append((it, c, d))
            ended = ended or d >= it.total_tokens  # a prefill ended: the batch changes after this
        run.chunks.append(last)
        j += 1
    return run
