from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def traces_dir() -> Path:
    path = SHARED / "traces"
    if not path.is_dir():
        pytest.skip("shared traces are not present")
    return path


@pytest.fixture
def vidur_dir() -> Path:
    path = SHARED / "peers" / "vidur"
    if not path.is_dir():
        pytest.skip("Vidur profiles are not present")
    return path


_SESSION: dict = {}


def pytest_sessionstart(session) -> None:
    import time
    _SESSION["t0"] = time.monotonic()


def pytest_sessionfinish(session, exitstatus) -> None:
    """``BATON_RECORD=NAME``: the run's counts and duration into results/NAME.json (the
    README quotes the suite's size and time from there; see report/results.py)."""
    import os
    import sys
    import time
    name = os.environ.get("BATON_RECORD")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not name or reporter is None:
        return
    from baton.report.results import record
    counts = {k: len(reporter.stats.get(k, [])) for k in ("passed", "failed", "skipped", "error")}
    record(name, {**counts, "exit_status": int(exitstatus), "cpus": os.cpu_count()},
           time.monotonic() - _SESSION["t0"], "pytest " + " ".join(sys.argv[1:]))
