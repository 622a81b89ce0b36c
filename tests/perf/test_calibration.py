"""Presets against figures the seed papers publish, within stated tolerances."""

import csv

import numpy as np
import pytest

from baton.perf import BatchShape, PRESETS, batch_shape, build


def test_every_preset_builds_with_room_for_kv():
    for name in PRESETS:
        model = build(name)
        assert model.kv_capacity_tokens > 10_000, name


def test_sibyl_h20_decode_throughput_curve():
    """SIBYL appendix I: TPS(N) = -0.423 N^2 + 44.766 N - 7.753 for N in 8..48.
    Tolerance 15%, at a ShareGPT-like context of 1,500 tokens."""
    model = build("qwen3-32b@h20")
    for n in range(8, 49, 4):
        tps = n / model.iteration_time_s(batch_shape([], [1500] * n))
        paper = -0.423 * n * n + 44.766 * n - 7.753
        assert abs(tps - paper) / paper < 0.15, (n, tps, paper)


def test_ares_4090d_iteration_at_half_kv():
    """ARES 5.3: about 18 ms per decode iteration, 7B W8A8 on RTX 4090D, 50% KV. Tolerance 10%."""
    model = build("deepseek-r1-distill-qwen-7b-w8a8@rtx4090d")
    half = model.kv_capacity_tokens // 2
    for batch in (16, 48, 96):
        t = model.iteration_time_s(batch_shape([], [half // batch] * batch))
        assert abs(t - 18.23e-3) / 18.23e-3 < 0.10, (batch, t)


def test_cascadeinfer_attention_share():
    """CascadeInfer 2.2: attention ~81% of iteration at 250 x 1000 tokens, ~14% for one
    request (Llama-3.2-3B on H100). Tolerance 5 percentage points."""
    model = build("llama-3.2-3b@h100")
    big = model.breakdown(batch_shape([], [1000] * 250))
    one = model.breakdown(batch_shape([], [1000]))
    assert abs(big.attention_s / big.total_s - 0.81) < 0.05
    assert abs(one.attention_s / one.total_s - 0.14) < 0.05


@pytest.mark.parametrize("mix", [
    [500] * 256 + [3500] * 256,                       # bimodal
    list(np.linspace(100, 3900, 512).astype(int)),    # uniform spread
    [1000] * 500 + [26000] * 12,                      # a few long outliers
])
def test_heterogeneous_batch_costs_1_1_to_2_1_times_homogeneous(mix):
    """CascadeInfer Figure 2: same total tokens, mixed lengths cost 1.1-2.1x."""
    model = build("llama-3.2-3b@h100")
    mixed = model.breakdown(batch_shape([], mix))
    homo = model.breakdown(batch_shape([], [sum(mix) // len(mix)] * len(mix)))
    ratio = mixed.total_s / homo.total_s
    assert 1.1 <= ratio <= 2.1, ratio


def test_iteration_time_is_affine_in_decode_context():
    """The simulator's closed-form advance relies on this."""
    for name in PRESETS:
        model = build(name)
        t = [model.iteration_time_s(BatchShape(n_decodes=40, decode_ctx_tokens=40_000 + 40 * j,
                                               decode_ctx_cv2=0.3)) for j in range(3)]
        assert abs((t[2] - t[1]) - (t[1] - t[0])) < 1e-12 * max(t), name


def test_tensor_parallel_pays_allreduce():
    model = build("llama-2-70b-tp2@a100-80g")
    parts = model.breakdown(batch_shape([(512, 0)], []))
    assert parts.allreduce_s > 0
    assert build("llama-3.1-8b@a100-80g").breakdown(batch_shape([(512, 0)], [])).allreduce_s == 0


def test_prefill_time_grows_superlinearly():
    model = build("llama-3.1-8b@h100")
    t1, t8 = model.prefill_time_s(1000), model.prefill_time_s(8000)
    assert t8 > 8 * t1 * 0.9 and t8 > t1


def _median_ratio(pairs):
    ratios = np.array([p / m for m, p in pairs])
    return float(np.median(ratios)), ratios


def test_llama2_70b_tp2_matches_vidur_operator_profiles(vidur_dir):
    """Preset vs Vidur's measured A100 profiles at matching shapes: median within 25%,
    every point within 2x (the analytic model has no kernel-specific effects)."""
    model = build("llama-2-70b-tp2@a100-80g")
    mlp = []
    with open(vidur_dir / "a100_Llama-2-70b-hf_mlp.csv") as f:
        for row in csv.DictReader(f):
            if row["num_tensor_parallel_workers"] == "2":
                ms = sum(float(row[f"time_stats.{k}.median"]) for k in ("mlp_up_proj", "mlp_act", "mlp_down_proj"))
                mlp.append((ms, model.mlp_layer_s(int(row["num_tokens"])) * 1e3))
    attn = []
    with open(vidur_dir / "a100_attention_llama2-70b-tp2_from_commit_acb95f6.csv") as f:
        for row in csv.DictReader(f):
            if row["is_prefill"] == "False" and int(row["kv_cache_size"]) >= 256:
                ms = float(row["time_stats.attn_decode.median"])
                attn.append((ms, model.decode_attn_layer_s(int(row["batch_size"]), int(row["kv_cache_size"])) * 1e3))
    for pairs in (mlp, attn):
        assert len(pairs) > 50
        median, ratios = _median_ratio(pairs)
        assert 0.75 <= median <= 1.33, median
        assert ((ratios > 0.5) & (ratios < 2.0)).mean() > 0.95
