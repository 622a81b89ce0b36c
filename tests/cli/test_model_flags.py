"""``--model/--gpu/--tp`` and a YAML ``cluster.model`` block simulate a model without a
preset; ``baton list presets|gpus`` show sources; a Vidur trace's engine settings are
checked against the simulated engine (warnings, run.json)."""

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import baton

FIXTURES = Path(__file__).resolve().parents[1] / "perf" / "fixtures"
METRICS = ("Request Id,request_e2e_time,request_inter_arrival_delay,request_num_tokens,"
           "request_num_prefill_tokens,request_num_decode_tokens\n"
           + "".join(f"{i},1.0,{'' if i == 0 else 0.2},400,300,100\n" for i in range(5)))
SARATHI = {"cluster_config": {"replica_scheduler_config": {"name": "sarathi", "batch_size_cap": 128,
                                                           "chunk_size": 512},
                              "cache_config": {"block_size": 16}}}


def run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def test_simulate_a_config_json_on_a_gpu(tmp_path):
    """A relative --model is relative to where baton runs; run.json keeps the route."""
    out = tmp_path / "out"
    p = baton("simulate", "--model", "codellama-34b/config.json", "--gpu", "a100-80g", "--tp", "2",
              "--requests", "5", "--json", "--quiet", "--out", str(out), cwd=FIXTURES)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["least-loaded"]["finished"] == 5
    preset = run_json(out)["config"]["cluster"]["preset"]
    assert preset == f"hf:{FIXTURES / 'codellama-34b' / 'config.json'}@a100-80g:tp2"


def test_a_yaml_model_block_is_relative_to_the_yaml(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(f"cluster: {{prefill: 1, decode: 1, model: {{config: {FIXTURES.name}/llama-3.1-8b, gpu: h200}}}}\n"
                   "workload: {synthetic: {requests: 5, rate_rps: 5.0}}\n")
    p = baton("simulate", "--config", str(cfg), "--json", "--quiet", "--out", str(tmp_path / "out"),
              cwd=FIXTURES.parent)  # where fixtures/ is, but the YAML is elsewhere
    assert p.returncode == 2 and "no such model config.json" in p.stderr  # tmp_path has no fixtures/
    (tmp_path / FIXTURES.name).symlink_to(FIXTURES)
    p = baton("simulate", "--config", str(cfg), "--json", "--quiet", "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    assert run_json(tmp_path / "out")["config"]["cluster"]["preset"].endswith("llama-3.1-8b@h200:tp1")


@pytest.mark.parametrize("flags, message", [
    (("--model", "x.json", "--preset", "llama-3.1-8b@h100", "--gpu", "h100"), "--model and --preset: choose one"),
    (("--gpu", "h100"), "--gpu/--tp: only with --model"),
    (("--model", "x.json"), "--model: needs --gpu NAME"),
    (("--model", "x.json", "--gpu", "h10"), "--gpu: unknown GPU 'h10' (did you mean"),
    (("--model", str(FIXTURES / "llama-3.1-8b"), "--gpu", "l40s", "--tp", "2"),
     "l40s: no measured all-reduce latency for tensor parallelism 2"),
    (("--preset", "llama-9@h100"), "--model PATH/config.json --gpu NAME"),
])
def test_bad_model_flags_are_one_line_errors(tmp_path, flags, message):
    p = baton("simulate", *flags, "--requests", "5", "--quiet", "--out", str(tmp_path))
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_list_presets_and_gpus():
    presets = baton("list", "presets").stdout.splitlines()
    row = next(line.split() for line in presets if line.startswith("llama-2-70b-tp2@a100-80g "))
    assert row[1:5] == ["llama-2-70b", "a100-80g", "2", "vidur:"]
    gpus = {line.split()[0] for line in baton("list", "gpus").stdout.splitlines()}
    assert {"a100-80g", "a100-40g", "h100", "h200", "l40s", "rtx4090d", "h20"} <= gpus


def test_a_vidur_traces_engine_settings_are_checked_and_recorded(tmp_path):
    (tmp_path / "request_metrics.csv").write_text(METRICS)
    (tmp_path / "config.json").write_text(json.dumps(SARATHI))
    args = ("simulate", "--trace", str(tmp_path / "request_metrics.csv"), "--quiet", "--json")
    p = baton(*args, "--out", str(tmp_path / "a"))
    warnings = [line for line in p.stderr.splitlines() if line.startswith("warning: the trace came from")]
    assert p.returncode == 0 and len(warnings) == 2, p.stderr
    assert "--max-num-batched-tokens 512" in warnings[0] and "--max-num-seqs 128" in warnings[1]
    recorded = run_json(tmp_path / "a")["config"]["source_engine"]
    assert recorded["max_num_batched_tokens"] == 512 and recorded["budget_key"] == "chunk_size"
    p = baton(*args, "--max-num-batched-tokens", "512", "--max-num-seqs", "128", "--out", str(tmp_path / "b"))
    assert p.returncode == 0 and "warning: the trace came from" not in p.stderr, p.stderr
