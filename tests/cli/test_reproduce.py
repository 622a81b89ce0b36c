"""`baton reproduce` end to end on a tiny figure, and its errors."""

import json

from tests.cli.test_cli import baton

TINY = """
figure: "tiny: P99 TPOT, least-kv against round-robin"
source: "made up for the test"
policy: least-kv
baseline: rr-early
metric: p99_tpot_s
claim: -0.5
experiment:
  cluster: {prefill: 1, decode: 2}
  workload:
    synthetic: {requests: 60, rate_rps: 6, output_median: 60}
  seed: 3
"""


def test_reproduce_prints_claim_against_baton_with_an_interval(tmp_path):
    (tmp_path / "repro" / "sibyl").mkdir(parents=True)
    (tmp_path / "repro" / "sibyl" / "tiny.yaml").write_text(TINY)
    (tmp_path / "repro" / "sibyl" / "big.yaml").write_text(TINY.replace("figure:", "full: true\nfigure:"))
    p = baton("reproduce", "sibyl", "--dir", str(tmp_path / "repro"), "--repeats", "2", "--json",
              "--quiet", "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.strip().splitlines()) == 1
    result = _claims(p.stdout)
    assert list(result) == ["tiny"]  # the `full` figure needs --full
    fig = result["tiny"]
    assert fig["paper"] == "sibyl" and fig["figure"]
    assert fig["claim"] == -0.5 and fig["repeats"] == 2
    assert fig["metric"] == "p99_tpot_s: least-kv vs rr-early"
    lo, hi = fig["ci95"]
    assert -1.0 < lo <= fig["baton"] <= hi
    assert fig["verdict"] in ("reproduced", "direction only", "not reproduced", "inconclusive")
    assert (tmp_path / "out" / "report.html").stat().st_size > 0
    assert (tmp_path / "out" / "claims.png").stat().st_size > 0
    table = baton("reproduce", "sibyl", "--dir", str(tmp_path / "repro"), "--repeats", "2", "--quiet",
                  "--out", str(tmp_path / "out2"))
    assert table.returncode == 0 and "-50.0%" in table.stdout and "report:" in table.stdout


def test_reproduce_all_runs_every_papers_figures(tmp_path):
    for paper in ("sibyl", "kairos"):
        (tmp_path / "repro" / paper).mkdir(parents=True)
        (tmp_path / "repro" / paper / "tiny.yaml").write_text(TINY)
    p = baton("reproduce", "all", "--dir", str(tmp_path / "repro"), "--repeats", "2", "--json", "--quiet",
              "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    assert list(_claims(p.stdout)) == ["sibyl/tiny", "kairos/tiny"]
    assert [c["paper"] for c in json.loads(p.stdout)["claims"]] == ["sibyl", "kairos"]


def test_reproduce_errors_are_one_line(tmp_path):
    p = baton("reproduce", "nope", "--out", str(tmp_path))
    assert p.returncode == 2 and "unknown paper 'nope'" in p.stderr and "Traceback" not in p.stderr
    p = baton("reproduce", "arrow", "--dir", str(tmp_path), "--out", str(tmp_path))
    assert p.returncode == 2 and "no reproductions for 'arrow'" in p.stderr
    (tmp_path / "sibyl").mkdir()
    (tmp_path / "sibyl" / "bad.yaml").write_text("figure: x\nclaim: lots\n")
    p = baton("reproduce", "sibyl", "--dir", str(tmp_path), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "bad.yaml" in p.stderr


def test_the_shipped_reproductions_load():
    from baton.experiments.reproduce import claims_of
    for paper in ("sibyl", "ares", "arrow", "kairos", "cascade"):
        claims = claims_of(paper, full=True)
        assert claims and all(c.policy and c.baseline and c.metric for c in claims)
    for claim in claims_of("arrow"):  # trace paths resolve next to the repository
        assert claim.rates and claim.experiment.workload.trace.endswith(
            ("shared/traces/azure_code_2023.csv", "shared/traces/azure_conv_2023.csv"))
    assert {c.name for c in claims_of("sibyl")} < {c.name for c in claims_of("sibyl", full=True)}
    assert {c.metric for c in claims_of("cascade")} == {"mean_ttft_s", "max_sustainable_rate_rps"}


def test_a_reproduction_file_works_as_an_experiment_config():
    from baton.experiments import load_experiment
    from pathlib import Path
    exp = load_experiment(Path(__file__).resolve().parents[2] / "reproductions/ares/fig10-p99-migration.yaml")
    assert exp.cluster.decode == 3 and exp.workload.synthetic.rate_rps == 0.17


def rate_claim(tmp_path, rates: str, slo: str):
    """A tiny sustainable-rate reproduction (arrow vs arrow-static) in ``tmp_path/arrow``."""
    folder = tmp_path / "arrow"
    folder.mkdir()
    (folder / "rate.yaml").write_text(
        "figure: tiny\nsource: test\npolicy: arrow\nbaseline: arrow-static\nmetric: max_sustainable_rate_rps\n"
        f"claim: 0.5\nrates: {rates}\nexperiment:\n  cluster: {{prefill: 1, decode: 2}}\n"
        "  workload: {synthetic: {requests: 120, rate_rps: 5, prompt_median: 500, output_median: 20}}\n"
        f"  slo: {slo}\n")
    return folder


def test_a_sustainable_rate_claim_sweeps_both_policies(tmp_path):
    folder = rate_claim(tmp_path, "[2, 8, 32, 128]", "{ttft_s: 2.0, tpot_s: 0.1}")
    p = baton("reproduce", "arrow", "--dir", str(tmp_path), "--repeats", "2", "--json", "--quiet",
              "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    (fig,) = _claims(p.stdout).values()
    assert fig["repeats"] == 2 and fig["baton"] is not None and fig["metric"].startswith("max_sustainable")
    (folder / "rate.yaml").write_text((folder / "rate.yaml").read_text().replace("rates: [2, 8, 32, 128]\n", ""))
    p = baton("reproduce", "arrow", "--dir", str(tmp_path), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "give rates exactly when" in p.stderr, (p.returncode, p.stderr[-800:])


def test_a_trace_path_under_the_home_folder_is_expanded():
    from pathlib import Path

    from baton.experiments import load_experiment
    exp = load_experiment(Path(__file__).resolve().parents[2] / "examples/cascade-16-sharegpt.yaml")
    assert exp.workload.trace == str(Path.home() / ".cache/baton/sharegpt/sharegpt_v3_smollm2.json")


def test_repeats_without_a_sustained_rate_are_reported_not_silently_dropped(tmp_path):
    rate_claim(tmp_path, "[5000, 10000]", "{ttft_s: 0.01, tpot_s: 0.001}")  # nobody meets this at any rate
    p = baton("reproduce", "arrow", "--dir", str(tmp_path), "--repeats", "2", "--json", "--quiet",
              "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    (fig,) = _claims(p.stdout).values()
    assert fig["repeats"] == 0 and fig["dropped_repeats"] == 2 and fig["baton"] is None
    assert "2 of 2 repeats have no max_sustainable_rate_rps" in p.stderr


def _claims(stdout: str) -> dict:
    """``--json``'s claims list keyed by name."""
    return {c["name"]: c for c in json.loads(stdout)["claims"]}


def test_a_missing_trace_names_its_public_source_before_anything_runs(tmp_path):
    """First hour, item 6: `reproduce kairos` without the traces said only "no such trace
    file". Now every missing trace is named with where to download it, before any run."""
    p = baton("reproduce", "kairos", "--traces", str(tmp_path), "--quiet", "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "AzureLLMInferenceTrace_code.csv" in p.stderr and "github.com/Azure/AzurePublicDataset" in p.stderr
    assert f"save it as {tmp_path / 'azure_code_2023.csv'}" in p.stderr
    assert not (tmp_path / "out" / "report.html").exists()
    p = baton("reproduce", "kairos", "--traces", str(tmp_path / "nope"), "--quiet")
    assert p.returncode == 2 and "--traces" in p.stderr and "no such folder" in p.stderr


def test_traces_are_found_in_a_folder_under_the_upstream_name(tmp_path):
    from baton.experiments.reproduce import ROOT, check_traces, claims_of, with_traces
    (tmp_path / "AzureLLMInferenceTrace_code.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    claims = with_traces(claims_of("kairos", ROOT), str(tmp_path))
    assert {c.experiment.workload.trace for c in claims} == {str(tmp_path / "AzureLLMInferenceTrace_code.csv")}
    check_traces(claims)  # found: no error
