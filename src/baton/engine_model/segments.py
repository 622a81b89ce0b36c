"""How an engine's segment is planned and applied: decodes alone (iteration times affine in
the context), or prefill chunks that may run several iterations (``prefill_run``); and the
prefill progress a segment's iterations publish. A part of ``Engine``, split off for size."""

from __future__ import annotations

import itertools

from baton.core.instance import Segment
from baton.engine_model.batch import decode_horizon
from baton.engine_model.prefill_run import MAX_RUN_ITERS, PrefillRun, RunLimits, plan_prefill_run
from baton.engine_model.work import PrefillItem
from baton.perf.model import BatchShape


class SegmentPlans:
    """Segment planning of ``Engine`` (its ``state``, ``cfg``, ``perf``, ``prefills``,
    ``chunks``, ``joins`` and the running segment's ``run`` and ``synced``)."""

    run: PrefillRun | None
    synced: int
    prefill_runs: int

    def _decode_segment(self, now_s: float, iter0: float) -> Segment:
        """Decodes alone: iterations lengthen affinely with the context."""
        st, table, bs = self.state, self.state.decodes, self.cfg.block_size
        grown = BatchShape(n_decodes=table.n, decode_ctx_tokens=table.ctx_sum + table.n, decode_ctx_cv2=self._cv2)
        slope = self.perf.iteration_time_s(grown) - iter0
        ge = table.residue_ge(bs)
        max_iters = decode_horizon(table.horizon(), table.n, ge, st.kv_blocks_total - st.kv_blocks_used, bs)
        seg = Segment(now_s, iter0, slope, max_iters, bs)
        if max_iters > 1:
            seg.rows, seg.residue_ge = table.n, ge
        return seg

    def _prefill_segment(self, now_s: float, iter0: float) -> Segment:
        """Prefill chunks (and decodes beside them): iterations planned one by one while
        the batch stays the same (``prefill_run``)."""
        st, table, bs = self.state, self.state.decodes, self.cfg.block_size
        if self.joins or not self.multi_iteration_prefill:
            return Segment(now_s, iter0, 0.0, 1, bs)
        seg = Segment(now_s, iter0, 0.0, 1, bs)
        seg.rows = table.n

        def decode_growth(k: int) -> int:  # the residues only once a second iteration is considered
            if not seg.residue_ge:
                seg.residue_ge = table.residue_ge(bs)
            return seg.decode_growth(k)
        limits = RunLimits(table.horizon() if table.n else MAX_RUN_ITERS, decode_growth,
                           st.kv_blocks_total - st.kv_blocks_used, self.cfg.max_num_batched_tokens - table.n,
                           self.waiting, bs)
        items = [it for it in self.prefills.values() if it.admitted]
        run = plan_prefill_run(self.chunks, iter0, items, (table.n, table.ctx_sum, self._cv2), limits, self.perf)
        if len(run.iters_s) > 1:
            self.run = run
            self.prefill_runs += 1
            seg.max_iters, seg.iters_s = len(run.iters_s), tuple(run.iters_s)
            seg.ends_s = tuple(itertools.accumulate(run.iters_s, initial=now_s))[1:]
            seg.prefill_blocks = tuple(run.blocks)
        return seg

    def _apply_chunks(self, k: int) -> list[PrefillItem]:
        """Compute the prefill chunks of the segment's first ``k`` iterations (the blocks of
        each after the first are taken as its iteration starts); returns the last one's items."""
        steps = self.run.chunks[:k] if self.run is not None else [[(it, c, it.done_tokens + c) for it, c in self.chunks]]
        for j, step in enumerate(steps):
            for item, chunk, done in step:
                if j:
                    self._grow_item(item, chunk)
                item.done_tokens = done
                if j >= self.synced:
                    self._publish_chunk(item, chunk, done)
        return [item for item, _, _ in steps[-1]] if steps else []

    def _publish_chunk(self, item: PrefillItem, chunk: int, done_tokens: int) -> None:
        """What a computed chunk changes outside the engine: its queued tokens, its cached blocks."""
        self.state.progress_prefill(item.req_id, chunk)
        if self.tracks_blocks:
            self.cache.register(item.req_id, self.keys_of(item.req_id)[:done_tokens // self.cfg.block_size])

    def sync(self, now_s: float) -> float | None:
        """Publish the prefill progress of the running segment's iterations done by
        ``now_s`` (policies read queued prefill tokens and cached blocks between events, as
        they would between one-iteration segments). Returns when the next iteration ends,
        None when only the segment's last is left (its end publishes it)."""
        seg, run = self.state.segment, self.run
        if not self.busy or run is None or seg is None:
            return None
        k = min(seg.iterations_done(now_s), seg.max_iters - 1)
        for j in range(self.synced, k):
            for item, chunk, done in run.chunks[j]:
                self._publish_chunk(item, chunk, done)
        self.synced = max(self.synced, k)
        return seg.ends_s[k] if k + 1 < seg.max_iters else None
