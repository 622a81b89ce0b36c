"""The HTML report renders in a real headless browser and every figure loads."""

import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from baton.experiments import run_experiment
from baton.report import Report, compare_figures, write_report
from tests.experiments.test_sweep import small

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser() -> str:
    for name in BROWSERS:
        if shutil.which(name):
            return name
    pytest.skip("headless Chromium is not installed")


def render(path) -> str:
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
           "--dump-dom", path.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


@pytest.fixture(scope="module")
def report_path(tmp_path_factory):
    runs = [run_experiment(replace(small(), policy=p))[1]
            for p in ("round-robin", "least-kv")]
    summaries = {r.name: r.summary for r in runs}
    return write_report(tmp_path_factory.mktemp("report"), Report("test", summaries, compare_figures(runs)))


def test_page_has_table_and_files(report_path):
    text = report_path.read_text()
    assert text.count("<img class='figure'") == 4 and "least-kv" in text and "%)" in text
    for stem in ("latency_cdf", "tbt_percentiles", "instance_load", "throughput_goodput"):
        assert (report_path.parent / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"


def test_chromium_loads_every_figure(report_path):
    dom = render(report_path)
    assert re.search(r'data-figures-loaded="4/4"', dom), dom[-500:]


def test_chromium_check_detects_a_broken_figure(report_path, tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text(report_path.read_text().replace("base64,iVBOR", "base64,AAAA", 1))
    assert re.search(r'data-figures-loaded="3/4"', render(broken))
