"""Splits, baselines and evaluation of remaining-length predictors (torch-free parts)."""

import numpy as np
import pytest

from baton.learn import baselines, evaluate
from baton.learn.train import split_requests, widths_for


def test_the_split_is_by_request_in_70_15_15():
    requests = np.repeat([f"r{i}" for i in range(200)], 5)
    masks = split_requests(requests, seed=0)
    assert not (masks["train"] & masks["val"]).any() and not (masks["val"] & masks["test"]).any()
    assert (masks["train"] | masks["val"] | masks["test"]).all()
    for name, share in (("train", 0.7), ("val", 0.15), ("test", 0.15)):
        ids = set(requests[masks[name]])
        assert len(ids) == round(share * 200)
        assert all(set(requests[requests == r]) <= ids for r in ids)  # whole requests only


def test_the_paper_widths_scale_with_the_model_width():
    assert widths_for(3584) == [2048, 512, 64] and widths_for(576) == [329, 82, 10]


def test_the_survival_baseline_is_the_conditional_mean_of_training_lengths():
    finals = np.array([16.0, 48.0, 80.0, 112.0])
    table = baselines.survival_baseline(finals)
    # at g = 0 every request is alive: the mean length; at g = 64 two remain (80, 112)
    assert table.expected_remaining(0.0) == pytest.approx(finals.mean(), abs=1.0)
    assert table.expected_remaining(64.0) == pytest.approx(np.mean([16, 48]), abs=1.0)


def test_the_prompt_only_ridge_finds_a_length_signal_in_the_prompt_tokens():
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 5000, 20)) + ([7] if i % 2 else [9]) * 5 for i in range(400)]
    y = np.array([300.0 if i % 2 else 30.0 for i in range(400)])
    x = baselines.prompt_features(prompts, np.zeros(400))
    model = baselines.prompt_only_baseline(x[:300], y[:300], x[300:], y[300:])
    assert evaluate.mae(model.predict(x[300:]), y[300:]) < 0.2 * evaluate.mae(np.full(100, y.mean()), y[300:])


def test_bootstrap_intervals_resample_requests_and_bracket_the_mae():
    rng = np.random.default_rng(0)
    requests = np.repeat(np.arange(50), 4)
    truth = rng.uniform(0, 100, 200)
    pred = truth + rng.normal(0, 10, 200)
    lo, hi = evaluate.bootstrap_ci(pred, truth, requests)
    assert lo < evaluate.mae(pred, truth) < hi and hi - lo < 5


def test_buckets_and_the_error_file_follow_generated_tokens():
    generated = np.array([0, 0, 16, 16, 80, 80] * 10)
    truth = np.full(60, 100.0)
    pred = truth * 2
    rows = evaluate.by_bucket({"m": pred}, truth, generated)
    assert [r["generated"] for r in rows] == ["0-0", "1-63", "64-127"] and rows[0]["m_mae"] == 100.0
    errors = evaluate.error_file(pred, truth, generated, {"every_tokens": 16})
    first = errors["buckets"][0]
    assert first["lo"] == 0 and first["abs_quantiles"][50] == 100.0
    assert first["log_ratio_quantiles"][50] == pytest.approx(np.log(201 / 101), abs=1e-4)
    assert all(len(b["abs_quantiles"]) == 101 for b in errors["buckets"])


def test_within_request_slopes_tell_shrinking_predictions_from_flat_ones():
    requests = np.repeat(["a", "b"], 4)
    generated = np.tile([0, 16, 32, 48], 2)
    truth = np.array([100, 84, 68, 52, 60, 44, 28, 12], dtype=float)
    out = evaluate.within_request(truth.copy(), truth, generated, requests)
    assert out["median_slope"] == pytest.approx(-1.0) and out["shrinking_share"] == 1.0
    flat = evaluate.within_request(np.full(8, 70.0), truth, generated, requests)
    assert flat["median_slope"] == pytest.approx(0.0, abs=1e-9) and flat["shrinking_share"] == 0.0


def test_the_split_mae_separates_samples_below_and_from_the_mark():
    truth = np.array([10.0, 10.0, 100.0, 100.0])
    generated = np.array([0, 511, 512, 900])
    preds = {"a": np.array([12.0, 8.0, 130.0, 70.0])}
    assert evaluate.mae_split(preds, truth, generated, 512) == {"a": [2.0, 30.0]}
    assert np.isnan(evaluate.mae_split(preds, truth, generated, 0)["a"][0])  # no sample below
