"""One simulated engine instance: continuous batching with chunked prefill (vLLM v1 style).

Each iteration serves every running decode plus prefill chunks up to the token budget
(``max_num_batched_tokens``) and the sequence cap (``max_num_seqs``). While the batch holds
only decodes and nothing changes, the engine plans a *segment* of many iterations whose
durations grow affinely with the context, and the simulator processes it as one event; a
prompt's chunked prefill that takes several iterations beside the same decodes is one
segment too, its iterations listed (``segments.py``, ``prefill_run.py``). In reference mode
(``closed_form=False``) every segment is one iteration.

Memory pressure follows vLLM v1's scheduler (``v1/core/sched/scheduler.py``):

- running work (decodes, then admitted prefills in admission order) gets the KV blocks
  for this iteration's tokens first; when they do not fit, the most recently admitted
  running request is preempted (its blocks freed, its progress dropped) and put back at
  the *head* of the FCFS waiting queue;
- waiting prefills are admitted in order, each with the blocks for its *first chunk*
  only (a preempted request recomputes its context in chunks), but only once the free
  blocks could hold its whole current sequence (vLLM's ``scheduler_reserve_full_isl``,
  on by default: ``allocate_slots(full_sequence_must_fit=True)``; without it a long
  preempted request is re-admitted on its first chunk, becomes the latest admitted and is
  preempted again, over and over); admission stops at the first request that does not
  fit, and nothing is admitted in an iteration that preempted;
- KV arriving from elsewhere (PD handoffs, migrations) is a waiting request too: it may
  only take blocks while nothing waits ahead of it (``reserve``).

With prefix caching (``EngineConfig.enable_prefix_caching``, on by default as in vLLM v1;
``engine_model/prefix_cache.py``), a request admitted from the waiting queue starts at its longest
cached prefix of full blocks: those tokens cost no prefill compute but their blocks count
against capacity (a cached block that was free leaves the free queue). Computed full
blocks are registered as the chunks end; a request's blocks go back to the free queue,
still cached, when it finishes, is preempted or its KV leaves (PD handoff, migration). KV
that arrives from elsewhere is not looked up: the receiving side takes the whole context.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from baton.core.decode_table import DecodeTable
from baton.core.instance import InstanceState, Segment
from baton.perf.model import PerfModel, length_cv2
from baton.engine_model.batch import chunk_of, iteration_shape
from baton.engine_model.prefill_run import PrefillRun
from baton.engine_model.segments import SegmentPlans
from baton.engine_model.kv import KeySource, KvBlocks
from baton.engine_model.work import (DecodeJoin, DecodeRow, EngineConfig, PrefillItem, PrefillKind,
                                    SegmentResult)

def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


class Engine(SegmentPlans, KvBlocks):
    """A simulated instance. The simulator calls ``plan`` when the engine is idle or a
    segment ended, ``interrupt`` when new work arrives mid-segment, and ``finish`` when
    the segment's end event fires."""

    def __init__(self, state: InstanceState, config: EngineConfig, perf: PerfModel,
                 closed_form: bool = True, keys: KeySource | None = None) -> None:
        super().__init__(state, config, keys)
        self.perf, self.closed_form = perf, closed_form
        self.prefills: OrderedDict[int, PrefillItem] = OrderedDict()
        self.joins: deque[DecodeJoin] = deque()
        self.new_rows: dict[int, float | None] = {}  # req -> time of its previous token
        self.chunks: list[tuple[PrefillItem, int]] = []
        self.busy = False
        self.version = 0
        self.admit_seq = 0
        self.preemptions = 0
        self._cv2: float | None = None
        self.started: list[int] = []                 # prefills admitted by the last plan
        self.admitted = 0                            # prefills admitted and not done
        self.preempted: list[int] = []               # requests preempted since last read
        self.aborting: set[int] = set()              # aborted in the running segment: leave at its end
        self.run: PrefillRun | None = None           # the running segment's prefill iterations, if several
        self.synced = 0                              # of them, those whose progress is published
        self.multi_iteration_prefill = closed_form   # off: one segment per prefill chunk
        self.prefill_runs = 0                        # segments that ran several prefill iterations

    # --- work in ---------------------------------------------------------------------
    def add_prefill(self, item: PrefillItem, front: bool = False) -> None:
        self.prefills[item.req_id] = item
        if front:
            self.prefills.move_to_end(item.req_id, last=False)
        self.state.queue_prefill(item.req_id, item.total_tokens - item.done_tokens)
        self.count_requests()

    def add_join(self, join: DecodeJoin) -> None:
        self.joins.append(join)
        self.count_requests()

    def count_requests(self) -> None:
        """Publish the engine's running / waiting counts (vLLM's metrics) on the state."""
        admitted = self.admitted
        self.state.running_requests = self.state.decodes.n + admitted
        self.state.waiting_requests = len(self.prefills) - admitted + len(self.joins)

    @property
    def waiting(self) -> bool:
        """Whether a request waits in the FCFS queue for admission (blocks or a slot):
        ``admitted`` counts the queue's admitted items, so any beyond them wait."""
        return len(self.prefills) > self.admitted

    # --- segment control ---------------------------------------------------------------
    def interrupt(self, now_s: float) -> float | None:
        """Cut the running segment at the next iteration boundary. Returns the new end
        time if it changed (the caller reschedules), else None."""
        seg = self.state.segment
        if not self.busy or seg is None or seg.max_iters <= 1:
            return None
        k = seg.iterations_done(now_s)
        if k + 1 >= seg.max_iters:
            return None
        self.state.cut_segment(k + 1)
        self.version += 1
        return seg.end_s(k + 1)

    def plan(self, now_s: float) -> float | None:
        """Form the next batch. Returns the segment end time, or None if idle."""
        st, table = self.state, self.state.decodes
        self._admit_joins(now_s)
        self.started = []
        before = len(self.preempted)  # the list is the caller's to read and clear
        self.chunks = self._schedule_running()
        preempted = len(self.preempted) > before
        # vLLM admits nothing in a step that preempted; if that step would be empty, the
        # next one (which admits) follows at once
        if not preempted or (not self.chunks and table.n == 0):
            self.chunks += self._admit_waiting(table.n, self.chunks)
        self.count_requests()
        if not self.chunks and table.n == 0:
            st.set_segment(None)
            self.busy = False
            return None
        if self._cv2 is None:
            self._cv2 = length_cv2(table.ctx_values())
        iter0 = self.perf.iteration_time_s(iteration_shape([(c, it.done_tokens) for it, c in self.chunks],
                                                           table.n, table.ctx_sum, self._cv2))
        self.run, self.synced = None, 0
        # after a preemption vLLM admits nothing until the next iteration: replan then
        if not self.closed_form or (preempted and (self.waiting or self.chunks)):
            seg = Segment(now_s, iter0, 0.0, 1, self.cfg.block_size)
        elif self.chunks:
            seg = self._prefill_segment(now_s, iter0)
        else:
            seg = self._decode_segment(now_s, iter0)
        st.set_segment(seg)
        self.busy = True
        self.version += 1
        return seg.end_s(seg.max_iters)

    def _admit_joins(self, now_s: float) -> None:
        table = self.state.decodes
        while self.joins and table.n + self.admitted < self.cfg.max_num_seqs:
            j = self.joins.popleft()
            if not j.admit_seq:  # KV from elsewhere: it enters the running order now
                self.admit_seq += 1
            table.add(j.req_id, j.ctx, j.generated, j.stop_at, j.admit_seq or self.admit_seq, j.blocks, j.watch_ctx,
                      joined_s=now_s)
            self.state.drop_incoming(j.req_id)
            self.new_rows[j.req_id] = j.last_token_s
            self._cv2 = None

    def _schedule_running(self) -> list[tuple[PrefillItem, int]]:
        """Blocks for every decode's next token and every admitted prefill's next chunk;
        preempt the latest-admitted running request until they fit."""
        while True:
            chunks, need, grow = self._running_needs()
            if need <= self.state.kv_blocks_total - self.state.kv_blocks_used:
                break
            self._preempt_latest()
        if grow:
            self.state.decodes.fill_blocks(self.cfg.block_size)
            self._allocate(grow)
        for item, chunk in chunks:
            self._grow_item(item, chunk)
        return chunks

    def _running_needs(self) -> tuple[list[tuple[PrefillItem, int]], int, int]:
        """This iteration's prefill chunks, the KV blocks running work needs, and the
        decodes' share of them."""
        table, bs = self.state.decodes, self.cfg.block_size
        need = grow = table.blocks_short(bs)
        budget = self.cfg.max_num_batched_tokens - table.n
        chunks: list[tuple[PrefillItem, int]] = []
        for item in self.prefills.values():
            if not item.admitted or budget <= 0:
                continue
            chunk = chunk_of(item, budget, chunks)
            if chunk > 0:
                chunks.append((item, chunk))
                budget -= chunk
                need += max(0, _ceil_div(item.done_tokens + chunk, bs) - item.blocks)
        return chunks, need, grow

    def _preempt_latest(self) -> None:
        """Preempt the running request admitted last (vLLM's FCFS victim)."""
        table = self.state.decodes
        item = max((it for it in self.prefills.values() if it.admitted),
                   key=lambda it: it.admit_seq, default=None)
        row_id, row_seq = table.latest_admitted() if table.n else (-1, -1)
        if item is not None and item.admit_seq > row_seq:
            return self._preempt_prefill(item)
        if table.n == 0:
            raise RuntimeError("KV blocks over-committed with nothing left to preempt")
        self.preempt(row_id)

    def _preempt_prefill(self, item: PrefillItem) -> None:
        """A running prefill loses its blocks and progress and waits at the queue head."""
        self.free_request(item.req_id, item.blocks, item.done_tokens)
        self.state.progress_prefill(item.req_id, -item.done_tokens)
        item.blocks, item.done_tokens, item.admitted = 0, 0, False
        self.admitted -= 1
        self.prefills.move_to_end(item.req_id, last=False)
        self.preemptions += 1
        self.preempted.append(item.req_id)

    def preempt(self, req_id: int) -> None:
        """Drop a decode's KV and queue it for recompute at the front of the queue."""
        row = DecodeRow.removed_from(self.state.decodes, req_id)
        self.free_request(req_id, row.blocks, row.ctx)
        self.new_rows.pop(req_id, None)
        self._cv2 = None
        self.preemptions += 1
        self.preempted.append(req_id)
        self.add_prefill(PrefillItem(req_id, row.ctx, PrefillKind.RECOMPUTE, row.stop_at, row.generated),
                         front=True)

    def _admit_waiting(self, n_decodes: int,
                       running: list[tuple[PrefillItem, int]]) -> list[tuple[PrefillItem, int]]:
        """Admit waiting prefills in FCFS order with the blocks for their first chunk;
        stop at the first that does not fit."""
        if not self.waiting:
            return []
        st = self.state
        budget = self.cfg.max_num_batched_tokens - n_decodes - sum(c for _, c in running)
        seqs = n_decodes + self.admitted
        chunks: list[tuple[PrefillItem, int]] = []
        for item in self.prefills.values():
            if item.admitted:
                continue
            hit, keys = self._prefix_hit(item)
            done = hit * self.cfg.block_size if hit else item.done_tokens
            chunk = chunk_of(item, budget, running + chunks, done)
            if chunk <= 0 and item.chunk_limit is not None:
                continue  # a deflected prefill waits for the next allowance; others may go
            upto = item.total_tokens if self.cfg.reserve_full_sequence else done + chunk
            blocks = max(0, _ceil_div(upto, self.cfg.block_size) - item.blocks - hit)
            if hit:  # cached blocks in the free queue are taken from it: they need room too
                blocks += self.cache.free_hits(keys)
            if budget <= 0 or seqs >= self.cfg.max_num_seqs or blocks > st.kv_blocks_total - st.kv_blocks_used:
                break
            self.admit_seq += 1
            item.admitted, item.admit_seq = True, self.admit_seq
            self.admitted += 1
            if self.cache is not None and item.blocks == 0:
                self._take_prefix(item, keys, done)
            self._trim_reservation(item)
            self._grow_item(item, chunk)
            seqs += 1
            self.started.append(item.req_id)
            chunks.append((item, chunk))
            budget -= chunk
        return chunks

    # --- segment end -------------------------------------------------------------------
    def finish(self, now_s: float) -> SegmentResult:
        """Apply the segment that just ended and report what it produced."""
        st, table, seg = self.state, self.state.decodes, self.state.segment
        assert seg is not None
        k = seg.max_iters
        result = SegmentResult(k, now_s, seg.elapsed_s(k) / k)
        if table.n:
            growth = seg.decode_growth(k - 1)
            if growth:
                table.fill_blocks(self.cfg.block_size, k - 1)
                self._allocate(growth)
            n_new = len(self.new_rows)
            result.gaps = (seg.iter0_s, seg.slope_s, k, table.n - n_new, n_new)
            result.gap_series = seg.iters_s[:k]
            first_end_s = seg.start_s + seg.iter0_s
            for rid, t in self.new_rows.items():
                if t is None:
                    result.first_tokens.append((rid, first_end_s))
                else:
                    result.first_gaps.append(first_end_s - t)
            self.new_rows.clear()
            table.advance(k)
            st.recent_token_interval_s = seg.iteration_s(k - 1)
            self._collect_decode_ends(result)
        st.recent_iteration_s = seg.iteration_s(k - 1)
        result.with_deflected = any(item.chunk_limit is not None for item, _ in self.chunks)
        for item in self._apply_chunks(k):
            if item.done_tokens >= item.total_tokens:
                del self.prefills[item.req_id]
                self.admitted -= 1
                st.drop_prefill(item.req_id)
                result.prefilled.append(item)
        self.chunks, self.run = [], None
        st.set_segment(None)
        self.busy = False
        if self.aborting:
            self._drop_aborted(result)
        self.count_requests()
        return result

    def _collect_decode_ends(self, result: SegmentResult) -> None:
        table = self.state.decodes
        done, watched = table.ended()
        for rid, ctx in watched:
            result.thresholds.append((rid, ctx))
            table.set(rid, "watch_ctx", DecodeTable.NO_WATCH)
        for rid in done:
            row = table.remove(rid)
            self.free_request(rid, row["blocks"], row["ctx"])
            result.finished.append(rid)
        if done:
            self._cv2 = None

    # --- aborts (the emulator's clients leave; the simulator has none) --------------------
    def abort(self, req_id: int) -> None:
        """Drop a request wherever it is here (queued or running prefill, a decode waiting
        for a slot or running, KV held for a transfer) and free its blocks. As in vLLM,
        which handles aborts between steps, work in the running segment leaves when the
        segment ends (``finish`` then reports nothing about it); the rest leaves now."""
        steps = self.run.chunks if self.run is not None else [self.chunks]  # items first in both kinds of entry
        if self.busy and (req_id in self.state.decodes or any(e[0].req_id == req_id for step in steps for e in step)):
            self.aborting.add(req_id)
            return
        self._drop(req_id)
        self.count_requests()

    def _drop_aborted(self, result: SegmentResult) -> None:
        gone = self.aborting
        for item in [it for it in result.prefilled if it.req_id in gone]:
            result.prefilled.remove(item)  # its blocks were the caller's to place: free them
            self.free_request(item.req_id, item.blocks, item.done_tokens)
        result.finished = [r for r in result.finished if r not in gone]
        result.thresholds = [t for t in result.thresholds if t[0] not in gone]
        result.first_tokens = [t for t in result.first_tokens if t[0] not in gone]
        for req_id in gone:
            self._drop(req_id)
        gone.clear()

    def _drop(self, req_id: int) -> None:
        if req_id in self.held_blocks:
            return self.release_held(req_id)
        item = self.prefills.pop(req_id, None)
        if item is not None:
            self.admitted -= item.admitted
            self.free_request(req_id, item.blocks, item.done_tokens)
            return self.state.drop_prefill(req_id)
        if req_id in self.state.decodes:
            row = DecodeRow.removed_from(self.state.decodes, req_id)
            self.new_rows.pop(req_id, None)
            self._cv2 = None
            return self.free_request(req_id, row.blocks, row.ctx)
        join = next((j for j in self.joins if j.req_id == req_id), None)
        if join is not None:
            self.joins.remove(join)
            self.state.drop_incoming(req_id)
            self.free_request(req_id, join.blocks, join.ctx)

    def remove_decode(self, req_id: int) -> DecodeRow:
        """Take a decode out of the batch (migration); its blocks stay allocated."""
        row = DecodeRow.removed_from(self.state.decodes, req_id)
        self.new_rows.pop(req_id, None)
        self._cv2 = None
        self.count_requests()
        return row

    def set_watch(self, req_id: int, context_tokens: int) -> bool:
        if req_id not in self.state.decodes:
            return False
        self.state.decodes.set(req_id, "watch_ctx", context_tokens)
        return True
