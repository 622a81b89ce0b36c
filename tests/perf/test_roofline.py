"""The roofline model's iteration time (perf/roofline.py)."""

import numpy as np
import pytest

from baton.perf import BatchShape, roofline
from baton.perf.presets import build


def shapes(n: int) -> list[BatchShape]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        decodes, prefill = int(rng.integers(0, 64)), int(rng.choice([0, 0, int(rng.integers(1, 2048))]))
        out.append(BatchShape(prefill_tokens=prefill, prefill_attn_pairs=prefill * (prefill + 1) / 2.0,
                              n_decodes=decodes, decode_ctx_tokens=decodes * int(rng.integers(1, 8000)),
                              decode_ctx_cv2=float(rng.uniform(0, 2)), prefill_chunks=int(prefill > 0),
                              prefill_diag_pairs=prefill * (prefill + 1) / 2.0))
    return out


@pytest.mark.parametrize("preset", ["llama-3.1-8b@a100-80g", "llama-2-70b-tp2@a100-80g"])
def test_iteration_time_with_kept_token_terms_is_the_uncached_breakdowns_total(preset, monkeypatch):
    """The fast total (token-count terms kept per count) equals, to the last bit, the
    breakdown's total of a model that keeps nothing, on first use and when the same counts
    come back with other shapes."""
    batch = shapes(300)
    with monkeypatch.context() as m:
        m.setattr(roofline, "_TOKEN_TERMS_KEPT", 0)
        reference = build(preset)
        want = [reference.breakdown(s).total_s for s in batch]
        assert not reference._by_tokens
    perf = build(preset)
    for _ in range(2):
        assert [perf.iteration_time_s(s) for s in batch] == want
        assert [perf.breakdown(s).total_s for s in batch] == want
    assert perf._by_tokens and perf.iteration_time_s(BatchShape()) == 0.0


@pytest.mark.parametrize("preset", ["llama-3.1-8b@a100-80g", "llama-2-70b-tp2@a100-80g", "deepseek-v2-lite@a100-80g",
                                    "qwen3-32b@h20", "llama-3.1-8b-tp8@h100"])
def test_the_chunk_time_function_is_the_iteration_time_of_the_chunks_shape(preset):
    """A chunk search's function of x gives, to the last bit, the iteration time of the shape
    ``prefill_shape`` builds (the decode part and the constants folded once): at x = 0, at
    offsets inside and past the prompt, beside no decodes and many."""
    from baton.perf.model import PerfModel, prefill_shape
    perf = build(preset)
    rng = np.random.default_rng(1)
    for decodes, ctx, prompt in [(0, 0, 0), (0, 0, 5000), (7, 9000, 0), (64, 300_000, 3000), (200, 10, 100)]:
        fast, generic = perf.chunk_time_fn(decodes, ctx, prompt), PerfModel.chunk_time_fn(perf, decodes, ctx, prompt)
        for x in [0, 1, 31, 32, 2047, 2048, 4999, 5000, 5001, *rng.integers(0, 8192, 40).tolist()]:
            want = perf.iteration_time_s(prefill_shape(x, max(0, prompt - x), decodes, ctx))
            assert fast(x) == want == generic(x), (decodes, ctx, prompt, x)
