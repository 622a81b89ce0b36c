"""KV capacity from engine flags, as vLLM sizes it, against the papers' setups."""

import pytest

from baton.core.errors import ConfigError
from baton.perf import build
from baton.perf.memory import MemoryFlags, activation_peak_bytes, kv_capacity_tokens
from baton.perf.presets import HARDWARE, MODELS, MiB
from baton.sim.cluster import cluster_from_dict

SIBYL_DECODE = MemoryFlags(gpu_memory_utilization=0.8, max_num_batched_tokens=32768,
                           max_num_seqs=256, block_size=16, kv_buffer_bytes=8e9)
VIDUR = MemoryFlags(gpu_memory_utilization=0.9, max_num_batched_tokens=512, max_num_seqs=128,
                    block_size=16)


def test_sibyl_decode_flags_follow_vllms_formula():
    """Qwen3-32B on one 141 GB H20 with SIBYL's decode flags (utilisation 0.8, 8 GB
    P2pNccl buffer, 32,768 batched tokens): memory x 0.8 - weights - activation peak -
    buffer, in 256 KiB tokens, rounded to 16-token blocks."""
    model = MODELS["qwen3-32b"]
    act = 32768 * (2 * 5120 + 3 * 25600) * 2 + 256 * 151936 * 4
    free = 143771 * MiB * 0.8 - act - 32.8e9 * 2 - 8e9
    expected = int(free // (262144 * 16)) * 16
    got = build("qwen3-32b@h20").kv_tokens_for(SIBYL_DECODE)
    assert got == expected
    assert 150_000 < got < 160_000
    assert activation_peak_bytes(model, 1, 32768, 256) == pytest.approx(act)


def test_vidur_setting_differs_only_by_what_vidur_leaves_out():
    """Vidur 0.0.26 reports 53,248 tokens (54,067 before it rounds down to whole
    4,096-token requests). It counts only the 80 layers' weights (no embedding, no LM
    head) and no activation memory; vLLM counts both. Adding those back to Baton's
    capacity must give Vidur's figure."""
    model = build("llama-2-70b-tp2@a100-80g")
    tokens = model.kv_tokens_for(VIDUR)
    embed_and_head = 2 * 32000 * 8192 * 2
    act = 2 * activation_peak_bytes(MODELS["llama-2-70b"], 2, 512, 128)
    per_token = MODELS["llama-2-70b"].kv_bytes_per_token
    vidur_view = tokens + (embed_and_head + act) / per_token
    assert vidur_view == pytest.approx(54_067, rel=0.01)
    assert tokens == pytest.approx(53_248, rel=0.06)  # 5.4% below: the two terms above


def test_kv_tokens_overrides_and_flags_are_checked():
    model = build("llama-3.1-8b@a100-80g")
    assert model.kv_tokens_for(MemoryFlags(kv_tokens=12_345)) == 12_345
    assert model.kv_tokens_for(MemoryFlags(gpu_memory_utilization=0.5)) < model.kv_capacity_tokens
    assert model.kv_tokens_for(MemoryFlags(block_size=32)) % 32 == 0
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        kv_capacity_tokens(MODELS["llama-3.1-8b"], HARDWARE["a100-80g"], 1,
                           MemoryFlags(gpu_memory_utilization=1.5))
    with pytest.raises(ConfigError, match="no room for a KV cache"):
        kv_capacity_tokens(MODELS["qwen3-32b"], HARDWARE["rtx4090d"], 1, MemoryFlags())


def test_cluster_engine_applies_to_all_roles_and_roles_override_it():
    spec = cluster_from_dict({
        "prefill": 1, "decode": 2, "preset": "qwen3-32b@h20",
        "engine": {"gpu_memory_utilization": 0.8, "max_num_batched_tokens": 32768},
        "prefill_engine": {"max_num_seqs": 1, "gpu_memory_utilization": 0.9},
        "decode_engine": {"kv_buffer_bytes": 8e9},
    })
    from baton.core.instance import Role
    pre, dec, mixed = (spec.engine_for(r) for r in (Role.PREFILL, Role.DECODE, Role.MIXED))
    assert (pre.max_num_seqs, pre.gpu_memory_utilization, pre.max_num_batched_tokens) == (1, 0.9, 32768)
    assert (dec.max_num_seqs, dec.gpu_memory_utilization, dec.kv_buffer_bytes) == (256, 0.8, 8e9)
    assert mixed.kv_buffer_bytes == 0.0
    from baton.policies import PolicyContext, build_scheduler
    from baton.sim import Simulator
    import numpy as np
    perf = build("qwen3-32b@h20")
    sim = Simulator(spec, perf, build_scheduler("round-robin", PolicyContext(np.random.default_rng(0), perf)), [])
    assert sim.instances[1].kv_blocks_total * 16 == perf.kv_tokens_for(SIBYL_DECODE)
    assert sim.instances[0].kv_blocks_total > sim.instances[1].kv_blocks_total


@pytest.mark.parametrize("engine, message", [
    ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"kv_tokens": "lots"}, "kv_tokens"),
    ({"max_model_lenn": 4096}, "max_model_lenn"),
])
def test_bad_engine_flags_name_the_key(engine, message):
    with pytest.raises(ConfigError, match=message):
        cluster_from_dict({"decode_engine": engine})


def test_block_sizes_must_agree():
    with pytest.raises(ConfigError, match="same block_size"):
        cluster_from_dict({"prefill_engine": {"block_size": 32}})


def test_max_model_len_rejects_with_reason_context():
    from baton.core.request import Request
    from baton.sim import ClusterSpec, EngineConfig
    from tests.sim.helpers import run
    cluster = ClusterSpec(prefill=1, decode=1, engine=EngineConfig(512, 32, 16, max_model_len=1000))
    _, res = run([Request(0, 0.0, 900, 50), Request(1, 0.0, 900, 200)], cluster=cluster)
    assert [(r.finished, r.reject_reason) for r in res.records] == [(True, ""), (False, "context")]
