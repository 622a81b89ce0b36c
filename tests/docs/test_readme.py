"""The README stays short and its simulator quick start runs as written (in a scratch
folder, the repository's examples named by path)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def _block(title: str) -> list[str]:
    body = README.split(f"## {title}\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    body = re.sub(r"\\\n\s*", " ", body)  # continuation lines
    return [re.sub(r"\s+#.*$", "", line).strip() for line in body.splitlines() if line.startswith("baton ")]


def test_the_simulator_quick_start_runs_as_written(tmp_path):
    commands = _block("Quick start: the simulator")
    assert len(commands) >= 5
    bin_dir = Path(sys.executable).parent
    for line in commands:
        line = line.replace("examples/", f"{ROOT}/examples/")
        out = subprocess.run(f"{bin_dir}/{line}", shell=True, cwd=tmp_path, capture_output=True, text=True,
                             timeout=240)
        assert out.returncode == 0, (line, out.stderr[-2000:])
    assert (tmp_path / "experiment.schema.json").stat().st_size > 1000
    assert (tmp_path / "baton-out" / "run.json").exists()  # each run replaces the folder


def test_make_test_quick_names_only_test_paths_that_exist():
    """The README's edit-test loop: `make test-quick` is a Makefile target whose selection
    names test folders and files that exist (a moved folder would silently test less)."""
    make = (ROOT / "Makefile").read_text()
    assert "\ntest-quick:" in make and "make test-quick" in (ROOT / "README.md").read_text()
    block = make.split("QUICK_TESTS =", 1)[1].split("\ntest-quick:", 1)[0]
    paths = block.replace("\\", " ").split()
    assert len(paths) >= 5 and all((ROOT / path).exists() for path in paths), paths
    assert "tests/conformance" not in paths and "tests/gateway" not in paths  # the slow live ones stay out
