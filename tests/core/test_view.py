

def test_queued_prefill_moments_track_queue_progress_and_drops():
    from baton.core import ClusterView, InstanceState, Role
    inst = InstanceState(0, Role.PREFILL, kv_blocks_total=100, block_size_tokens=16)
    view = ClusterView({0: inst}, {})
    inst.queue_prefill(1, 300)
    inst.queue_prefill(2, 50)
    inst.progress_prefill(1, 120)
    assert view.queued_prefill_moments(0) == (2, 230, 180 ** 2 + 50 ** 2)
    inst.drop_prefill(2)
    inst.progress_prefill(1, 180)
    inst.drop_prefill(1)
    assert view.queued_prefill_moments(0) == (0, 0, 0) and view.queued_prefills(0) == []
