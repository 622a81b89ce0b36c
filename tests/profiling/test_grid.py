"""The profile-to-fit path on a synthetic profile: rows on baton profile's grid, timed by a
known model, written as baton profile writes them, then used as a preset."""

import json

import numpy as np
import pytest

from baton.core.errors import ConfigError
from baton.core.request import Request
from baton.perf import BatchShape, build
from baton.perf.fitted import FittedModel
from baton.profiling.fit import fit_errors
from baton.profiling.grid import EngineFacts, ProfileGrid, ProfileRow, write_profile
from baton.sim import ClusterSpec, EngineConfig
from baton.sim.runner import simulate

TRUTH = "llama-3.1-8b@a100-80g"


def synthetic_rows(noise: float, seed: int = 0) -> list[ProfileRow]:
    """Every row kind the live profiler writes, on its default grid, timed by the preset."""
    truth, rng, grid = build(TRUTH), np.random.default_rng(seed), ProfileGrid()
    rows = []

    def timed(row: ProfileRow) -> ProfileRow:
        shape = BatchShape(row.prefill_tokens, row.prefill_attn_pairs, row.decode_requests, row.decode_ctx_tokens)
        t = truth.iteration_time_s(shape) * (1 + noise * rng.standard_normal())
        return ProfileRow(row.kind, row.prefill_tokens, row.prefill_attn_pairs, row.decode_requests,
                          row.decode_ctx_tokens, t, "engine")
    for p in grid.prefill_prompts():
        rows.append(timed(ProfileRow.prefill(p, 0.0, "engine")))
    for b, c in grid.decode_points(4096):
        rows.append(timed(ProfileRow("decode", 0, 0.0, b, b * (c + 20), 0.0, "client")))
        if b in grid.mixed_batches:
            rows += [timed(ProfileRow.prefill(p, 0.0, "engine", b, b * (c + 40))) for p in grid.mixed_prompt_tokens]
    return rows


def write(tmp_path, rows, **facts):
    truth = build(TRUTH)
    base = dict(url="http://x", model="m", max_model_len=4096, block_size=16,
                kv_capacity_tokens=truth.kv_capacity_tokens, kv_bytes_per_token=truth.kv_bytes_per_token,
                engine_timing=True)
    path = tmp_path / "profile.csv"
    write_profile(path, rows, EngineFacts(**{**base, **facts}), {})
    return path


def test_a_written_profile_is_a_preset_that_predicts_the_profiled_engine(tmp_path):
    path = write(tmp_path, synthetic_rows(noise=0.02))
    fitted, truth = build(str(path)), build(TRUTH)
    assert isinstance(fitted, FittedModel)
    assert fitted.kv_capacity_tokens == truth.kv_capacity_tokens and fitted.max_model_len == 4096
    # held-out shapes: mixed batches the grid never measured
    for p, n, ctx in [(300, 8, 900), (700, 24, 300), (64, 2, 1500), (0, 12, 700)]:
        shape = BatchShape(p, p * (p + 1) / 2, n, n * ctx)
        assert fitted.iteration_time_s(shape) == pytest.approx(truth.iteration_time_s(shape), rel=0.12)
    # the preset is a roofline (compute/memory corner) that a linear fit follows to ~5%
    assert all(e["mape"] < 0.08 for e in fit_errors(synthetic_rows(0.0, 1), fitted).values())


def test_simulating_with_the_profile_matches_simulating_the_engine(tmp_path):
    path = write(tmp_path, synthetic_rows(noise=0.01))
    rng = np.random.default_rng(3)
    reqs = [Request(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(0.25, 200)), rng.integers(32, 1024, 200), rng.integers(8, 128, 200)))]
    engine = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=64)
    out = {}
    for preset in (TRUTH, str(path)):
        cluster = ClusterSpec(prefill=0, decode=0, mixed=1, preset=preset, engine=engine)
        res = simulate(reqs, cluster, "colocated-rr")
        assert len(res.records) == len(reqs)
        out[preset] = {r.req_id: r for r in res.records}
    e2e_err = [abs(out[str(path)][i].e2e_s - out[TRUTH][i].e2e_s) / out[TRUTH][i].e2e_s for i in out[TRUTH]]
    assert np.mean(e2e_err) < 0.08


def test_a_profile_without_its_facts_says_what_is_missing(tmp_path):
    path = write(tmp_path, synthetic_rows(0.0))
    side = path.with_suffix(".json")
    facts = json.loads(side.read_text())
    side.write_text(json.dumps({**facts, "kv_capacity_tokens": None}))
    with pytest.raises(ConfigError, match="kv_capacity_tokens: expected a positive integer"):
        build(str(path))
    side.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        build(str(path))
    side.unlink()
    with pytest.raises(ConfigError, match="no profile.json beside it"):
        build(str(path))


def test_grid_skips_rows_that_would_not_be_one_iteration():
    grid = ProfileGrid(prompt_tokens=(64, 512, 4096), max_num_batched_tokens=512, max_num_seqs=8,
                       batch_sizes=(1, 8, 16), contexts=(128, 2000))
    assert grid.prefill_prompts() == [64, 512]
    assert grid.decode_points(2048) == [(1, 128)]  # batch 8 leaves no room for the mixed prompt
