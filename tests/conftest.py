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
