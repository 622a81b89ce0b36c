"""vLLM v1 semantics under memory pressure, and stop-and-copy migration."""

import pytest

from baton.core.instance import InstanceState, Role
from baton.core.request import Request
from baton.perf import batch_shape
from baton.sim import ClusterSpec, EngineConfig, Simulator
from baton.engine_model.engine import DecodeJoin, Engine
from tests.sim.helpers import run, tiny_perf
from tests.sim.test_handoff import Mover, sched


def _engine(blocks: int, max_batched: int = 32, full: bool = True) -> Engine:
    state = InstanceState(0, Role.DECODE, blocks, 16)
    cfg = EngineConfig(max_batched, 8, 16, reserve_full_sequence=full)
    return Engine(state, cfg, tiny_perf(blocks * 16))


def _pressure(full: bool = True) -> Engine:
    """Two decodes on 8 blocks: A (33 tokens, 2 blocks, two tokens from its end) then B
    (81 tokens, 5 blocks). Their next tokens need 2 more blocks but only 1 is free, so B
    (admitted last) is preempted."""
    eng = _engine(8, full=full)
    eng.state.kv_blocks_used = 7
    eng.add_join(DecodeJoin(1, 33, 10, 12, 2, 0.0))
    eng.add_join(DecodeJoin(2, 81, 10, 500, 5, 0.0))
    eng.end_s = eng.plan(0.0)
    return eng


def _next(eng: Engine) -> None:
    """Finish the running iteration and plan the next one."""
    eng.preempted.clear()
    eng.finish(eng.end_s)
    eng.end_s = eng.plan(eng.end_s)


def test_preempted_request_goes_to_the_queue_head_and_admits_nothing_that_iteration():
    eng = _pressure()
    assert eng.preempted == [2] and eng.state.decodes.req_ids() == [1]
    assert list(eng.prefills) == [2] and not eng.prefills[2].admitted
    assert eng.state.kv_blocks_used == 3  # A's 3 blocks; B's were freed
    assert not eng.chunks  # vLLM schedules no waiting request in a step that preempted


def test_arriving_kv_cannot_take_blocks_ahead_of_a_preempted_request():
    eng = _pressure()
    assert eng.state.kv_blocks_free_at(0.0) >= 1
    while 2 in eng.prefills and not eng.prefills[2].admitted:
        assert not eng.reserve(eng.end_s, 1)  # blocks are free, but B waits ahead of any arrival
        _next(eng)
    assert eng.prefills[2].admitted
    assert eng.reserve(eng.end_s, 1)  # B is running again: nothing waits ahead


def _segment_chunks(eng: Engine) -> list[int]:
    """The chunk of each iteration of the running segment (several when a prefill's
    iterations are planned as one segment)."""
    if eng.run is None:
        return [eng.chunks[0][1]]
    return [step[0][1] for step in eng.run.chunks[:eng.state.segment.max_iters]]


def _recompute_chunks(eng: Engine) -> list[int]:
    chunks = _segment_chunks(eng)
    while True:
        _next(eng)
        if 2 not in eng.prefills:
            return chunks
        chunks += _segment_chunks(eng)


def test_readmission_waits_for_room_for_the_whole_context_then_recomputes_in_chunks():
    """vLLM's default (scheduler_reserve_full_isl): B's whole context (81 tokens, 6 blocks)
    does not fit in the 5 free blocks, so B waits; once A finishes it is admitted with the
    blocks for its first chunk only and recomputed chunk by chunk."""
    eng = _pressure()
    _next(eng)
    assert not eng.prefills[2].admitted and eng.state.decodes.req_ids() == [1]
    while not eng.prefills[2].admitted:
        _next(eng)
    item = eng.prefills[2]
    assert eng.state.decodes.n == 0 and item.blocks == 2  # first chunk's blocks, not 81 tokens'
    assert _recompute_chunks(eng) == [32, 32, 17]


def test_without_the_full_sequence_gate_readmission_takes_the_first_chunk_at_once():
    """reserve_full_sequence off (older vLLM): B is admitted on its first chunk although
    its whole context does not fit."""
    eng = _pressure(full=False)
    _next(eng)
    item = eng.prefills[2]
    assert item.admitted and eng.chunks == [(item, 31)]  # 32-token budget minus A's token
    assert item.blocks == 2  # blocks for the first chunk only, not for 81 tokens
    assert _recompute_chunks(eng) == [31, 32, 18]  # A finished, so the budget is 32 after the first


def test_stop_copy_downtime_is_the_full_context_transfer():
    cluster = ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16), nic_gbps=1.0,
                          nic_latency_s=0.0)
    perf, s = sched(lambda c: Mover(c, "stop-copy"))
    sim = Simulator(cluster, perf, s, [Request(0, 0.0, 300, 800)], sample_interval_s=0.5)
    seen = {}
    original_take_out, original_join = sim.migrator._take_out, sim.join

    def take_out(move):
        seen["paused_s"] = sim.now
        original_take_out(move)
        seen["ctx"] = move.row.ctx

    def join(instance_id, st, ctx, generated, blocks):
        if instance_id == 2:
            seen["joined_s"] = sim.now
        original_join(instance_id, st, ctx, generated, blocks)

    sim.migrator._take_out, sim.join = take_out, join
    res = sim.run()
    assert res.records[0].finished and sim.states[0].path == [0, 1, 2]
    transfer_s = perf.kv_bytes(seen["ctx"] - 1) / cluster.nic_bytes_per_s
    assert res.counters.migration_bytes == perf.kv_bytes(seen["ctx"] - 1)  # one copy, no rounds
    iteration_s = perf.iteration_time_s(batch_shape([], [seen["ctx"]]))
    downtime_s = seen["joined_s"] - seen["paused_s"]
    assert abs(downtime_s - transfer_s) <= iteration_s
    assert transfer_s > 10 * iteration_s  # so the check above can tell the modes apart


@pytest.mark.parametrize("mode", ["live", "stop-copy", "recompute"])
def test_every_mode_conserves_blocks(mode):
    perf, s = sched(lambda c: Mover(c, mode))
    sim, res = run([Request(0, 0.0, 300, 800), Request(1, 0.1, 200, 300)],
                   cluster=ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16), nic_gbps=1.0),
                   perf=perf, scheduler=s)
    assert all(r.finished for r in res.records)
    assert all(i.kv_blocks_used == 0 for i in sim.instances.values())
