"""The arithmetic of one batch that needs no engine state: a prefill's chunk this iteration
and how many decode-only iterations may run before the batch must change."""

from __future__ import annotations

from baton.engine_model.work import PrefillItem
from baton.perf.model import BatchShape, chunk_attn_pairs, chunk_diag_pairs

MAX_SEGMENT_ITERS = 1 << 30


def chunk_of(item: PrefillItem, budget: int, scheduled: list[tuple[PrefillItem, int]],
             done_tokens: int | None = None) -> int:
    """This iteration's chunk of ``item`` in tokens (``done_tokens`` computed so far, default
    its own; ``budget`` tokens left in the iteration). Chunk-limited (deflected) prefills
    share one allowance per iteration, the smallest limit among them: the instance runs one
    TBT-safe chunked-prefill schedule, not one per deflected request."""
    left = item.total_tokens - (item.done_tokens if done_tokens is None else done_tokens)
    if item.chunk_limit is None:
        return min(left, budget)
    limited = [(it.chunk_limit, c) for it, c in scheduled if it.chunk_limit is not None]
    allowance = min([item.chunk_limit, *(lim for lim, _ in limited)]) - sum(c for _, c in limited)
    return max(0, min(left, budget, allowance))


def decode_horizon(horizon: int, rows: int, residue_ge: tuple[int, ...], free_blocks: int, block_size: int) -> int:
    """Iterations until the decode batch must change: ``horizon`` (a finish, a watched
    length) or the ``free_blocks`` KV blocks running out (``residue_ge``: the table's
    ``DecodeTable.residue_ge``)."""
    bs = block_size

    def growth(k: int) -> int:
        """Blocks needed while iteration k runs: n*(k//bs) + #{residue >= bs - k%bs}."""
        whole, part = divmod(k, bs)
        return rows * whole + (residue_ge[bs - part] if part else 0)
    if growth(horizon - 1) > free_blocks:
        lo, hi = 0, horizon - 1  # growth(lo) <= free < growth(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if growth(mid) <= free_blocks else (lo, mid)
        horizon = lo + 1
    return max(1, min(horizon, MAX_SEGMENT_ITERS))


def iteration_shape(chunks: list[tuple[int, int]], n_decodes: int, decode_ctx_tokens: int, cv2: float) -> BatchShape:
    """One iteration's shape: its prefill ``chunks`` as (tokens, tokens computed before the
    chunk) beside ``n_decodes`` decodes of ``decode_ctx_tokens`` context in all (none or one
    chunk, the usual cases, without the sums)."""
    if not chunks:
        return BatchShape(0, 0, n_decodes, decode_ctx_tokens, cv2, 0, 0)
    if len(chunks) == 1:
        c, offset = chunks[0]
        return BatchShape(c, chunk_attn_pairs(c, offset), n_decodes, decode_ctx_tokens, cv2, 1, chunk_diag_pairs(c))
    return BatchShape(prefill_tokens=sum(c for c, _ in chunks),
                      prefill_attn_pairs=sum(chunk_attn_pairs(c, offset) for c, offset in chunks),
                      n_decodes=n_decodes, decode_ctx_tokens=decode_ctx_tokens, decode_ctx_cv2=cv2,
                      prefill_chunks=len(chunks), prefill_diag_pairs=sum(chunk_diag_pairs(c) for c, _ in chunks))
