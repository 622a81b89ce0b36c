"""Trace loaders. Every malformed row raises ``WorkloadError`` naming the file and line.

Formats (``FORMATS``): ``azure`` (TIMESTAMP,ContextTokens,GeneratedTokens), ``mooncake``
(JSON lines: timestamp in ms, input_length, output_length, hash_ids), ``burstgpt``
(Timestamp, Request tokens, Response tokens, ...; failed requests, with 0 response
tokens, are dropped and counted), ``sharegpt`` (ShareGPT conversations, read as vLLM's
benchmark reads them: ``baton.workload.sharegpt``), ``json-lengths`` (a JSON list of
objects with length fields), ``vidur`` (arrived_at, num_prefill_tokens, num_decode_tokens; arrived_at
is required) and ``vidur-metrics`` (Vidur's output ``request_metrics.csv``).
Arrival times are shifted so the first request arrives at 0 s. In JSON and JSONL,
``timestamp`` is milliseconds (Mooncake) and ``arrival_s`` / ``arrived_at`` are seconds. A
trace without arrival times is an error unless ``arrivals`` says how to draw them
(``poisson:R`` or ``uniform:R`` requests/s); they are never invented silently.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from baton.core.errors import WorkloadError
from baton.core.request import Request
from baton.workload.class_columns import CLASS_COLUMNS, class_fields
from baton.workload.sources import missing_trace
from baton.workload.sharegpt import is_sharegpt, sharegpt_rows
from baton.workload.tokens import ID_BLOCK_TOKENS, TokenCounter, token_counter, token_prefix_ids

_PROMPT_KEYS = ("prompt_tokens", "input_length", "input_len", "prompt_len", "num_prefill_tokens")
_OUTPUT_KEYS = ("output_tokens", "output_length", "output_len", "num_decode_tokens")
_TIME_KEYS = {"arrival_s": 1.0, "arrived_at": 1.0, "timestamp": 1e-3}  # key -> seconds per unit


def _positive_int(value: Any, what: str, where: str) -> int:
    try:
        number = int(float(value))
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: {what}: expected an integer, got {value!r}") from None
    if number < 0 or number != float(value):
        raise WorkloadError(f"{where}: {what}: expected a non-negative integer, got {value!r}")
    return number


def _number(value: Any, what: str, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: {what}: expected a number, got {value!r}") from None


def _azure_time(value: str, where: str) -> float:
    text = value.strip()
    if "." in text:  # the trace has 7 fractional digits; datetime takes at most 6
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise WorkloadError(f"{where}: TIMESTAMP: expected a date-time, got {value!r}") from None


def _csv_rows(path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        for line, row in enumerate(reader, start=2):
            if None in row or any(v is None for v in row.values()):
                raise WorkloadError(f"{path}:{line}: expected {len(reader.fieldnames or [])} "
                                    f"columns, got a different number")
            yield f"{path}:{line}", row


@dataclass(slots=True)
class ReadOptions:
    """What a format reader may need besides the file: a tokenizer for text formats
    (``tokens.token_counter``'s path, None for the estimate) and a list collecting
    one-line notes on what was dropped or estimated."""

    tokenizer: str | None = None
    notes: list[str] = field(default_factory=list)


def _azure(path: Path, _opts: ReadOptions) -> list[tuple[float, int, int]]:
    return [(_azure_time(row["TIMESTAMP"], where),
             _positive_int(row["ContextTokens"], "ContextTokens", where),
             _positive_int(row["GeneratedTokens"], "GeneratedTokens", where))
            for where, row in _csv_rows(path)]


def _burstgpt(path: Path, opts: ReadOptions) -> list[tuple[float, int, int]]:
    """BurstGPT logs failed requests with 0 response tokens: they are not requests a
    server completed, so they are dropped, and counted in a note."""
    rows = [(_number(row["Timestamp"], "Timestamp", where),
             _positive_int(row["Request tokens"], "Request tokens", where),
             _positive_int(row["Response tokens"], "Response tokens", where))
            for where, row in _csv_rows(path)]
    kept = [r for r in rows if r[2] > 0]
    if len(kept) < len(rows):
        opts.notes.append(f"{path.name}: {len(rows) - len(kept):,} of {len(rows):,} BurstGPT rows are failed "
                          "requests (0 response tokens) and were dropped")
    if rows and not kept:
        raise WorkloadError(f"{path}: every BurstGPT row is a failed request (0 response tokens)")
    return kept


def _vidur(path: Path, _opts: ReadOptions) -> list[tuple[float | None, int, int]]:
    return [(_number(row["arrived_at"], "arrived_at", where) if "arrived_at" in row else None,
             _positive_int(row["num_prefill_tokens"], "num_prefill_tokens", where),
             _positive_int(row["num_decode_tokens"], "num_decode_tokens", where))
            for where, row in _csv_rows(path)]


def _vidur_metrics(path: Path, _opts: ReadOptions) -> list[tuple[float, int, int, int]]:
    """Vidur's ``request_metrics.csv``: arrival is the running sum of
    ``request_inter_arrival_delay`` (empty for the first request), ids are Vidur's."""
    rows, t = [], 0.0
    for where, row in _csv_rows(path):
        gap = row["request_inter_arrival_delay"].strip()
        t += _number(gap, "request_inter_arrival_delay", where) if gap else 0.0
        rows.append((t, _positive_int(row["request_num_prefill_tokens"], "request_num_prefill_tokens", where),
                     _positive_int(row["request_num_decode_tokens"], "request_num_decode_tokens", where),
                     _positive_int(row["Request Id"], "Request Id", where)))
    return rows


def _record(obj: Any, where: str, counter: TokenCounter | None = None) -> tuple:
    """(arrival or None, prompt tokens, output tokens) of a JSON object; with ``counter``, a
    ``prompt_token_ids`` list or a ``prompt`` text instead of a prompt length also gives the
    request's prefix ids (hashed per ``ID_BLOCK_TOKENS`` tokens)."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    prompt_key = next((k for k in _PROMPT_KEYS if k in obj), None)
    output_key = next((k for k in _OUTPUT_KEYS if k in obj), None)
    content = _prompt_content(obj, where, counter) if counter is not None else None
    if (prompt_key is None and content is None) or output_key is None:
        raise WorkloadError(f"{where}: expected an input length ({'/'.join(_PROMPT_KEYS)}) or a prompt "
                            f"(prompt, prompt_token_ids) and an output length ({'/'.join(_OUTPUT_KEYS)})")
    time_key = next((k for k in _TIME_KEYS if k in obj), None)
    arrival = _number(obj[time_key], time_key, where) * _TIME_KEYS[time_key] if time_key else None
    output = _positive_int(obj[output_key], output_key, where)
    # a length the trace states wins over one counted from the text; the text gives identity
    prompt = _positive_int(obj[prompt_key], prompt_key, where) if prompt_key is not None else content[0]
    if content is not None:
        return (arrival, prompt, output, None, content[1], ID_BLOCK_TOKENS)
    return (arrival, prompt, output)


def _prompt_content(obj: dict, where: str, counter: TokenCounter) -> tuple[int, tuple[int, ...]] | None:
    """(prompt tokens, prefix ids) from ``prompt_token_ids`` or a ``prompt`` text; None without."""
    ids = obj.get("prompt_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise WorkloadError(f"{where}: prompt_token_ids: expected a list of integers")
        return len(ids), token_prefix_ids(ids)
    text = obj.get("prompt")
    if text is None:
        return None
    if not isinstance(text, str):
        raise WorkloadError(f"{where}: prompt: expected a text")
    seq = counter.sequences([text], [""])[0]
    return seq.prompt_tokens, seq.prefix_ids


MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces' hash_ids: one per 512-token block


def _hash_ids(obj: dict, where: str) -> tuple[int, ...]:
    ids = obj.get("hash_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise WorkloadError(f"{where}: hash_ids: expected a list of integers")
    return tuple(ids)


def _mooncake(path: Path, opts: ReadOptions) -> list[tuple]:
    """JSON lines; Mooncake's ``hash_ids`` (equal ids: equal 512-token blocks) are kept as
    the requests' prefix identity; a ``prompt`` text or ``prompt_token_ids`` are hashed."""
    rows, counter = [], token_counter(opts.tokenizer)
    with path.open() as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            where = f"{path}:{line}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: invalid JSON: {exc.msg}") from None
            row = _record(obj, where, counter)
            ids = _hash_ids(obj, where)
            rows.append((*row, None, ids, MOONCAKE_BLOCK_TOKENS) if ids else row)
    return rows


