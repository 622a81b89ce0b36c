"""`baton compare`, `baton sweep` and `baton workload stats` as a user runs them."""

import json

import pytest

from tests.cli.test_cli import baton

SMALL = ("--requests", "60", "--rate", "6", "--prefill", "1", "--decode", "2", "--quiet")


def test_compare_json_table_and_report(tmp_path):
    p = baton("compare", *SMALL, "--policies", "round-robin,least-kv", "--json", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert list(summary) == ["round-robin", "least-kv"]
    assert all(v["finished"] + v["rejected"] == 60 for v in summary.values())
    for f in ("report.html", "latency_cdf.png", "tbt_percentiles.png", "instance_load.png",
              "throughput_goodput.png", "round-robin.requests.csv", "least-kv.summary.json"):
        assert (tmp_path / f).stat().st_size > 0, f
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_compare_matches_simulate_for_the_same_seed(tmp_path):
    c = baton("compare", *SMALL, "--policies", "least-kv,round-robin", "--json", "--out", str(tmp_path / "c"))
    s = baton("simulate", *SMALL, "--policy", "round-robin", "--json", "--out", str(tmp_path / "s"))
    a, b = json.loads(c.stdout)["round-robin"], json.loads(s.stdout)["round-robin"]
    assert {k: v for k, v in a.items() if k != "wall_s"} == {k: v for k, v in b.items() if k != "wall_s"}


def test_compare_table_shows_change_against_first(tmp_path):
    import os
    p = baton("compare", *SMALL, "--policies", "round-robin,least-kv", "--out", str(tmp_path),
              env={**os.environ, "COLUMNS": "100"})
    assert p.returncode == 0, p.stderr
    row = next(line for line in p.stdout.splitlines() if "│" in line and "least-kv" in line)
    assert "%)" in row and "\x1b[" not in p.stdout and "report:" in p.stdout


def test_compare_named_yaml_configs(tmp_path):
    (tmp_path / "fast.yaml").write_text("policy: {name: p2, stages: [{stage: power-of-two}]}\n")
    (tmp_path / "plain.yaml").write_text("policy: least-requests\n")
    p = baton("compare", *SMALL, "--configs", str(tmp_path / "plain.yaml"), str(tmp_path / "fast.yaml"),
              "--json", "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    assert list(json.loads(p.stdout)) == ["plain", "fast"]


@pytest.mark.parametrize("args,message", [
    (["compare"], "name the policies"),
    (["compare", "--policies", "round-robin,nope"], "unknown policy 'nope'"),
    (["compare", "--policies", "round-robin,round-robin"], "repeated: round-robin"),
    (["compare", "--policies", "round-robin", "--configs", "/nonexistent.yaml"], "cannot read config"),
    (["sweep", "--policies", "round-robin", "--rate", "2,fast"], "--rate: expected numbers"),
    (["sweep", "--policies", "round-robin", "--rate", "0,2"], "positive request rates"),
    (["sweep", "--policies", "round-robin", "--rate", "2", "--target", "1.5"], "--target"),
    (["sweep", "--policies", "round-robin", "--rate", "2", "--workers", "0"], "--workers"),
    (["workload", "stats", "/nonexistent/t.csv"], "no such trace file"),
])
def test_bad_input_one_line_error(tmp_path, args, message):
    p = baton(*args, "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "o" / "round-robin.requests.csv").exists()


def test_sweep_json_and_report(tmp_path):
    p = baton("sweep", "--requests", "60", "--prefill", "1", "--decode", "1", "--quiet", "--rate", "40,2,10",
              "--policies", "round-robin,least-kv", "--tpot-slo", "0.03", "--workers", "2", "--json",
              "--out", str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert list(data) == ["round-robin", "least-kv"]
    for entry in data.values():
        assert [pt["rate_rps"] for pt in entry["points"]] == [2.0, 10.0, 40.0]
        for pt in entry["points"]:  # a pass rests on a steady window (60 s of arrivals at least), a miss on 60
            assert pt["finished"] + pt["rejected"] == pt["requests"]
            if pt["slo_attainment"] >= 0.9:
                assert pt["requests"] >= pt["rate_rps"] * 60 and pt["steady"] == 1
                assert pt["window_end_s"] - pt["window_start_s"] >= pt["steady_needed_s"]
            else:
                assert pt["requests"] == 60
        assert entry["max_rate_status"] in ("knee", "capped", "below range")
        att = [pt["slo_attainment"] for pt in entry["points"]]
        best = entry["max_sustainable_rate_rps"]
        assert best is None or 2.0 <= best <= 40.0
        if att[0] >= 0.9 and att[-1] < 0.9:
            assert best < 40.0
    assert (tmp_path / "sweep.png").stat().st_size > 0 and (tmp_path / "sweep.html").exists()


def test_workload_stats(tmp_path):
    trace = tmp_path / "t.csv"
    rows = [f"2023-11-16 18:15:{s:02d}.000,{100 + s},{10 * (s + 1)}" for s in range(20)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    p = baton("workload", "stats", str(trace), "--json", "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    stats = json.loads(p.stdout)["t.csv"]
    assert stats["requests"] == 20 and stats["duration_s"] == pytest.approx(19.0)
    assert stats["max_prompt_tokens"] == 119 and stats["mean_output_tokens"] == pytest.approx(105.0)
    assert stats["interarrival_cv"] == pytest.approx(0.0, abs=1e-6)
    assert (tmp_path / "o" / "workload.png").stat().st_size > 0


def test_compare_repeats_gives_means_and_paired_intervals(tmp_path):
    p = baton("compare", *SMALL, "--policies", "round-robin,least-kv", "--repeats", "3", "--json",
              "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.strip().splitlines()) == 1
    summary = json.loads(p.stdout)
    assert summary["round-robin"]["repeats"] == summary["least-kv"]["repeats"] == 3
    entry = summary["least-kv"]["paired"]["p99_tpot_s"]
    lo, hi = entry["ci95"]
    assert lo <= entry["mean_diff"] <= hi
    assert (tmp_path / "least-kv.r2.requests.csv").exists()
    thin = [ln for ln in p.stderr.splitlines() if "samples above them" in ln]  # 60 requests: thin tails
    assert len(thin) == 1 and "p99_9_tpot_s (" in thin[0]
    assert "samples above them" in (tmp_path / "report.html").read_text()  # the report says it too


def test_piped_tables_fit_100_columns_and_wide_shows_everything(tmp_path):
    import os
    env = {**os.environ, "COLUMNS": "100"}
    for cmd in (("compare", *SMALL, "--policies", "round-robin,least-kv,power-of-two,least-outstanding",
                 "--repeats", "2"), ("simulate", *SMALL)):
        p = baton(*cmd, "--out", cmd[0], env=env, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert max(len(line) for line in p.stdout.splitlines()) <= 100, p.stdout
        assert "P99 TPOT ms" in p.stdout and "load CV" not in p.stdout
    p = baton("simulate", *SMALL, "--wide", "--out", "w", cwd=tmp_path, env={**env, "COLUMNS": "200"})
    assert "load CV" in p.stdout and "P50 TTFT ms" in p.stdout


def test_run_json_says_how_the_folder_was_made_and_old_files_go(tmp_path):
    (tmp_path / "stale.requests.csv").write_text("old")
    (tmp_path / "notes.txt").write_text("mine")
    p = baton("compare", *SMALL, "--policies", "round-robin,least-kv", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    run = json.loads((tmp_path / "run.json").read_text())
    assert {"config", "seed", "trace", "trace_sha256", "baton_version", "git_commit", "argv"} <= set(run)
    assert run["config"]["policies"] == ["round-robin", "least-kv"] and run["argv"][0] == "compare"
    assert run["config"]["cluster"]["decode"] == 2 and run["config"]["view"]["mode"] == "scraped"
    assert not (tmp_path / "stale.requests.csv").exists() and (tmp_path / "notes.txt").exists()


def test_compare_runs_a_whole_trace_without_a_window_size(tmp_path):
    """One repeat of a trace is the whole trace (it asked for --requests before)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{i * 0.25},{100 + i},20\n" for i in range(40)))
    p = baton("compare", "--trace", str(trace), "--policies", "round-robin,least-loaded", "--json",
              "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["round-robin"]["requests"] == 40


def test_every_run_names_its_workload_and_warns_on_a_rate_that_looks_like_a_unit_mistake(tmp_path):
    fast = tmp_path / "fast.csv"  # 200 requests in 20 ms: seconds read as milliseconds, say
    fast.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{i * 0.0001},{100 + i},4\n" for i in range(200)))
    quiet = baton("simulate", "--trace", str(fast), "--quiet", "--json", "--out", str(tmp_path / "q"))
    loud = baton("compare", "--trace", str(fast), "--policies", "round-robin,least-loaded",
                 "--out", str(tmp_path / "c"))
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    for p in (quiet, loud):
        assert "warning: fast.csv: 200 requests over 0.020 s is 10,000 req/s" in p.stderr
    assert "workload:" not in quiet.stderr  # --quiet keeps only warnings
    assert "workload: fast.csv: 200 requests over 0.0 s" in loud.stderr
    assert "fast.csv: 200 requests" in (tmp_path / "c" / "report.html").read_text()


def test_a_trace_in_seconds_read_as_milliseconds_is_named_by_every_command_that_reads_it(tmp_path):
    """First hour, item 5: a trace at about 1 req/s read as milliseconds (962 req/s) passed
    simulate silently, and workload stats warned about nothing."""
    import numpy as np
    gaps = np.random.default_rng(1).exponential(1.0, 120)
    trace = tmp_path / "secs.csv"
    trace.write_text("t,p,o\n" + "".join(f"{t:.3f},{200 + i},20\n" for i, t in enumerate(np.cumsum(gaps))))
    as_ms = ("--columns", "time=t,prompt=p,output=o", "--time-unit", "ms")
    runs = {
        "simulate": baton("simulate", "--trace", str(trace), *as_ms, "--prefill", "1", "--decode", "1",
                          "--quiet", "--json", "--out", str(tmp_path / "s")),
        "stats": baton("workload", "stats", str(trace), *as_ms, "--json", "--out", str(tmp_path / "w")),
    }
    for name, p in runs.items():
        assert p.returncode == 0, p.stderr
        assert "warning: secs.csv:" in p.stderr and "seconds read as milliseconds" in p.stderr, (name, p.stderr)
    assert "the most this cluster could serve" in runs["simulate"].stderr
    right = baton("simulate", "--trace", str(trace), "--columns", "time=t,prompt=p,output=o", "--prefill", "1",
                  "--decode", "1", "--quiet", "--json", "--out", str(tmp_path / "r"))
    rescaled = baton("simulate", "--trace", str(trace), *as_ms, "--rate", "1", "--prefill", "1", "--decode", "1",
                     "--quiet", "--json", "--out", str(tmp_path / "x"))
    for p in (right, rescaled):  # read in its unit, or rescaled by --rate (only proportions kept): no warning
        assert p.returncode == 0 and "warning: secs.csv" not in p.stderr, p.stderr


def test_workload_stats_takes_the_same_trace_flags_and_errors_say_what_to_do(tmp_path):
    mine = tmp_path / "mine.csv"
    mine.write_text("ts_ms,p,o\n" + "".join(f"{i * 500},{100 + i},10\n" for i in range(20)))
    p = baton("workload", "stats", str(mine), "--columns", "time=ts_ms,prompt=p,output=o", "--time-unit", "ms",
              "--json", "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["mine.csv"]["duration_s"] == pytest.approx(9.5)
    unknown = baton("workload", "stats", str(mine), "--out", str(tmp_path / "o"))
    assert unknown.returncode != 0 and "--columns time=COL" in unknown.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    for cmd in (("workload", "stats", str(empty)), ("simulate", "--trace", str(empty))):
        e = baton(*cmd, "--out", str(tmp_path / "o"))
        assert e.returncode != 0 and "the file is empty" in e.stderr and "Traceback" not in e.stderr


def test_compare_writes_comparison_csv_with_intervals_and_readable_records(tmp_path):
    import csv
    p = baton("compare", *SMALL, "--policies", "round-robin,least-kv", "--repeats", "3", "--json",
              "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    rows = list(csv.DictReader((tmp_path / "comparison.csv").open()))
    assert [r["policy"] for r in rows] == ["round-robin", "least-kv"] and all(r["repeats"] == "3" for r in rows)
    for r in rows:
        mean = float(r["p99_tpot_s"])
        assert mean == pytest.approx(summary[r["policy"]]["p99_tpot_s"], rel=1e-5)
        assert float(r["p99_tpot_s_ci95_lo"]) <= mean <= float(r["p99_tpot_s_ci95_hi"])
    assert rows[0]["p99_tpot_s_diff_ci95_lo"] == ""  # the first policy is the reference
    diff = summary["least-kv"]["paired"]["p99_tpot_s"]["ci95"]
    assert float(rows[1]["p99_tpot_s_diff_ci95_lo"]) == pytest.approx(diff[0], rel=1e-5)
    records = list(csv.DictReader((tmp_path / "least-kv.requests.csv").open()))
    assert {r["finished"] for r in records} <= {"true", "false"} and {r["deflected"] for r in records} == {"false"}
    assert all(r["path"].startswith("prefill-0>decode-") for r in records if r["finished"] == "true")
    assert set(next(csv.reader((tmp_path / "comparison.csv").open()))) >= {"p50_ttft_s", "p99_tbt_s", "goodput_rps"}


def test_the_table_fits_an_80_column_terminal_one_line_per_policy(tmp_path):
    import os
    policies = ["round-robin", "least-requests", "power-of-two", "least-kv"]
    p = baton("compare", *SMALL, "--policies", ",".join(policies), "--out", str(tmp_path),
              env={**os.environ, "COLUMNS": "80"})
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stdout.splitlines() if not line.startswith("report:")]  # a path
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    rows = [line for line in lines if any(line.strip().startswith(name + "  ") for name in policies)]
    assert len(rows) == len(policies)  # every name whole, every policy on one line
    assert all("%" in row for row in rows[1:])  # with its change against the first


def test_a_sweep_names_the_policies_that_dropped_requests(tmp_path):
    # a context of 512 tokens against prompts of median 600: many are rejected (context)
    p = baton("sweep", "--requests", "40", "--prefill", "1", "--decode", "1", "--quiet", "--rate", "2",
              "--policies", "round-robin", "--max-model-len", "512", "--workers", "1", "--out", str(tmp_path),
              timeout=300)
    assert p.returncode == 0, p.stderr
    assert "warning: requests rejected (counted as SLO misses): round-robin" in p.stderr and "context" in p.stderr
    assert "requests rejected" in (tmp_path / "sweep.html").read_text()


def test_compare_checks_every_policy_against_the_cluster_before_running_any(tmp_path):
    """A policy the cluster cannot run (cascade needs colocated instances) fails the whole
    comparison at once, named with its reason, before a single policy was simulated."""
    out = tmp_path / "o"
    p = baton("compare", "--policies", "least-loaded,cascade,round-robin", "--prefill", "2", "--decode", "4",
              "--requests", "50", "--out", str(out))
    assert p.returncode == 2, p.stderr
    assert "cascade: policy 'cascade'" in p.stderr and "colocated instances only" in p.stderr
    assert "Traceback" not in p.stderr
    assert not list(out.glob("*.requests.csv"))  # nothing was simulated first


def test_compare_records_its_summaries_for_the_docs(tmp_path):
    """First hour, item 1: a comparison recorded with --record renders as the docs' table."""
    import os
    p = baton("compare", "--policies", "round-robin,least-loaded", "--requests", "120", "--repeats", "2", "--quiet",
              "--out", str(tmp_path / "o"), "--record", "tiny", env={**os.environ, "BATON_RESULTS_DIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "tiny.json").read_text())
    assert data["command"].startswith("baton compare") and data["figures"]["repeats"] == 2
    from baton.report.result_markers import render
    table = render("<!--rt tiny:summary-->\n<!--/rt-->", tmp_path)
    assert "| least-loaded |" in table and "| policy | rej | P95 TTFT ms |" in table
