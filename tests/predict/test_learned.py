"""The learned predictor at serving time (numpy MLP, hidden-state observations) and the
simulator's replay of its measured error."""

import json

import numpy as np
import pytest

from baton.core import ClusterView, Request, RequestState
from baton.core.errors import ConfigError
from baton.core.events import Completed, HiddenState
from baton.predict import build_estimator
from baton.predict.learned import MLP
from baton.predict.learned_error import LearnedErrorLength


def arrays(d=4):
    """A 2-layer net: relu(x @ w0 + b0) @ w1 + b1, standardised input, scale 100."""
    rng = np.random.default_rng(0)
    return {"w0": rng.standard_normal((d, 3)).astype(np.float32), "b0": np.ones(3, np.float32),
            "w1": rng.standard_normal((3, 1)).astype(np.float32), "b1": np.array([0.5], np.float32),
            "mean": np.full(d, 0.1, np.float32), "std": np.full(d, 2.0, np.float32), "scale": np.array(100.0)}


def test_the_numpy_mlp_is_the_exported_network(tmp_path):
    a = arrays()
    np.savez(tmp_path / "m.npz", **a)
    mlp = MLP(tmp_path / "m.npz")
    x = np.random.default_rng(1).standard_normal((5, 4))
    z = (x - a["mean"]) / a["std"]
    expected = np.maximum(np.maximum(z @ a["w0"] + a["b0"], 0) @ a["w1"] + a["b1"], 0)[:, 0] * 100
    assert mlp.predict(x) == pytest.approx(expected, rel=1e-5)
    assert mlp.params == 4 * 3 + 3 + 3 + 1
    with pytest.raises(ValueError, match="width 3"):
        mlp.predict(np.zeros((1, 3)))


def test_a_file_that_is_not_an_exported_mlp_is_a_config_error(tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros(3))
    with pytest.raises(ConfigError, match="not an exported MLP"):
        MLP(tmp_path / "bad.npz")
    with pytest.raises(ConfigError, match="cannot read"):
        MLP(tmp_path / "missing.npz")


def test_learned_length_predicts_on_each_hidden_state_and_counts_down(tmp_path):
    np.savez(tmp_path / "m.npz", **arrays())
    est = build_estimator("learned", weights=str(tmp_path / "m.npz"), fallback_tokens=7.0)
    view = ClusterView({}, {})
    ids = np.array([1, 2])
    assert est.remaining_batch(view, ids, np.array([0, 0])).tolist() == [7.0, 7.0]  # no prediction yet
    vec = tuple(np.linspace(-1, 1, 4))
    est.observe(view, HiddenState(1, 16, vec, 0.0))
    predicted = float(est.mlp.predict(np.array([vec]))[0])
    assert est.predictions == 1
    # 10 tokens after the prediction point: counted down from it; never below zero
    assert est.remaining_batch(view, ids, np.array([26, 0]))[0] == pytest.approx(max(predicted - 10, 0))
    assert est.remaining_batch(view, ids, np.array([10_000, 0]))[0] == 0.0
    # ARES asks at the last multiple of its own k (here 20, before the prediction at 16+4)
    # and subtracts the tokens since: the countdown must start at the prediction point
    est.observe(view, HiddenState(1, 20, vec, 0.5))
    assert est.remaining_batch(view, ids, np.array([20 - 4, 0]))[0] == pytest.approx(predicted + 4)
    est.observe(view, Completed(1, 40, 1.0))
    assert est.remaining_batch(view, ids, np.array([26, 0]))[0] == 7.0


def error_file(path, abs_q, ratio_q, buckets=((0, 64), (64, 1 << 30))):
    path.write_text(json.dumps({"buckets": [{"lo": lo, "hi": hi, "n": 100, "abs_quantiles": abs_q,
                                             "log_ratio_quantiles": ratio_q} for lo, hi in buckets]}))
    return str(path)


def view_with(req_id, output_tokens):
    return ClusterView({}, {req_id: RequestState(Request(req_id, 0.0, 10, output_tokens))})


def test_learned_error_with_zero_error_is_the_oracle(tmp_path):
    path = error_file(tmp_path / "e.json", [0.0, 0.0], [0.0, 0.0])
    for mode in ("ratio", "absolute"):
        est = LearnedErrorLength(np.random.default_rng(0), errors=path, mode=mode)
        assert est.remaining_batch(view_with(5, 300), np.array([5]), np.array([100])).tolist() == [200.0]


def test_learned_error_draws_once_per_prediction_point_from_the_bucket(tmp_path):
    # bucket 0-63: the prediction is 2x (ln 2) the truth plus one; from 64 on: exact
    path = error_file(tmp_path / "e.json", [0.0, 0.0], [0.0, 0.0])
    data = json.loads(open(path).read())
    data["buckets"][0]["log_ratio_quantiles"] = [float(np.log(2)), float(np.log(2))]
    open(path, "w").write(json.dumps(data))
    est = build_estimator("learned-error", rng=np.random.default_rng(0), errors=path)
    view = view_with(5, 301)
    assert est.remaining_batch(view, np.array([5]), np.array([1]))[0] == pytest.approx(2 * 301 - 1)
    assert est.remaining_batch(view, np.array([5]), np.array([64]))[0] == pytest.approx(301 - 64)


def test_learned_error_draws_are_seeded_and_fixed_until_the_next_point(tmp_path):
    path = error_file(tmp_path / "e.json", list(np.linspace(-50, 50, 101)), list(np.linspace(-1, 1, 101)))
    view = view_with(5, 1000)
    a = LearnedErrorLength(np.random.default_rng(3), errors=path)
    b = LearnedErrorLength(np.random.default_rng(3), errors=path)
    first = a.remaining_batch(view, np.array([5]), np.array([20]))[0]
    assert a.remaining_batch(view, np.array([5]), np.array([20]))[0] == first  # same point: same draw
    assert b.remaining_batch(view, np.array([5]), np.array([20]))[0] == first  # same seed: same draw
    later = [a.remaining_batch(view, np.array([5]), np.array([g]))[0] for g in range(40, 400, 20)]
    assert len(set(np.round(later, 6))) > 5  # each new point draws again


def test_learned_error_files_are_checked(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"buckets": [{"lo": 0, "hi": 0, "abs_quantiles": [0, 0], "log_ratio_quantiles": [0, 0]}]}))
    with pytest.raises(ConfigError, match="malformed"):
        LearnedErrorLength(np.random.default_rng(0), errors=str(bad))
    with pytest.raises(ConfigError, match="mode"):
        LearnedErrorLength(np.random.default_rng(0), errors=str(bad), mode="x")
    with pytest.raises(ConfigError, match="estimator 'learned'"):
        build_estimator("learned")  # no weights given


def test_the_error_file_is_looked_up_in_baton_cache_first(tmp_path, monkeypatch):
    import json

    from baton.predict.learned_error import REPOSITORY_COPY, load_errors
    data = json.loads(REPOSITORY_COPY.read_text())
    data["marker"] = "from the cache"
    (tmp_path / "predictor").mkdir()
    (tmp_path / "predictor" / "error_by_bucket.json").write_text(json.dumps(data))
    monkeypatch.setenv("BATON_CACHE", str(tmp_path))
    assert load_errors(None)["marker"] == "from the cache"
    monkeypatch.setenv("BATON_CACHE", str(tmp_path / "empty"))
    assert "marker" not in load_errors(None)  # nothing cached there: the repository's copy