def _sharegpt(path: Path, opts: ReadOptions) -> list[tuple[None, int, int]]:
    return sharegpt_rows(path, token_counter(opts.tokenizer), opts.notes)


def _json_lengths(path: Path, _opts: ReadOptions) -> list[tuple[float | None, int, int]]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: expected a JSON list of requests")
    return [_record(obj, f"{path}: item {i}") for i, obj in enumerate(data)]


FORMATS: dict[str, Callable[[Path, ReadOptions], list[tuple]]] = {
    "azure": _azure, "mooncake": _mooncake, "burstgpt": _burstgpt, "sharegpt": _sharegpt,
    "json-lengths": _json_lengths, "vidur": _vidur, "vidur-metrics": _vidur_metrics,
}
_JSON_LIST_FORMATS = ("sharegpt", "json-lengths")

_HEADER_HINTS = (("TIMESTAMP", "azure"), ("Request tokens", "burstgpt"),
                 ("request_inter_arrival_delay", "vidur-metrics"), ("num_prefill_tokens", "vidur"))


_EXPECTED = {"azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
             "burstgpt": "Timestamp,Request tokens,Response tokens",
             "vidur": "arrived_at,num_prefill_tokens,num_decode_tokens",
             "vidur-metrics": "Request Id,request_inter_arrival_delay,request_num_prefill_tokens,...",
             "mooncake": "JSON lines with timestamp, input_length, output_length",
             "sharegpt": "a JSON list of {\"conversations\": [{\"from\", \"value\"}, ...]}",
             "json-lengths": "a JSON list of objects with input/output lengths"}


