"""DeepSeek-V2-Lite on A100: the MoE terms rebuild the model card's parameter counts, and
a decode step reads only the experts its batch touches."""

import pytest

from baton.perf import BatchShape, build
from baton.perf.presets import MODELS


def test_the_architecture_rebuilds_the_model_cards_parameter_counts():
    m = MODELS["deepseek-v2-lite"]
    e, h = m.moe, m.hidden
    routed = e.routed * e.expert_params(h) * e.layers
    shared = e.shared * e.expert_params(h) * e.layers
    dense = 3 * h * m.ffn_hidden  # the first layer's FFN
    q, kv_a, kv_b, o = h * 16 * 192, h * (512 + 64), 512 * 16 * (128 + 128), 16 * 128 * h
    attention = (q + kv_a + kv_b + o) * m.n_layers
    embeddings = 2 * m.vocab * h  # input table and an untied LM head
    assert routed + shared + dense + attention + embeddings == pytest.approx(15.7e9, rel=0.01)
    assert m.matmul_params == pytest.approx(2.4e9, rel=0.03)  # "2.4B activated"
    assert m.kv_bytes_per_token == 27 * 576 * 2  # one MLA latent per layer, bf16


def test_decode_reads_only_the_experts_the_batch_touches():
    m, perf = MODELS["deepseek-v2-lite"], build("deepseek-v2-lite@a100-80g")
    assert m.moe.touched(1) == pytest.approx(6) and 48 < m.moe.touched(16) < 53 and m.moe.touched(400) > 63.9
    assert m.weight_bytes_read(1) < 0.2 * m.weight_bytes < m.weight_bytes_read(16) < m.weight_bytes
    step = [perf.iteration_time_s(BatchShape(n_decodes=n, decode_ctx_tokens=n * 1000)) for n in (1, 4, 16, 64, 256)]
    assert step == sorted(step)
    # batch 1 -> 16 adds most experts (x4.5 time); 16 -> 256 adds almost only KV and compute
    assert step[2] / step[0] > 3 and step[4] / step[2] < 2.5
    # the closed-form advance needs iteration time affine in decode context at fixed batch
    t = [perf.iteration_time_s(BatchShape(n_decodes=16, decode_ctx_tokens=c)) for c in (8000, 16000, 24000)]
    assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-9)
