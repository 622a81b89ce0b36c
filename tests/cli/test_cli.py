"""The real ``baton`` command in a subprocess: normal runs and every kind of bad input."""

import json
import subprocess
import sys

import pytest


def baton(*args, cwd=None, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", "baton.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def test_simulate_json_summary_and_outputs(tmp_path):
    out = tmp_path / "out"
    p = baton("simulate", "--requests", "80", "--rate", "8", "--prefill", "1", "--decode", "2",
              "--policy", "least-kv", "--json", "--quiet", "--out", str(out))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    m = summary["least-kv"]
    for key in ("p99_tpot_s", "p95_ttft_s", "goodput_rps", "throughput_tok_s", "slo_attainment",
                "finished", "rejected"):
        assert key in m
    assert m["finished"] + m["rejected"] == 80
    assert (out / "least-kv.requests.csv").read_text().count("\n") == 81
    assert "\x1b[" not in p.stdout


def test_simulate_table_when_piped(tmp_path):
    p = baton("simulate", "--requests", "30", "--policy", "round-robin", "--quiet", "--out", str(tmp_path))
    assert p.returncode == 0 and "round-robin" in p.stdout and "\x1b[" not in p.stdout


def test_yaml_config(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("cluster: {prefill: 1, decode: 1, preset: llama-3.1-8b@h100}\n"
                   "policy: {name: mine, stages: [{stage: power-of-two}]}\n"
                   "workload: {synthetic: {requests: 40, rate_rps: 5.0}}\nslo: {ttft_s: 1.5}\nseed: 3\n")
    p = baton("simulate", "--config", str(cfg), "--json", "--quiet", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["mine"]["finished"] == 40


@pytest.mark.parametrize("args,message", [
    (["simulate", "--trace", "/nonexistent/trace.csv"], "no such trace file"),
    (["simulate", "--policy", "nope"], "unknown policy 'nope'"),
    (["simulate", "--preset", "gpt-9@tpu"], "unknown preset"),
    (["simulate", "--requests", "-3"], "--requests"),
    (["simulate", "--config", "/nonexistent.yaml"], "cannot read config"),
])
def test_bad_input_gives_one_line_error(tmp_path, args, message):
    p = baton(*args, "--quiet", "--out", str(tmp_path))
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("text,message", [
    ("cluster: {prefill: 2\n", "malformed YAML"),
    ("cluster: {prefill: two}\n", "cluster.prefill: expected an integer, got 'two'"),
    ("cluster: {gpus: 2}\n", "cluster.gpus: unknown key"),
    ("workload: {synthetic: {requests: ten}}\n", "workload.synthetic.requests"),
    ("- a\n- b\n", "expected a mapping"),
    ("policy: {stages: [{stage: least-loaded, k: 1}]}\n", "policy.stages[0].k"),
])
def test_bad_yaml_names_the_key(tmp_path, text, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    p = baton("simulate", "--config", str(cfg), "--quiet", "--out", str(tmp_path))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert message in p.stderr, p.stderr


def test_bad_flag_is_rejected_by_argparse(tmp_path):
    p = baton("simulate", "--rate", "fast")
    assert p.returncode == 2 and "invalid float value" in p.stderr and "Traceback" not in p.stderr


def test_malformed_trace_names_line(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,x\n")
    p = baton("simulate", "--trace", str(f), "--quiet", "--out", str(tmp_path))
    assert p.returncode == 2 and "t.csv:2: GeneratedTokens" in p.stderr


def test_demo_runs_every_baseline(tmp_path):
    p = baton("demo", "--requests", "120", "--json", "--quiet", "--out", str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert set(summary) == {"round-robin", "least-loaded", "least-kv", "least-requests", "power-of-two", "colocated",
                            "ils", "sibyl", "ares", "arrow", "kairos", "combined"}
    assert all(v["finished"] == 120 for v in summary.values())


def test_requests_n_generates_exactly_n_synthetic_requests(tmp_path):
    p = baton("simulate", "--requests", "1234", "--rate", "50", "--quiet", "--json", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["least-loaded"]["requests"] == 1234


def test_cluster_counts(tmp_path):
    p = baton("simulate", "--mixed", "3", "--policy", "colocated", "--requests", "20", "--quiet", "--json",
              "--out", str(tmp_path / "a"))
    assert p.returncode == 0, p.stderr  # --mixed alone: 0P0D + 3 mixed
    paths = {r["path"] for r in __import__("csv").DictReader(open(tmp_path / "a" / "colocated.requests.csv"))}
    assert paths <= {"mixed-0", "mixed-1", "mixed-2"}  # three instances, no 2P2D added
    for flags, message in ((("--prefill", "0"), "needs an instance that can prefill"),
                           (("--decode", "-1"), "--decode: expected a number >= 0, got -1")):
        p = baton("simulate", *flags, "--requests", "20", "--quiet", "--out", str(tmp_path / "b"))
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr


def test_context_longer_than_the_model_is_rejected_and_counted(tmp_path):
    p = baton("simulate", "--requests", "40", "--max-model-len", "600", "--quiet", "--json",
              "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["least-loaded"]
    assert s["rejected_context"] > 0 and s["rejected"] == s["rejected_context"]


def test_every_help_page_renders(tmp_path):
    for args in (("--help",), ("compare", "--help"), ("reproduce", "--help"), ("simulate", "--help")):
        p = baton(*args)
        assert p.returncode == 0 and "usage:" in p.stdout, (args, p.stderr[-300:])


def test_version_and_list():
    p = baton("--version")
    assert p.returncode == 0 and p.stdout.startswith("baton ")
    p = baton("list", "policies")
    assert p.returncode == 0 and {"ils", "least-outstanding", "sibyl", "ares"} <= set(p.stdout.split())
    rows = {line.split()[0]: line.split(None, 1)[1] for line in p.stdout.splitlines()}  # name, then what it does
    assert "SIBYL" in rows["sibyl"] and "Kairos" in rows["kairos"] and len(rows) == len(set(rows))
    assert "llama-2-70b-tp2@a100-80g" in baton("list", "presets").stdout.split()
    assert "vidur-metrics" in baton("list", "formats").stdout.split()


@pytest.mark.parametrize("flags, message", [
    (("--seed", "-1"), "--seed: expected a number >= 0, got -1"),
    (("--rate", "nan"), "--rate: expected a positive finite number"),
    (("--policy", "leastloaded"), "did you mean 'least-loaded'"),
    (("--preset", "llama-3.1-8b@a100"), "did you mean"),
])
def test_bad_flag_values_are_one_line_errors(tmp_path, flags, message):
    p = baton("simulate", *flags, "--requests", "5", "--quiet", "--out", str(tmp_path))
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr


def test_out_naming_a_file_and_a_busy_port(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    p = baton("simulate", "--requests", "5", "--quiet", "--out", str(f))
    assert p.returncode == 2 and "is a file" in p.stderr
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = baton("emulate", "--port", str(s.getsockname()[1]), timeout=30)
    assert p.returncode == 2 and "port is busy" in p.stderr and "Traceback" not in p.stderr


def test_records_format_parquet(tmp_path):
    p = baton("simulate", "--requests", "20", "--records-format", "parquet", "--quiet", "--out", str(tmp_path))
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert p.returncode == 2 and "needs pyarrow" in p.stderr and not list(tmp_path.glob("*.parquet"))
        return
    assert p.returncode == 0, p.stderr
    assert pq.read_table(tmp_path / "least-loaded.requests.parquet").num_rows == 20


def test_every_help_shows_each_default_once_nested_subcommands_included():
    """Each option with a default shows it in its --help once: added by the formatter, or
    written in the help's own words, never both and never neither."""
    import argparse

    from baton.cli.main import parser

    def walk(p, path):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, path + [name])
            elif action.help not in (None, argparse.SUPPRESS) and action.dest != "help":
                yield path, action, p.formatter_class(prog="baton")._get_help_string(action) or ""
    seen = 0
    for path, action, text in walk(parser(), []):
        if action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            continue
        seen += 1
        assert text.replace("%(default)s", "D").count("(default") == 1, (" ".join(path), action.option_strings, text)
    assert seen > 30  # the check saw the options
