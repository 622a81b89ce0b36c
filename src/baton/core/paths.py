"""Where Baton keeps what it builds or downloads outside the repository."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$BATON_CACHE``, else ``~/.cache/baton`` (environments, models, datasets, the
    length predictor's builds); read at each call, so a changed environment counts."""
    return Path(os.environ.get("BATON_CACHE") or Path.home() / ".cache" / "baton")
