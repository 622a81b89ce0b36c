"""``vidur:DIR@GPU:tpN``: a performance model read from Vidur-format operator profiles.

Small synthetic profiles (written here) check the reading, the contract the simulator
needs and every bad input; Vidur's real A100 profiles (``../shared/peers/vidur``, skipped
when absent) check that the model reproduces the measurements it was given."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from baton.core.errors import ConfigError
from baton.perf import BatchShape, batch_shape, build
from baton.perf.vidur_profile import FILES, VidurProfile

FIXTURES = Path(__file__).parent / "fixtures"
LINEAR = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act")


def write_profiles(folder: Path, tp: int = 1, config: str = "llama-3.1-8b") -> Path:
    """A tiny profile folder: linear 0.1 ms + 1 us per token per layer, decode attention
    10 us + 5 ns per context token per sequence, prefill 20 us + 1 ns per pair-ish."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / config / "config.json", folder / "config.json")
    head = "num_tokens,num_tensor_parallel_workers," + ",".join(f"time_stats.{op}.median" for op in LINEAR)
    rows = [f"{t},{tp}," + ",".join(f"{(0.1 + 1e-3 * t) / len(LINEAR):.6f}" for _ in LINEAR)
            for t in (1, 8, 64, 128, 256, 512, 1024, 2048)]
    (folder / "mlp.csv").write_text("\n".join([head, *rows]) + "\n")
    head = ("num_tensor_parallel_workers,block_size,prefill_chunk_size,kv_cache_size,batch_size,is_prefill,"
            "time_stats.attn_decode.median,time_stats.attn_prefill.median")
    rows = [f"{tp},16,0,{kv},{b},False,{0.010 + 5e-6 * kv * b:.6f}," for b in (1, 2, 4, 8, 16, 32)
            for kv in (0, 256, 1024, 4096)]
    rows += [f"{tp},16,{c},{kv},1,True,,{0.020 + 1e-6 * c * (kv + c / 2) / 64:.6f}"
             for c in (64, 128, 256, 512, 1024) for kv in (0, 256, 1024, 2048)]
    (folder / "attention.csv").write_text("\n".join([head, *rows]) + "\n")
    return folder


def test_iteration_times_come_from_the_tables(tmp_path):
    perf = build(f"vidur:{write_profiles(tmp_path / 'p')}@a100-80g:tp1")
    layers = perf.spec.n_layers
    one = perf.iteration_time_s(BatchShape(n_decodes=1, decode_ctx_tokens=256))
    assert one == pytest.approx(layers * (0.1 + 1e-3 + 0.010 + 5e-6 * 256) * 1e-3, rel=1e-6)
    chunk = perf.iteration_time_s(batch_shape([(512, 0)], []))
    assert chunk == pytest.approx(layers * (0.1 + 0.512 + 0.020 + 1e-6 * 512 * 256 / 64) * 1e-3, rel=1e-6)
    # past the largest profiled token count, linear time grows in proportion
    big = perf.iteration_time_s(BatchShape(n_decodes=4096, decode_ctx_tokens=4096))
    assert big > perf.iteration_time_s(BatchShape(n_decodes=2048, decode_ctx_tokens=2048)) * 1.5
    assert perf.kv_capacity_tokens > 100_000  # from the GPU's memory, as for every model


def test_affine_in_decode_context_at_a_fixed_batch(tmp_path):
    """The simulator's closed-form advance relies on it, at profiled and other batch sizes."""
    perf = build(f"vidur:{write_profiles(tmp_path / 'p')}@a100-80g:tp1")
    for n in (3, 16, 100):
        t = [perf.iteration_time_s(BatchShape(n_decodes=n, decode_ctx_tokens=n * 900 + n * j)) for j in range(3)]
        assert abs((t[2] - t[1]) - (t[1] - t[0])) < 1e-12 * max(t), n


