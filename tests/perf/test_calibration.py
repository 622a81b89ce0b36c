"""Presets against figures the seed papers publish, within stated tolerances."""

import csv

import numpy as np
import pytest

from baton.perf import BatchShape, PRESETS, batch_shape, build


def test_every_preset_builds_with_room_for_kv():
    for name in PRESETS:
        model = build(name)
        assert model.kv_capacity_tokens > 10_000, name


SIBYL_CONTEXT = 4000  # output-weighted mean decode context of SIBYL's ShareGPT workload


def _eq15_errors(context_tokens):
    model = build("qwen3-32b@h20")
    out = []
    for n in range(8, 49, 4):
        tps = n / model.iteration_time_s(batch_shape([], [context_tokens] * n))
        paper = -0.423 * n * n + 44.766 * n - 7.753
        out.append((tps - paper) / paper)
    return np.array(out)


def test_sibyl_h20_decode_throughput_curve():
    """SIBYL appendix I, Eq. 15: TPS(N) = -0.423 N^2 + 44.766 N - 7.753 for N in 8..48,
    within 10% at the workload's mean decode context."""
    errors = _eq15_errors(SIBYL_CONTEXT)
    assert np.abs(errors).max() <= 0.10, errors


def test_sibyl_h20_context_sensitivity_is_reported_not_fitted():
    """Eq. 15 has no context; the preset reads more KV at longer contexts. These bounds
    only document the direction (faster at 1k, slower at 8k), measured, not fitted."""
    assert _eq15_errors(1000).min() > 0.0
    assert _eq15_errors(8000).max() < 0.0


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


def test_tensor_parallel_pays_vidurs_allreduce():
    """Two all-reduces per layer, each 45 us latency + 20 us launch at TP2 (Vidur's A100)."""
    model = build("llama-2-70b-tp2@a100-80g")
    parts = model.breakdown(batch_shape([], [100]))
    assert parts.allreduce_s == pytest.approx(2 * 80 * (65e-6 + 8192 * 2 / 170e9), rel=1e-9)
    assert build("llama-3.1-8b@a100-80g").breakdown(batch_shape([(512, 0)], [])).allreduce_s == 0


def test_tensor_parallel_without_a_measured_allreduce_is_an_error():
    from baton.core.errors import ConfigError
    from baton.perf.presets import HARDWARE, MODELS
    from baton.perf.roofline import RooflineModel
    with pytest.raises(ConfigError, match="no measured all-reduce latency for tensor parallelism 2"):
        RooflineModel(MODELS["llama-3.1-8b"], HARDWARE["h20"], tp=2)
    with pytest.raises(ConfigError, match=r"tensor parallelism 3 \(known: 2, 4, 8\)"):
        RooflineModel(MODELS["llama-3.1-8b"], HARDWARE["h100"], tp=3)


def test_heterogeneity_is_off_unless_a_source_backs_it():
    """Only CascadeInfer's Llama-3.2-3B/H100 measurement backs a length-mix penalty."""
    from baton.perf.presets import PRESETS
    with_penalty = {name for name, p in PRESETS.items() if p.efficiency.heterogeneity > 0}
    assert with_penalty == {"llama-3.2-3b@h100"}
    model = build("deepseek-r1-distill-qwen-7b-w8a8@rtx4090d")  # ARES Fig. 8: linear in tokens
    mixed = model.iteration_time_s(batch_shape([], [500] * 50 + [3500] * 50))
    even = model.iteration_time_s(batch_shape([], [2000] * 100))
    assert mixed == pytest.approx(even, rel=1e-12)


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


