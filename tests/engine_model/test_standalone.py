"""One engine on its own (``engine_model.standalone``) on a virtual clock: what each
iteration emits, held prefill-only KV, aborts (deferred to the iteration's end while the
request runs), recompute after preemption; blocks conserved throughout."""

import pytest

from baton.core.instance import InstanceState, Role
from baton.engine_model.engine import Engine
from baton.engine_model.standalone import Emission, Standalone, Step
from baton.engine_model.work import EngineConfig
from tests.sim.helpers import tiny_perf


def engine(kv_blocks=100, max_num_seqs=8, batched=512):
    state = InstanceState(0, Role.MIXED, kv_blocks, 16)
    config = EngineConfig(batched, max_num_seqs, 16, kv_tokens=kv_blocks * 16, enable_prefix_caching=False)
    return Standalone(Engine(state, config, tiny_perf(), closed_form=False))


def step(model, now=0.0):
    """Plan and finish one iteration; (its end time, its emissions)."""
    end = model.plan(now)
    assert end is not None
    return end, model.finish(end)


def run_to_idle(model, now=0.0, limit=10_000):
    out = []
    for _ in range(limit):
        end = model.plan(now)
        if end is None:
            return out
        out += model.finish(end)
        now = end
    raise AssertionError("never idle")


def test_a_request_prefills_then_decodes_here_one_token_per_iteration():
    model = engine()
    model.submit(1, 100, 3)
    _, first = step(model)
    assert first == [Emission(1, Step.TOKEN)]  # the prefill's iteration samples the first token
    rest = run_to_idle(model)
    assert rest == [Emission(1, Step.TOKEN), Emission(1, Step.TOKEN), Emission(1, Step.DONE)]
    assert model.engine.state.kv_blocks_used == 0


def test_a_prefill_only_leg_holds_its_prompts_blocks_until_released():
    model = engine()
    model.submit(1, 64, 50, prefill_only=True)
    assert run_to_idle(model) == [Emission(1, Step.TOKEN), Emission(1, Step.HELD)]
    assert model.engine.state.kv_blocks_used == 4  # 64 tokens: the sampled token has no KV yet
    assert model.release_held(1) and not model.release_held(1)
    assert model.engine.state.kv_blocks_used == 0


def test_kv_from_elsewhere_decodes_from_its_first_token():
    model = engine()
    assert model.engine.reserve(0.0, 7)
    model.join(1, 100, 2, 7)
    assert run_to_idle(model) == [Emission(1, Step.TOKEN), Emission(1, Step.TOKEN), Emission(1, Step.DONE)]
    assert model.engine.state.kv_blocks_used == 0 and model.engine.state.incoming_tokens == 0


@pytest.mark.parametrize("where", ["waiting", "running", "held"])
def test_an_abort_frees_everything_and_emits_nothing_more(where):
    model = engine(max_num_seqs=1)
    model.submit(1, 64, 1000, prefill_only=(where == "held"))
    model.submit(2, 64, 1000)  # waits behind 1 (one sequence at a time)
    end, _ = step(model)
    victim = 2 if where == "waiting" else 1
    if where == "running":
        model.plan(end)  # 1 is in the running iteration: its abort waits for the iteration's end
        model.abort(victim)
        assert model.engine.state.kv_blocks_used > 0
        emitted = model.finish(model.engine.state.segment.start_s + 1.0)
        assert all(e.req_id != victim for e in emitted)
    else:
        model.abort(victim)
    survivor = 1 if victim == 2 else 2
    model.abort(survivor)
    run_to_idle(model, end)
    assert model.engine.state.kv_blocks_used == 0 and not model.engine.prefills and model.engine.state.decodes.n == 0
    assert not model.engine.held_blocks and not model.engine.aborting


def test_a_preempted_decode_recomputes_and_goes_on_with_every_token_once():
    model = engine(kv_blocks=12, batched=256)
    for rid in (1, 2):
        model.submit(rid, 60, 60)  # 2 x 8 blocks at the end do not fit in 12
    emitted = run_to_idle(model)
    assert model.engine.preemptions > 0
    for rid in (1, 2):
        assert [e.step for e in emitted if e.req_id == rid] == [Step.TOKEN] * 60 + [Step.DONE]
    assert model.engine.state.kv_blocks_used == 0


def test_the_standalone_engine_needs_one_iteration_segments():
    state = InstanceState(0, Role.MIXED, 10, 16)
    with pytest.raises(ValueError):
        Standalone(Engine(state, EngineConfig(), tiny_perf(), closed_form=True))