def _content_kind(path: Path) -> str | None:
    """'jsonl' or 'json' when the file's content is JSON, whatever its extension."""
    try:
        with path.open() as handle:
            first = handle.readline().lstrip()
    except UnicodeDecodeError:
        return None
    if first.startswith("{"):
        return "jsonl"
    if first.startswith("["):
        return "json"
    return None


def detect_format(path: Path) -> str:
    """Guess a trace's format from its content (JSON or not) and first line."""
    kind = _content_kind(path)
    if kind == "jsonl" or (kind is None and path.suffix.lower() == ".jsonl"):
        return "mooncake"
    if kind == "json" or (kind is None and path.suffix.lower() == ".json"):
        return "sharegpt" if is_sharegpt(path) else "json-lengths"
    with path.open() as handle:
        header = handle.readline()
    for hint, name in _HEADER_HINTS:
        if hint in header:
            return name
    expected = "; ".join(f"{k}: {v}" for k, v in _EXPECTED.items())
    if not header.strip():
        raise WorkloadError(f"{path}: the file is empty")
    raise WorkloadError(f"{path}: cannot tell the trace format from its content (first line: "
                        f"{header.strip()[:80]!r}); expected columns per format: {expected}; for other "
                        "column names: --columns time=COL,prompt=COL,output=COL")


def _check_kind(path: Path, fmt: str) -> None:
    """A CSV format on a JSON file (or the reverse) is a clear error, not 17 odd columns."""
    kind = _content_kind(path)
    if kind and fmt not in ("mooncake", *_JSON_LIST_FORMATS):
        raise WorkloadError(f"{path}: is JSON ({'lines' if kind == 'jsonl' else 'a list'}), but --format "
                            f"{fmt} expects CSV columns {_EXPECTED.get(fmt, '')}; use --format "
                            f"{'mooncake' if kind == 'jsonl' else 'sharegpt or json-lengths'} or leave --format out")


def _columns(path: Path) -> str:
    """The columns (or first object's keys) a trace has, for error messages."""
    try:
        with path.open() as handle:
            first_line = handle.readline().strip()
        if first_line.startswith("{"):
            return ", ".join(json.loads(first_line))
        if first_line.startswith("["):
            data = json.loads(path.read_text())
            return ", ".join(data[0]) if data and isinstance(data[0], dict) else "none"
        return first_line
    except (ValueError, OSError, UnicodeDecodeError):
        return "unreadable"


def _draw_arrivals(spec: str, n: int, seed: int) -> list[float]:
    """``poisson:R`` or ``uniform:R``: arrival times for n requests at R requests/s."""
    kind, _, rate_text = spec.partition(":")
    try:
        rate = float(rate_text)
    except ValueError:
        rate = float("nan")
    if kind not in ("poisson", "uniform") or not rate > 0 or rate == float("inf"):
        raise WorkloadError(f"--arrivals: expected poisson:R or uniform:R with R > 0 requests/s, got {spec!r}")
    if kind == "uniform":
        return [i / rate for i in range(n)]
    import numpy as np
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    return list(np.concatenate([[0.0], np.cumsum(gaps[:-1])]))


def parse_columns(text: str) -> dict[str, str]:
    """``time=ts,prompt=in,output=out`` -> {"time": "ts", ...}; prompt and output required,
    and the request-class columns (``workload.class_columns``) optional."""
    mapping = {}
    for part in text.split(","):
        key, sep, col = part.partition("=")
        if not sep or key.strip() not in ("time", "prompt", "output", *CLASS_COLUMNS) or not col.strip():
            raise WorkloadError(f"--columns: expected time=COL,prompt=COL,output=COL[,{'=COL,'.join(CLASS_COLUMNS)}"
                                f"=COL], got {text!r}")
        mapping[key.strip()] = col.strip()
    if not {"prompt", "output"} <= set(mapping):
        raise WorkloadError(f"--columns: prompt=COL and output=COL are required, got {text!r}")
    return mapping


