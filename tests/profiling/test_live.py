"""``baton profile`` against a real emulator process on 127.0.0.1: the profile it writes
fits the emulator's own perf model, and a dead engine is a clean error."""

import subprocess
import sys

import pytest

from baton.perf import BatchShape, build
from baton.perf.fitted import FittedModel
from tests.live import free_port, servers, start_emulator


def test_profile_of_an_emulator_recovers_its_perf_model(tmp_path):
    emu = start_emulator(tmp_path, "--max-model-len", "4096", "--kv-tokens", "200000")
    out = tmp_path / "p.csv"
    with servers(emu):
        run = subprocess.run([sys.executable, "-m", "baton.cli.main", "profile", "--engine", emu.url,
                              "--quick", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "fit on decode rows" in run.stdout and "fit on mixed rows" in run.stdout
    kinds = [line.split(",")[0] for line in out.read_text().splitlines()[1:]]
    assert {"prefill", "decode", "mixed"} <= set(kinds)
    # the prefill over cached context: 128 computed tokens after the 512 the emulator had cached
    cached = [line.split(",") for line in out.read_text().splitlines()[1:] if line.startswith("prefill,128,")]
    assert [float(r[2]) for r in cached] == [128 * 512 + 128 * 129 / 2]
    fitted, truth = FittedModel.from_profile(out), build("llama-3.1-8b@a100-80g")
    assert fitted.kv_capacity_tokens == 200_000 // 16 * 16
    assert fitted.kv_bytes_per_token == truth.kv_bytes_per_token and fitted.max_model_len == 4096
    # iteration times the emulator's preset gives (the emulator sleeps them in real time,
    # so allow for scheduling noise on a busy 2-core machine)
    for p, n, ctx in [(512, 0, 0), (0, 8, 300), (256, 4, 300)]:
        shape = BatchShape(p, p * (p + 1) / 2, n, n * ctx)
        assert fitted.iteration_time_s(shape) == pytest.approx(truth.iteration_time_s(shape), rel=0.25)


def test_profile_of_a_dead_engine_is_a_clean_error(tmp_path):
    run = subprocess.run([sys.executable, "-m", "baton.cli.main", "profile", "--engine",
                          f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "p.csv")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "cannot read the served models" in run.stderr


def test_profile_kind_qoe_writes_the_fitted_model(tmp_path):
    import json
    out = tmp_path / "qoe.json"
    run = subprocess.run([sys.executable, "-m", "baton.cli.main", "profile", "--kind", "qoe", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())
    assert set(figures["coefficients"]) == {"const", "batch", "sum_prompt", "sum_prompt_sq", "sum_context"}
    assert figures["held_out_mape"] < 0.05 and "held-out" in run.stdout
    run = subprocess.run([sys.executable, "-m", "baton.cli.main", "profile"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--engine URL is needed" in run.stderr


def test_without_prefix_caching_no_cached_prefill_is_measured(tmp_path):
    emu = start_emulator(tmp_path, "--no-enable-prefix-caching")
    out = tmp_path / "p.csv"
    with servers(emu):
        run = subprocess.run([sys.executable, "-m", "baton.cli.main", "profile", "--engine", emu.url,
                              "--quick", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "after 512 cached: no prefix-cache hit: not measured" in run.stdout
    assert not [line for line in out.read_text().splitlines() if line.startswith("prefill,128,")]
