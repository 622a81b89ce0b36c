"""scripts/same_simulations.py: the working tree against a revision, as a process."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "same_simulations.py"


def has_git_history() -> bool:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0


@pytest.mark.skipif(not has_git_history(), reason="not a git checkout")
def test_head_simulates_as_the_working_tree_when_nothing_changed_the_simulator():
    done = subprocess.run([sys.executable, str(SCRIPT), "HEAD", "--requests", "40", "--policies", "least-loaded"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    # the working tree may carry uncommitted edits; the report is what is checked
    assert "runs identical to HEAD" in done.stdout, done.stderr
    assert done.returncode == (1 if "DIFFERS" in done.stdout else 0)


def test_an_unknown_revision_is_a_clear_error():
    done = subprocess.run([sys.executable, str(SCRIPT), "no-such-revision-xyz", "--requests", "10"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no-such-revision-xyz" in done.stderr and "Traceback" not in done.stderr


def test_any_figure_that_moves_or_goes_missing_makes_a_run_differ():
    spec = importlib.util.spec_from_file_location("same_simulations", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    before = {"a": {"p99_ttft_s": 1.0, "hits": 3}, "b": {"p99_ttft_s": 2.0}, "c": {"x": 1}}
    after = {"a": {"hits": 3, "p99_ttft_s": 1.0}, "b": {"p99_ttft_s": 2.0000000001}}
    assert script.differing(before, after) == ["b", "c"]  # key order does not matter; a last digit does


def test_an_unknown_workload_is_a_clear_error():
    done = subprocess.run([sys.executable, str(SCRIPT), "HEAD", "--workloads", "sessions,nope"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "nope" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not has_git_history(), reason="not a git checkout")
def test_the_synthetic_reasoning_workload_runs_on_both_layouts():
    done = subprocess.run([sys.executable, str(SCRIPT), "HEAD", "--requests", "30", "--policies", "least-loaded",
                           "--workloads", "reasoning"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "reasoning, 8 mixed, least-loaded" in done.stdout and "reasoning, 2P6D, least-loaded" in done.stdout, done.stderr
    assert "of 2 runs identical to HEAD" in done.stdout


@pytest.mark.skipif(not has_git_history(), reason="not a git checkout")
def test_a_run_that_compares_nothing_says_so_and_fails(tmp_path):
    # the script as it would sit in a checkout without ../shared/traces: every trace workload is skipped
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "same_simulations.py").write_text(SCRIPT.read_text())
    (root / "src").symlink_to(ROOT / "src")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"],
                   check=True)
    done = subprocess.run([sys.executable, str(root / "scripts" / "same_simulations.py"), "HEAD", "--requests", "10",
                           "--policies", "least-loaded", "--workloads", "mooncake,azure-code"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "skipped  mooncake" in done.stderr and "nothing was compared" in done.stderr


@pytest.mark.skipif(not has_git_history(), reason="not a git checkout")
def test_large_adds_a_cluster_past_the_views_columnar_cut_offs():
    done = subprocess.run([sys.executable, str(SCRIPT), "HEAD", "--requests", "10", "--policies", "least-loaded",
                           "--workloads", "sessions", "--large"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "sessions, 40P120D, least-loaded" in done.stdout, done.stderr
    assert "of 3 runs identical to HEAD" in done.stdout
