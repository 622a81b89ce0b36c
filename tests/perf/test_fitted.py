import numpy as np
import pytest

from baton.core.errors import ConfigError
from baton.perf import BatchShape, build
from baton.perf.fitted import FittedModel


def test_fit_recovers_a_profiled_model(tmp_path):
    """Profile the roofline preset at random shapes with 2% noise, fit, predict held-out shapes."""
    truth = build("llama-3.1-8b@h100")
    rng = np.random.default_rng(0)
    rows = ["prefill_tokens,decode_requests,decode_ctx_tokens,prefill_attn_pairs,iteration_s"]
    shapes = []
    for _ in range(400):
        n, p = int(rng.integers(1, 200)), int(rng.choice([0, 0, 256, 1024]))
        s = BatchShape(prefill_tokens=p, prefill_attn_pairs=p * (p + 1) / 2, n_decodes=n,
                       decode_ctx_tokens=n * int(rng.integers(100, 4000)))
        shapes.append(s)
        t = truth.iteration_time_s(s) * (1 + 0.02 * rng.standard_normal())
        rows.append(f"{s.prefill_tokens},{s.n_decodes},{s.decode_ctx_tokens},{s.prefill_attn_pairs},{t}")
    f = tmp_path / "profile.csv"
    f.write_text("\n".join(rows) + "\n")
    fitted = FittedModel.from_csv(f, truth.kv_bytes_per_token, truth.kv_capacity_tokens)
    errors = [abs(fitted.iteration_time_s(s) - truth.iteration_time_s(s)) / truth.iteration_time_s(s)
              for s in shapes[:100]]
    assert np.median(errors) < 0.10
    assert (fitted.coef >= 0).all()


def test_bad_profile_rows_name_line(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text("prefill_tokens,decode_requests,decode_ctx_tokens,iteration_s\n1,2,3,0.01\n1,2,x,0.01\n")
    with pytest.raises(ConfigError, match=r"p.csv:3: column 'decode_ctx_tokens'"):
        FittedModel.from_csv(f, 1, 1)
    f.write_text("prefill_tokens,iteration_s\n1,0.1\n")
    with pytest.raises(ConfigError, match="missing column"):
        FittedModel.from_csv(f, 1, 1)


def test_fit_follows_the_tile_step_of_a_profiled_engine():
    """An A100 profile steps up just past 128 tokens (whole 128-row matmul tiles); the fit's
    derived tile-padding feature follows the step, so 136 tokens costs more than 128."""
    from baton.perf.model import prefill_shape
    truth = build("llama-2-70b-tp2@a100-80g")
    prompts = [16, 32, 64, 100, 128, 136, 192, 256, 300, 384, 512, 640, 768, 1024, 1536, 2048]
    shapes = [prefill_shape(p) for p in prompts] + [BatchShape(0, 0, n, n * 1000) for n in (1, 8, 32, 64, 128)]
    cols = {"prefill_tokens": np.array([s.prefill_tokens for s in shapes], float),
            "prefill_attn_pairs": np.array([s.prefill_attn_pairs for s in shapes]),
            "decode_requests": np.array([s.n_decodes for s in shapes], float),
            "decode_ctx_tokens": np.array([s.decode_ctx_tokens for s in shapes], float),
            "iteration_s": np.array([truth.iteration_time_s(s) for s in shapes])}
    fitted = FittedModel.fit(cols, truth.kv_bytes_per_token, truth.kv_capacity_tokens)
    step_truth = truth.iteration_time_s(prefill_shape(136)) / truth.iteration_time_s(prefill_shape(128))
    step_fit = fitted.iteration_time_s(prefill_shape(136)) / fitted.iteration_time_s(prefill_shape(128))
    assert step_truth > 1.15 and step_fit == pytest.approx(step_truth, rel=0.08)
    errors = [abs(fitted.iteration_time_s(s) - t) / t for s, t in zip(shapes, cols["iteration_s"])]
    assert np.mean(errors) < 0.05
