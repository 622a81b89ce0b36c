"""Published figures from one source: result files in the repository's ``results/``.

A command run with ``--record`` (``baton demo``, ``baton reproduce``, the benchmarks) writes
``results/<name>.json``: the figures, the command line, the commit the run started at (and
whether the tree had changes when it ended), the machine and how long it took. The docs and the README quote those
files through markers that ``scripts/render_results.py`` fills in, and
``tests/docs/test_results.py`` fails on a marker whose text is not what its file says, and
on a figure written by hand inside a ``<!--measured-->`` region.

Markers (in Markdown, invisible when rendered):

- ``<!--r NAME:PATH[:FORMAT]-->TEXT<!--/r-->``: one value; ``PATH`` walks the file's
  ``figures`` by keys (``claims.3.baton``; a key may hold ``/`` and ``-``, not ``:``),
  ``FORMAT`` is a Python format spec (``+.1%``, ``,.0f``), or ``len`` (a list's length),
  ``pct`` (``-57.3%``:
  a fraction as a signed percentage with one decimal), ``ci`` (``[-81.8, +0.4]``:
  a pair of fractions), ``min`` (seconds as ``3 min 38 s``), ``ms`` and ``ms.1`` (seconds
  as whole milliseconds, or with one decimal), ``meets-ge-1.8`` / ``meets-le-40`` (``met``
  or ``missed``: a target's verdict on the figure, so that no page says "met" of a run
  that missed).
- ``<!--rt NAME:TABLE-->...<!--/rt-->``: a whole Markdown table, built by the renderer
  registered for ``TABLE`` (``report.result_tables``).
"""

from __future__ import annotations

import json
import math
import operator
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from baton.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "results"


def results_dir() -> Path:
    """Where result files go: ``BATON_RESULTS_DIR`` if set (tests), else ``results/``."""
    return Path(os.environ.get("BATON_RESULTS_DIR") or RESULTS)


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def run_commit(seconds: float | None) -> str:
    """The commit a run of ``seconds`` that ends now started at: the newest commit on HEAD
    committed before its start (commits can land while a long benchmark runs; its code is
    the start's); HEAD when the run's length is not known."""
    before = [] if seconds is None else [f"--before={math.ceil(time.time() - seconds)}"]
    return _git("log", "-1", "--format=%h", *before, "HEAD") or _git("log", "-1", "--format=%h", "HEAD") or "unknown"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.machine(),
            "python": platform.python_version()}


def record(name: str, figures: dict[str, Any], seconds: float | None = None,
           command: str | None = None) -> Path:
    """Write ``results/<name>.json`` (figures with their provenance); returns the path.
    ``command`` defaults to the ``baton`` command line that is running."""
    if not name or "/" in name or ":" in name:
        raise ConfigError(f"result name {name!r}: expected a plain file name")
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    data = {"name": name, "command": command or " ".join(["baton", *sys.argv[1:]]),
            "commit": run_commit(seconds),
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks")),
            "machine": machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": None if seconds is None else round(seconds, 1), "figures": _finite(figures)}
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, allow_nan=False, default=_plain) + "\n")
    return path


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has neither; a figure a run could not
    measure is no figure)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def load(name: str, folder: Path | None = None) -> dict[str, Any]:
    """A result file's content; ConfigError naming it when it is missing or not JSON."""
    path = (folder or results_dir()) / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except OSError:
        raise ConfigError(f"{path}: no such result file (run the command that records it with --record)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON: {exc.msg}") from None


def lookup(data: dict[str, Any], path: str) -> Any:
    """The value at ``path`` (keys; in a list, an index or the ``name`` of an entry) in a
    result's figures (the top level for ``seconds``, ``commit``, ...)."""
    node: Any = data if path.split(".")[0] in ("seconds", "commit", "date", "machine") else data["figures"]
    for key in path.split("."):
        named = [n for n in node if isinstance(n, dict) and n.get("name") == key] if isinstance(node, list) else []
        if named:  # a list of named entries (claims, rows) by name
            node = named[0]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and (key in node or key.replace("_", " ") in node):
            node = node[key] if key in node else node[key.replace("_", " ")]  # a marker holds no spaces
        else:
            raise ConfigError(f"result {data.get('name')}: no figure at {path!r} (stopped at {key!r})")
    return node


_VERDICTS = {"ge": operator.ge, "le": operator.le, "gt": operator.gt, "lt": operator.lt}


def _verdict(value: float, spec: str) -> str:
    """``met`` or ``missed``: ``value`` against ``meets-OP-TARGET``'s bound."""
    _, op, target = (spec.split("-", 2) + ["", ""])[:3]
    try:
        bound = float(target)
    except ValueError:
        bound = None
    if op not in _VERDICTS or bound is None:
        raise ConfigError(f"format {spec!r}: write meets-OP-NUMBER, OP one of {', '.join(_VERDICTS)}")
    return "met" if _VERDICTS[op](value, bound) else "missed"


def fmt(value: Any, spec: str = "") -> str:
    """A value as the docs write it (see the module docstring for the specs)."""
    if spec.startswith("meets-"):
        return _verdict(value, spec)
    if spec == "len":
        return str(len(value))
    if spec == "pct":
        return f"{value * 100:+.1f}%"
    if spec == "ci":
        return f"[{value[0] * 100:+.1f}, {value[1] * 100:+.1f}]"
    if spec.startswith("ms"):  # seconds written as milliseconds: ms (whole), ms.1 (one decimal)
        return format(value * 1e3, spec[2:] + "f" if spec[2:] else ",.0f")
    if spec == "min":
        minutes, seconds = divmod(int(round(value)), 60)
        return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
    if isinstance(value, str):
        return value
    return format(value, spec)
