"""The roofline model's iteration time (perf/roofline.py)."""

import numpy as np
import pytest

from baton.perf import BatchShape
from baton.perf.presets import build


@pytest.mark.parametrize("preset", ["llama-3.1-8b@a100-80g", "llama-2-70b-tp2@a100-80g"])
def test_iteration_time_is_the_breakdowns_total_before_and_after_the_token_terms_are_kept(preset):
    """The fast total (token-count terms kept per count) equals the breakdown's sum to the
    last bit, on first use and when the same counts come back with other shapes."""
    perf = build(preset)
    rng = np.random.default_rng(0)
    shapes = []
    for _ in range(300):
        n, prefill = int(rng.integers(0, 64)), int(rng.choice([0, 0, int(rng.integers(1, 2048))]))
        shapes.append(BatchShape(prefill_tokens=prefill, prefill_attn_pairs=prefill * (prefill + 1) / 2.0,
                                 n_decodes=n, decode_ctx_tokens=n * int(rng.integers(1, 8000)),
                                 decode_ctx_cv2=float(rng.uniform(0, 2)), prefill_chunks=int(prefill > 0),
                                 prefill_diag_pairs=prefill * (prefill + 1) / 2.0))
    for _ in range(2):
        for shape in shapes:
            assert perf.iteration_time_s(shape) == perf.breakdown(shape).total_s
    assert perf.iteration_time_s(BatchShape()) == 0.0
