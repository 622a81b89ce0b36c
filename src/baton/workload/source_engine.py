"""The engine settings a trace was produced under, and where a simulated engine differs.

A Vidur run (``--format vidur-metrics``) writes ``config.json`` beside its
``request_metrics.csv``; the replica scheduler's token budget per iteration, its batch cap
and the KV block size shaped every latency in that trace. ``load_trace`` still returns
only the requests: ``source_engine(path, fmt)`` reads these settings from the same path
(the side channel; ``WorkloadConfig.source_engine()`` for an experiment's trace), and
``mismatches`` words each difference from the engine Baton simulates as one line.

Vidur's keys: ``cluster_config.replica_scheduler_config`` holds ``name`` (sarathi, vllm,
orca, ...), ``batch_size_cap`` (vLLM's ``max_num_seqs``) and the per-iteration token budget:
Sarathi's ``chunk_size`` (its whole budget, vLLM's ``max_num_batched_tokens``), vLLM's and
others' ``max_tokens_in_batch`` / ``max_batched_tokens``; ``cluster_config.cache_config``
(or the scheduler config) holds ``block_size``; ``cluster_config.replica_config`` the
model, tensor parallelism and device.

Vidur sizes its KV cache at run time and does not write the result: its memory planner
takes ``total_memory_gb`` x (1 - ``memory_margin_fraction``), subtracts 2 bytes per weight
of one GPU's share of the attention and MLP matrices (no embeddings, no LM head, no
activations), divides by the KV bytes per token on that GPU, and then keeps only whole
request slots of ``request_generator_config.max_tokens``: blocks = (max_tokens / block) x
slots. ``vidur_kv_tokens`` redoes that arithmetic (Llama-2-70B TP2 on A100-80G at 4,096
tokens per request: 13 slots, 53,248 tokens), so a comparison can give Baton's engine the
same capacity (``--kv-tokens``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from baton.core.errors import WorkloadError
from baton.workload.loaders import detect_format

_BUDGET_KEYS = ("chunk_size", "max_tokens_in_batch", "max_batched_tokens")
# field -> (Baton's CLI flag, YAML key under cluster.engine)
_FLAGS = {"max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
          "block_size": "--block-size"}


class EngineFlags(Protocol):
    """What ``mismatches`` compares (``baton.sim.EngineConfig`` has these)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    kv_tokens: int | None


@dataclass(slots=True, frozen=True)
class SourceEngine:
    """The settings of the engine a trace came from; None where the file does not say.
    ``budget_key`` is the source's own name for ``max_num_batched_tokens`` (tokens per
    iteration); ``max_num_seqs`` is its batch cap; ``block_size`` tokens per KV block."""

    file: str
    scheduler: str | None = None
    max_num_batched_tokens: int | None = None
    budget_key: str | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    model: str | None = None
    tensor_parallel_size: int | None = None
    device: str | None = None
    kv_tokens: int | None = None

    def label(self) -> str:
        """``Vidur sarathi (path/config.json)``: the engine, for messages."""
        return f"Vidur {self.scheduler or 'replica'} scheduler ({self.file})"


def _int(section: dict[str, Any], key: str, file: Path) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise WorkloadError(f"{file}: {key}: expected a positive integer, got {value!r}")
    return value


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _vidur(data: dict[str, Any], file: Path) -> SourceEngine | None:
    cluster = _section(data, "cluster_config")
    if not cluster:
        return None  # a config.json, but not a Vidur run's
    sched, cache, replica = (_section(cluster, k) for k in
                             ("replica_scheduler_config", "cache_config", "replica_config"))
    budget_key = next((k for k in _BUDGET_KEYS if sched.get(k) is not None), None)
    block = _int(cache, "block_size", file) or _int(sched, "block_size", file)
    name = sched.get("name")
    return SourceEngine(str(file), str(name) if name is not None else None,
                        _int(sched, budget_key, file) if budget_key else None, budget_key,
                        _int(sched, "batch_size_cap", file), block, replica.get("model_name"),
                        _int(replica, "tensor_parallel_size", file), replica.get("device"),
                        vidur_kv_tokens(data, block or 16))


def vidur_kv_tokens(data: dict[str, Any], block: int) -> int | None:
    """The KV capacity (tokens) Vidur's memory planner gave each replica; None when the
    config lacks a field it needs (see the module docstring)."""
    cluster = _section(data, "cluster_config")
    replica, cache = _section(cluster, "replica_config"), _section(cluster, "cache_config")
    model, device = _section(replica, "model_config"), _section(replica, "device_config")
    try:
        if cache.get("num_blocks"):
            return int(cache["num_blocks"]) * block
        tp, stages = int(replica["tensor_parallel_size"]), int(replica.get("num_pipeline_stages", 1))
        width, heads = int(model["embedding_dim"]), int(model["num_q_heads"])
        head_dim, q, kv = width // heads, heads // tp, int(model["num_kv_heads"]) // tp
        mlp = (3 if model.get("use_gated_mlp", True) else 2) * width * int(model["mlp_hidden_dim"]) // tp
        layers = int(model["num_layers"]) // stages
        weights = (width * head_dim * (2 * q + 2 * kv) + mlp) * layers
        free = int(device["total_memory_gb"]) * 1024 ** 3 * (1 - float(cache.get("memory_margin_fraction", 0.1)))
        tokens = int((free - 2 * weights) // (4 * head_dim * kv * layers))
        per_request = int(_section(data, "request_generator_config")["max_tokens"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return (per_request // block) * (tokens // per_request) * block if tokens > 0 else None


def source_engine(path: str | Path, fmt: str | None = None) -> SourceEngine | None:
    """The engine settings beside a trace (Vidur's ``config.json`` for ``vidur-metrics``);
    None for other formats or when there is no such file."""
    path = Path(path)
    if not path.is_file() or (fmt or detect_format(path)) != "vidur-metrics":
        return None
    file = path.parent / "config.json"
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{file}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{file}: cannot read the trace's engine config: {exc}") from None
    return _vidur(data, file) if isinstance(data, dict) else None


def mismatches(src: SourceEngine, engine: EngineFlags, where: str = "cluster.engine") -> list[str]:
    """One line per setting where ``engine`` differs from the trace's source engine,
    naming both values and the flag (and YAML key under ``where``) that sets it."""
    lines = []
    for field, flag in _FLAGS.items():
        want, have = getattr(src, field), getattr(engine, field)
        if want is None or want == have:
            continue
        own = f" ({src.budget_key})" if field == "max_num_batched_tokens" and src.budget_key else ""
        lines.append(f"the trace came from {src.label()} with {field} {want}{own}, but the simulated "
                     f"engine uses {have}: set {flag} {want} (or {where}.{field}) to simulate the same engine")
    if src.kv_tokens is not None and getattr(engine, "kv_tokens", None) != src.kv_tokens:
        have = engine.kv_tokens if getattr(engine, "kv_tokens", None) is not None else "its own size"
        lines.append(f"the trace came from {src.label()} whose memory planner gave each replica "
                     f"{src.kv_tokens} KV tokens, but the simulated engine uses {have}: set --kv-tokens "
                     f"{src.kv_tokens} (or {where}.kv_tokens) to simulate the same engine")
    return lines