def test_a_cluster_simulates_on_profiles(tmp_path):
    from baton.sim import ClusterSpec, simulate
    from baton.workload.synthetic import SyntheticSpec, generate
    perf_dir = write_profiles(tmp_path / "p")
    requests = generate(SyntheticSpec(requests=40, rate_rps=4.0), np.random.default_rng(1))
    result = simulate(requests, ClusterSpec(prefill=1, decode=1, preset=f"vidur:{perf_dir}@a100-80g:tp1"), "pd")
    assert sum(r.finished for r in result.records) == 40


@pytest.mark.parametrize("breakage, message", [
    (lambda d: shutil.rmtree(d), "not a folder of Vidur profile CSVs"),
    (lambda d: (d / "config.json").unlink(), "no config.json"),
    (lambda d: (d / "attention.csv").unlink(), "no attention.csv"),
    (lambda d: (d / "attention.csv").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab\n"),
     "a Git LFS pointer"),
    (lambda d: (d / "mlp.csv").write_text("num_tokens,foo\n1,2\n"), "missing column(s) num_tensor_parallel_workers"),
    (lambda d: (d / "mlp.csv").write_text((d / "mlp.csv").read_text().replace(",1,", ",4,")),
     "no rows for tensor parallelism 1 (profiled: 4)"),
    (lambda d: (d / "mlp.csv").write_text((d / "mlp.csv").read_text().replace("0.0202", "fast", 1)),
     "mlp.csv:2: column 'time_stats.attn_pre_proj.median': expected a number, got 'fast00'"),
])
def test_bad_profile_folders_are_one_line_errors(tmp_path, breakage, message):
    folder = write_profiles(tmp_path / "p")
    breakage(folder)
    with pytest.raises(ConfigError) as err:
        build(f"vidur:{folder}@a100-80g:tp1")
    assert message in str(err.value)


def test_tp2_needs_an_all_reduce_profile(tmp_path):
    folder = write_profiles(tmp_path / "p", tp=2)
    with pytest.raises(ConfigError, match="no all_reduce.csv"):
        build(f"vidur:{folder}@a100-80g:tp2")


def test_a_yaml_model_block_takes_a_profile_folder(tmp_path):
    from baton.sim.cluster import model_from_dict
    assert model_from_dict({"profile": "p", "gpu": "a100-80g", "tp": 2}, "cluster.model") == "vidur:p@a100-80g:tp2"
    with pytest.raises(ConfigError, match="exactly one of config"):
        model_from_dict({"profile": "p", "config": "c.json", "gpu": "a100-80g"}, "cluster.model")


def test_vidurs_a100_profiles_reproduce_their_measurements(vidur_dir, tmp_path):
    """Llama-2-70B TP2 from Vidur's own A100 CSVs: decode iterations at contexts on the
    profile's grid land within 3% of Vidur's reference, and a prefill chunk reads the
    profile's row at its prior context."""
    folder = tmp_path / "70b"
    folder.mkdir()
    for key, name in (("mlp", "mlp.csv"), ("attention", "attention.csv"), ("all_reduce", "all_reduce.csv")):
        shutil.copyfile(vidur_dir / FILES[key], folder / name)
    shutil.copyfile(FIXTURES / "llama-2-70b" / "config.json", folder / "config.json")
    perf, vidur = build(f"vidur:{folder}@a100-80g:tp2"), VidurProfile(vidur_dir)
    for b, ctx in ((8, 1024), (32, 2048), (128, 512), (64, 3840)):  # tokens on Vidur's 8-grid
        got = perf.iteration_time_s(batch_shape([], [ctx] * b))
        assert got == pytest.approx(vidur.iteration([], [ctx] * b).total_s, rel=0.03), (b, ctx)
    parts = vidur.iteration([(512, 1024)], [])
    expected = parts.total_s + 80 * (vidur.prefill_attn_ms(512, 1024) - parts.prefill_attn_ms) * 1e-3
    assert perf.iteration_time_s(batch_shape([(512, 1024)], [])) == pytest.approx(expected, rel=0.01)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 80
