"""``run.json``: how an output folder was made (resolved config, seed, trace and its hash,
Baton's version and git commit, the command line)."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from baton import __version__
from baton.experiments.config import Experiment

REPO = Path(__file__).resolve().parents[3]


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value


def _sha256(path: str | None) -> str | None:
    if not path or not Path(path).is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def write_run_json(out: Path, exp: Experiment, policies: list[str], extra: dict | None = None) -> Path:
    """Write ``out/run.json`` and return its path."""
    trace = exp.workload.trace
    record = {"config": {**_plain(exp), "policies": policies, **(extra or {})}, "seed": exp.seed,
              "trace": trace, "trace_sha256": _sha256(trace), "baton_version": __version__,
              "git_commit": _git_commit(), "argv": sys.argv[1:]}
    path = out / "run.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    return path
