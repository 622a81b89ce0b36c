"""Migration of running decodes between instances, executed when a policy asks.

Live: copy the KV in rounds while the request keeps decoding on the source; once a
round's delta is small (or after ``max_rounds``), pause it at an iteration boundary and
copy the last delta (the downtime). Stop-and-copy: pause it at the next boundary and copy
the whole context (the downtime is the full transfer). Recompute: take it out at a
boundary and re-prefill its context on the target. A request preempted on its source
while it moves has no KV left to move: the migration is cancelled. The target's blocks are reserved first; a migration that
cannot be placed is refused and counted, and the request keeps running where it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from baton.core import lifecycle
from baton.core.decisions import Migrate, MigrationMode
from baton.core.request import Phase
from baton.engine_model.work import DecodeJoin, DecodeRow, PrefillItem, PrefillKind
from baton.sim.port import FlowKind, FlowTag, SimPort


@dataclass(slots=True)
class Move:
    """One migration in progress."""

    req_id: int
    src: int
    dst: int
    mode: MigrationMode
    reserved_blocks: int
    round: int = 1
    round_start_ctx: int = 0
    flow_id: int | None = None
    detaching: bool = False
    final: bool = False
    row: DecodeRow | None = None


class Migrator:
    """Executes ``Migrate`` decisions in the simulated cluster behind ``port``."""

    def __init__(self, port: SimPort, max_rounds: int = 4, final_delta_tokens: int = 16) -> None:
        self.port = port
        self.max_rounds = max_rounds
        self.final_delta_tokens = final_delta_tokens
        self.moves: dict[int, Move] = {}

    def _refuse(self) -> None:
        self.port.counters.migrations_refused += 1

    def start(self, decision: Migrate) -> None:
        port, rid = self.port, decision.req_id
        st = port.states.get(rid)
        dst = decision.target_instance
        if st is not None and decision.mode is MigrationMode.RECOMPUTE and st.phase is Phase.PREFILL \
                and st.generated_tokens > 0:
            return self._move_waiting(rid, dst)
        if (st is None or st.phase is not Phase.DECODE or rid in self.moves
                or st.decode_instance is None or st.decode_instance == dst
                or dst not in port.instances or not port.instances[dst].healthy
                or rid not in port.instances[st.decode_instance].decodes):
            return self._refuse()
        ctx = port.view.context_tokens(rid)
        bs = port.block_size
        blocks = -(-(ctx + self.max_rounds * bs) // bs)
        if not port.reserve(dst, blocks):
            return self._refuse()
        move = Move(rid, st.decode_instance, dst, decision.mode, blocks, round_start_ctx=ctx)
        self.moves[rid] = move
        lifecycle.migrating(st)
        if decision.mode is not MigrationMode.LIVE:
            self._detach_at_boundary(move)
        else:
            move.flow_id = port.start_flow(move.src, dst, port.perf.kv_bytes(ctx - 1),
                                           FlowTag(FlowKind.MIGRATION, rid))

    def _move_waiting(self, rid: int, dst: int) -> None:
        """A preempted request waiting to recompute has no KV: move it from its queue to
        the target's (refused if it is already being recomputed or the target is bad)."""
        port = self.port
        st = port.states[rid]
        src = st.decode_instance
        eng = port.engines.get(src) if src is not None else None
        item = eng.prefills.get(rid) if eng is not None else None
        if item is None or item.admitted or dst == src or dst not in port.instances \
                or not port.instances[dst].healthy:
            return self._refuse()
        del eng.prefills[rid]
        eng.state.drop_prefill(rid)
        eng.count_requests()
        port.engines[dst].add_prefill(PrefillItem(rid, item.total_tokens, PrefillKind.MIGRATE, item.stop_at,
                                                 item.generated))
        lifecycle.requeued(st, dst)
        lifecycle.migration_over(st, moved=True)  # a queued prefill moved
        port.counters.migrations += 1
        port.retry_receives(src)  # its queue head moved on
        port.kick(dst)

    def _detach_at_boundary(self, move: Move) -> None:
        move.detaching = True
        self.port.kick(move.src)

    def flow_done(self, tag: FlowTag) -> None:
        move = self.moves.get(tag.req_id)
        if move is None:
            return
        if move.final:
            return self._complete_live(move)
        ctx = self.port.view.context_tokens(move.req_id)
        delta = ctx - move.round_start_ctx
        if delta <= self.final_delta_tokens or move.round >= self.max_rounds:
            return self._detach_at_boundary(move)
        move.round += 1
        move.round_start_ctx = ctx
        move.flow_id = self.port.start_flow(move.src, move.dst, self.port.perf.kv_bytes(delta),
                                            FlowTag(FlowKind.MIGRATION, move.req_id))

    def at_boundary(self, instance_id: int) -> None:
        """Called after a segment of ``instance_id`` ends: take out requests leaving it."""
        if not self.moves:
            return
        for move in [m for m in self.moves.values() if m.src == instance_id and m.detaching and m.row is None]:
            self._take_out(move)

    def _take_out(self, move: Move) -> None:
        port = self.port
        eng, st = port.engines[move.src], port.states[move.req_id]
        row = eng.remove_decode(move.req_id)
        move.row = row
        lifecycle.transferring(st)
        lifecycle.paused(st, row.generated, port.now)
        if move.mode is MigrationMode.RECOMPUTE:
            eng.free_request(move.req_id, row.blocks, row.ctx)
            port.retry_receives(move.src)
            self._finish_move(move)
            # On the target it is a new waiting request, as in vLLM: the reservation that
            # made sure it fits is given back, and admission allocates its chunks (holding
            # blocks while queued could deadlock the FCFS queue ahead of it).
            port.engines[move.dst].release(move.reserved_blocks)
            port.engines[move.dst].add_prefill(PrefillItem(
                move.req_id, row.ctx, PrefillKind.MIGRATE, row.stop_at, row.generated))
            lifecycle.requeued(st, move.dst)
            port.kick(move.dst)
            return
        need = -(-(row.ctx - 1) // port.block_size)
        if need > move.reserved_blocks and not port.reserve(move.dst, need - move.reserved_blocks):
            return self._abort(move, row)
        move.reserved_blocks = max(move.reserved_blocks, need)
        eng.hold(move.req_id, row.blocks, row.ctx)
        move.final = True
        delta = row.ctx - move.round_start_ctx
        if move.mode is MigrationMode.STOP_COPY:
            delta = row.ctx - 1  # every token whose KV exists
        move.flow_id = port.start_flow(move.src, move.dst, port.perf.kv_bytes(max(delta, 1)),
                                      FlowTag(FlowKind.MIGRATION, move.req_id))

    def _abort(self, move: Move, row: DecodeRow) -> None:
        """The target cannot hold the grown context: keep decoding on the source."""
        port = self.port
        del self.moves[move.req_id]
        port.engines[move.dst].release(move.reserved_blocks)
        port.retry_receives(move.dst)
        st = port.states[move.req_id]
        lifecycle.migration_over(st, moved=False)
        self._refuse()
        port.engines[move.src].add_join(DecodeJoin(move.req_id, row.ctx, row.generated, row.stop_at,
                                                  row.blocks, port.now))
        lifecycle.decoding(st, move.src, port.now)
        port.kick(move.src)

    def _complete_live(self, move: Move) -> None:
        port, row = self.port, move.row
        assert row is not None
        port.engines[move.src].release_held(move.req_id)
        need = -(-(row.ctx - 1) // port.block_size)
        port.engines[move.dst].release(move.reserved_blocks - need)
        self._finish_move(move)
        st = port.states[move.req_id]
        port.join(move.dst, st, row.ctx, row.generated, need)
        port.retry_receives(move.src)
        port.kick(move.src)

    def _finish_move(self, move: Move) -> None:
        port = self.port
        del self.moves[move.req_id]
        st = port.states[move.req_id]
        lifecycle.migration_over(st, moved=True)
        port.counters.migrations += 1

    def cancel(self, req_id: int) -> None:
        """The request finished, or lost its KV to a preemption, before its migration
        completed: undo the reservation and stop the copy."""
        move = self.moves.pop(req_id, None)
        if move is None:
            return
        port = self.port
        port.engines[move.dst].release(move.reserved_blocks)
        if move.flow_id is not None:
            # the bytes never sent leave both totals (transfer_bytes is their difference)
            port.counters.migration_bytes -= port.stop_flow(move.flow_id)
        lifecycle.migration_over(port.states[req_id], moved=False)
        port.retry_receives(move.dst)
