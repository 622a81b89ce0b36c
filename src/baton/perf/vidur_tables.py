"""Operator times from Vidur-format profile CSVs, for any model and tensor-parallel degree.

Vidur (github.com/microsoft/vidur) profiles a model's operators on a GPU and stores them
as CSVs; Baton reads the three it needs from one folder (plain ``.csv`` or ``.csv.xz``):

- ``mlp.csv``: per layer, every linear operator's median time (``time_stats.<op>.median``,
  ms) by ``num_tokens`` and ``num_tensor_parallel_workers``;
- ``attention.csv``: decode attention by (``batch_size``, ``kv_cache_size``) and prefill
  attention by (``prefill_chunk_size``, ``kv_cache_size``: the context, chunk included),
  by ``num_tensor_parallel_workers``, at ``block_size`` 16;
- ``all_reduce.csv`` (only for TP > 1): one all-reduce by message ``size`` (bytes),
  ``num_workers`` and ``devices_per_node``.

``OperatorTables`` holds them as curves (ms per layer, medians per shape, interpolated
linearly). Errors name the file and what is missing; a Git LFS pointer (Vidur keeps its
attention profiles in LFS, so a plain clone has only pointers) is called one.
"""

from __future__ import annotations

import csv
import io
import lzma
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from baton.core.errors import ConfigError

LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act",
              "input_layernorm", "post_attention_layernorm", "attn_rope", "add")
NCCL_LAUNCH_MS = 0.02        # Vidur's nccl_cpu_launch_overhead_ms: CPU cost of one collective

Curve = tuple[np.ndarray, np.ndarray]


def _curve(points: dict[float, list[float]]) -> Curve:
    xs = np.array(sorted(points), dtype=np.float64)
    return xs, np.array([float(np.mean(points[x])) for x in xs])


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".xz":
        return io.TextIOWrapper(lzma.open(path), newline="")
    return path.open(newline="")


def _find(directory: Path, stem: str) -> Path:
    for name in (f"{stem}.csv", f"{stem}.csv.xz"):
        if (directory / name).is_file():
            return directory / name
    raise ConfigError(f"{directory}: no {stem}.csv (or {stem}.csv.xz), which a Vidur profile folder holds")


def read_rows(path: Path, needed: tuple[str, ...]) -> list[dict[str, str]]:
    """Every row of a profile CSV, checking the columns Baton reads are there."""
    try:
        with _open_text(path) as handle:
            head = handle.read(200)
            if head.startswith("version https://git-lfs"):
                raise ConfigError(f"{path}: a Git LFS pointer, not the profile; fetch it with git lfs pull")
            handle.seek(0)
            reader = csv.DictReader(handle)
            missing = [c for c in needed if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}")
            return list(reader)
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the profile: {exc}") from None


def _number(path: Path, line: int, row: dict[str, str], column: str) -> float:
    try:
        return float(row[column] or 0.0)
    except ValueError:
        raise ConfigError(f"{path}:{line}: column {column!r}: expected a number, got {row[column]!r}") from None


def _for_tp(path: Path, rows: list[dict[str, str]], column: str, tp: int) -> list[tuple[int, dict[str, str]]]:
    """(line, row) pairs profiled at ``tp`` GPUs; an error lists the degrees present."""
    kept = [(i, r) for i, r in enumerate(rows, start=2) if r[column].strip() == str(tp)]
    if not kept:
        have = sorted({r[column] for r in rows})
        raise ConfigError(f"{path}: no rows for tensor parallelism {tp} (profiled: {', '.join(have) or 'none'})")
    return kept


@dataclass(slots=True)
class OperatorTables:
    """Per-layer operator curves (ms): ``linear`` by tokens, ``allreduce`` by tokens (None
    at TP 1), ``decode[batch]`` by context, ``prefill[chunk]`` by context incl. the chunk."""

    linear: Curve
    allreduce: Curve | None
    decode: dict[int, Curve]
    prefill: dict[int, Curve]

    @classmethod
    def from_dir(cls, directory: str | Path, tp: int, hidden: int) -> "OperatorTables":
        """Read a Vidur profile folder for ``tp`` GPUs of a model of width ``hidden``."""
        d = Path(directory)
        if not d.is_dir():
            raise ConfigError(f"{d}: not a folder of Vidur profile CSVs")
        return cls.from_files(_find(d, "mlp"), _find(d, "attention"),
                              _find(d, "all_reduce") if tp > 1 else None, tp, hidden)

    @classmethod
    def from_files(cls, mlp: Path, attention: Path, all_reduce: Path | None, tp: int,
                   hidden: int) -> "OperatorTables":
        """Read the three profile files by path (``all_reduce`` only needed for TP > 1)."""
        decode, prefill = _attention(attention, tp)
        if tp > 1 and all_reduce is None:
            raise ConfigError(f"tensor parallelism {tp} needs an all_reduce.csv profile")
        reduce = _allreduce(all_reduce, tp, hidden) if tp > 1 and all_reduce is not None else None
        return cls(_linear(mlp, tp), reduce, decode, prefill)


def _linear(path: Path, tp: int) -> Curve:
    columns = tuple(f"time_stats.{op}.median" for op in LINEAR_OPS)
    rows = read_rows(path, ("num_tokens", "num_tensor_parallel_workers", columns[0]))
    points: dict[float, list[float]] = defaultdict(list)
    for line, row in _for_tp(path, rows, "num_tensor_parallel_workers", tp):
        ms = sum(_number(path, line, row, c) for c in columns if c in row)
        points[_number(path, line, row, "num_tokens")].append(ms)
    return _curve(points)


def _allreduce(path: Path, tp: int, hidden: int) -> Curve:
    rows = read_rows(path, ("size", "num_workers", "devices_per_node", "time_stats.all_reduce.median"))
    points: dict[float, list[float]] = defaultdict(list)
    for line, row in _for_tp(path, rows, "num_workers", tp):
        if row["devices_per_node"].strip() == str(tp):  # within one node, as TP runs
            tokens = _number(path, line, row, "size") / (hidden * 2)
            points[tokens].append(_number(path, line, row, "time_stats.all_reduce.median"))
    if not points:
        raise ConfigError(f"{path}: no single-node all-reduce among {tp} GPUs")
    return _curve(points)


def _attention(path: Path, tp: int) -> tuple[dict[int, Curve], dict[int, Curve]]:
    need = ("num_tensor_parallel_workers", "block_size", "prefill_chunk_size", "kv_cache_size",
            "batch_size", "time_stats.attn_decode.median", "time_stats.attn_prefill.median")
    rows = read_rows(path, need)
    dec: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    pre: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line, row in _for_tp(path, rows, "num_tensor_parallel_workers", tp):
        if row["block_size"].strip() != "16":
            continue
        chunk, kv = int(_number(path, line, row, "prefill_chunk_size")), _number(path, line, row, "kv_cache_size")
        if chunk == 0:
            dec[int(_number(path, line, row, "batch_size"))][kv].append(
                _number(path, line, row, "time_stats.attn_decode.median"))
        else:
            pre[chunk][kv].append(_number(path, line, row, "time_stats.attn_prefill.median"))
    if not dec or not pre:
        raise ConfigError(f"{path}: needs both decode rows (prefill_chunk_size 0) and prefill rows "
                          f"at block_size 16 for tensor parallelism {tp}")
    return {b: _curve(v) for b, v in dec.items()}, {c: _curve(v) for c, v in pre.items()}