def _mapped(path: Path, columns: dict[str, str], time_unit_s: float) -> list[tuple[float | None, int, int]]:
    """A CSV or JSONL trace read through a column mapping."""
    if _content_kind(path) == "json":
        raise WorkloadError(f"{path}: --columns reads CSV or JSON lines, not a JSON list")
    if _content_kind(path) == "jsonl":
        items = []
        with path.open() as handle:
            for line, text in enumerate(handle, start=1):
                if text.strip():
                    try:
                        items.append((f"{path}:{line}", json.loads(text)))
                    except json.JSONDecodeError as exc:
                        raise WorkloadError(f"{path}:{line}: invalid JSON: {exc.msg}") from None
    else:
        items = list(_csv_rows(path))
    rows = []
    for where, row in items:
        missing = [c for c in columns.values() if c not in row]
        if missing:
            raise WorkloadError(f"{where}: no column {missing[0]!r} (has: {', '.join(map(str, row))})")
        t = _number(row[columns["time"]], columns["time"], where) * time_unit_s if "time" in columns else None
        rows.append((t, _positive_int(row[columns["prompt"]], columns["prompt"], where),
                     _positive_int(row[columns["output"]], columns["output"], where), None, (), 0,
                     class_fields(row, columns, where)))
    return rows


def load_trace(path: str | Path, fmt: str | None = None, arrivals: str | None = None,
               seed: int = 0, columns: dict[str, str] | None = None, time_unit: str = "s",
               tokenizer: str | None = None, notes: list[str] | None = None) -> list[Request]:
    """Load a trace file as requests sorted by arrival, first arrival at 0 s. A trace
    without arrival times needs ``arrivals`` (``poisson:R`` / ``uniform:R``), which
    replaces them in file order; with arrival times, ``arrivals`` is an error.
    ``tokenizer`` (a local tokenizer.json or its folder) counts the tokens of text
    formats; one-line notes on rows dropped or lengths estimated are appended to
    ``notes``."""
    path = Path(path)
    if path.is_dir():
        raise WorkloadError(f"{path}: is a directory, not a trace file")
    if not path.is_file():
        raise WorkloadError(missing_trace(path))
    if path.stat().st_size == 0:
        raise WorkloadError(f"{path}: the file is empty")
    if columns is not None:
        if time_unit not in ("s", "ms"):
            raise WorkloadError(f"--time-unit: expected s or ms, got {time_unit!r}")
        fmt = "columns"
    else:
        fmt = fmt or detect_format(path)
        if fmt not in FORMATS:
            raise WorkloadError(f"unknown trace format {fmt!r}; expected one of: {', '.join(FORMATS)}")
        _check_kind(path, fmt)
    opts = ReadOptions(tokenizer)
    try:
        rows = (_mapped(path, columns, 1e-3 if time_unit == "ms" else 1.0) if columns is not None
                else FORMATS[fmt](path, opts))
    except KeyError as exc:
        raise WorkloadError(f"{path}: missing column {exc.args[0]!r} for format {fmt}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not a text file") from None
    if notes is not None:
        notes.extend(opts.notes)
    if not rows:
        raise WorkloadError(f"{path}: the trace has no requests")
    timed = [r[0] is not None for r in rows]
    if arrivals is not None:
        if any(timed):
            raise WorkloadError(f"{path}: has arrival times; --arrivals only applies to traces without them "
                                "(use --rate to rescale real arrivals)")
        rows = [(t, *r[1:]) for t, r in zip(_draw_arrivals(arrivals, len(rows), seed), rows)]
    elif not all(timed):
        raise WorkloadError(f"{path}: no arrival times (columns found: {_columns(path)}); expected "
                            f"{'arrived_at' if fmt == 'vidur' else 'timestamp (ms), arrival_s or arrived_at (s)'}, "
                            "or pass --arrivals poisson:R|uniform:R")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    # formats with their own request ids keep them (to match results by id); rows may add
    # (id or None, prefix ids, tokens per id, class fields from --columns priority=, tenant=, ...)
    return [Request(r[3] if len(r) > 3 and r[3] is not None else i, r[0] - t0, max(1, r[1]), max(1, r[2]),
                    *(r[4:6] if len(r) > 4 else ()), **(r[6] if len(r) > 6 else {}))
            for i, r in enumerate(rows)]