def _sarathi_batches(rng, n):
    """Batches as Vidur's Sarathi scheduler forms them for the fidelity workload (chunk
    512, batch cap 128, prompts of a uniform 256-4,096-token total at prefill:decode 10):
    decode-only, one prefill chunk alone, and a chunk filling the budget beside decodes."""
    out = {"decode": [], "prefill": [], "mixed": []}
    for _ in range(n):
        b = int(rng.integers(1, 129))
        mean = int(rng.integers(256, 4000))
        ctx = [int(c) for c in np.clip(rng.normal(mean, 0.3 * mean, b), 16, 4095)]
        prompt = int(rng.integers(233, 3724))
        done = int(rng.integers(0, prompt // 512 + 1)) * 512
        left = max(prompt - done, 1)
        out["decode"].append(([], ctx))
        out["prefill"].append(([(min(512, left), done)], []))
        b = min(b, 100)
        out["mixed"].append(([(min(512 - b, left), done)], ctx[:b]))
    return out


def test_llama2_70b_tp2_whole_iterations_match_vidur(vidur_dir):
    """Whole iterations (linear ops, attention, all-reduce) against Vidur's prediction
    from the same profiles: median |error| <= 5% for each kind of batch."""
    from baton.perf.vidur_profile import VidurProfile
    vidur = VidurProfile(vidur_dir)
    model = build("llama-2-70b-tp2@a100-80g")
    for kind, batches in _sarathi_batches(np.random.default_rng(7), 150).items():
        errors = np.array([model.iteration_time_s(batch_shape(chunks, ctx))
                           / vidur.iteration(chunks, ctx).total_s - 1 for chunks, ctx in batches])
        assert np.median(np.abs(errors)) <= 0.05, (kind, np.median(np.abs(errors)))
        assert np.abs(errors).max() <= 0.25, (kind, np.abs(errors).max())


def test_vidur_reference_reproduces_vidurs_published_iteration(vidur_dir):
    """The reference itself: one decode at a short context is 80 layers x (0.574 ms of
    linear ops + ~17 us attention + 2 x ~73 us all-reduce) = about 59 ms (Vidur 0.0.26)."""
    from baton.perf.vidur_profile import VidurProfile
    parts = VidurProfile(vidur_dir).iteration([], [1000])
    assert parts.total_s == pytest.approx(59.0e-3, rel=0.03)
    assert 2 * parts.allreduce_ms == pytest.approx(2 * 0.073, rel=0.1)


# --- the terms real kernels have, each against the operator it was fitted to -------------

def test_matmuls_step_just_past_each_128_token_tile(vidur_dir):
    """Vidur's linear-operator profile jumps 29% from 128 to 136 tokens (a new 128-row
    tile); the preset's linear time steps there too, and tracks the profile over 1-4,096
    tokens (median error <= 3%, every point within 12%)."""
    from baton.perf.vidur_profile import VidurProfile
    vidur, model = VidurProfile(vidur_dir), build("llama-2-70b-tp2@a100-80g")
    lin = lambda t: model.breakdown(batch_shape([], [1] * t)).linear_s  # noqa: E731
    step, inside = lin(136) / lin(128), lin(248) / lin(136)
    assert step == pytest.approx(vidur.linear_ms(136) / vidur.linear_ms(128), abs=0.12)
    assert inside == pytest.approx(vidur.linear_ms(248) / vidur.linear_ms(136), abs=0.08)
    errors = np.array([lin(t) / (80 * vidur.linear_ms(t) * 1e-3) - 1 for t in range(1, 4097, 7)])
    assert np.median(np.abs(errors)) <= 0.03 and np.abs(errors).max() <= 0.12


def test_decode_attention_has_a_per_sequence_cost(vidur_dir):
    """Batch 128 at 256-token contexts: Vidur's decode attention (with its 10% batching
    term) costs 1.8x what the KV bytes alone take. The per-sequence term, fitted over
    realistic batches against a 50 ms iteration, puts the whole iteration within 3% there
    (attention alone lands 25% over: the profile's small-batch curves are concave, which
    a per-sequence constant cannot follow everywhere), and batch size, not only summed
    context, moves the time."""
    from baton.perf.vidur_profile import VidurProfile
    vidur, model = VidurProfile(vidur_dir), build("llama-2-70b-tp2@a100-80g")
    whole = model.iteration_time_s(batch_shape([], [256] * 128))
    assert whole == pytest.approx(vidur.iteration([], [256] * 128).total_s, rel=0.03)
    assert model.decode_attn_layer_s(128, 256) == pytest.approx(vidur.decode_attn_ms([256] * 128) * 1e-3, rel=0.3)
    few = model.iteration_time_s(BatchShape(n_decodes=8, decode_ctx_tokens=8 * 4096))
    many = model.iteration_time_s(BatchShape(n_decodes=128, decode_ctx_tokens=8 * 4096))
    assert many - few > 80 * 120 * 0.2e-6


@pytest.mark.parametrize("chunk, offset", [(512, 0), (256, 0), (512, 2048), (128, 1024)])
def test_short_prefill_chunks_cost_what_the_profile_says(vidur_dir, chunk, offset):
    """A 512-token chunk after no context measures 0.072 ms per layer in Vidur's profile,
    over three times its FLOPs at the rate long contexts reach; the preset's per-chunk cost
    and slower causal triangle bring short chunks within 20% of the rows as measured."""
    from baton.perf.vidur_profile import VidurProfile
    vidur, model = VidurProfile(vidur_dir), build("llama-2-70b-tp2@a100-80g")
    measured = 80 * vidur.prefill_attn_ms(chunk, offset) * 1e-3
    got = model.breakdown(batch_shape([(chunk, offset)], [])).prefill_attn_s
    assert got == pytest.approx(measured, rel=0.20)


def test_whole_iterations_are_not_biased_short(vidur_dir):
    """Load amplifies a small per-iteration bias about threefold; against the profile the
    preset's mean signed error per batch kind stays within 2%."""
    from baton.perf.vidur_profile import VidurProfile
    vidur, model = VidurProfile(vidur_dir), build("llama-2-70b-tp2@a100-80g")
    for kind, batches in _sarathi_batches(np.random.default_rng(11), 150).items():
        errors = np.array([model.iteration_time_s(batch_shape(chunks, ctx))
                           / vidur.iteration(chunks, ctx).total_s - 1 for chunks, ctx in batches])
        assert abs(errors.mean()) <= 0.02, (kind, errors.mean())
