"""The data at a simulated engine's boundary: its flags, the work it is given (queued
prefills, decodes joining its batch), a decode it gives up (migration), and what a
segment produced. ``engine.py`` holds the model that acts on them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from baton.core.decode_table import DecodeTable
from baton.core.settings import setting
from baton.perf.memory import MemoryFlags


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """One engine's flags, named as vLLM's: scheduler limits (tokens per iteration,
    sequences, tokens per KV block), the longest context it serves (None: no limit), and
    what sizes its KV cache: ``gpu_memory_utilization``, a KV connector's transfer buffer
    (``kv_buffer_bytes``), or ``kv_tokens`` set outright (see ``baton.perf.memory``)."""

    max_num_batched_tokens: int = setting(8192, gt=0, unit="tokens", flag=True, doc="tokens per iteration")
    max_num_seqs: int = setting(256, gt=0, flag=True, doc="running sequences per instance")
    block_size: int = setting(16, gt=0, unit="tokens", flag=True, doc="tokens per KV block")
    max_model_len: int | None = setting(None, gt=0, unit="tokens", flag=True,
                                        doc="longest prompt + output served (default: the model's own limit)")
    gpu_memory_utilization: float = setting(0.9, gt=0, le=1, flag=True,
                                            doc="share of GPU memory the engine may use (sizes the KV cache as "
                                                "vLLM does)")
    kv_buffer_bytes: float = setting(0.0, ge=0, unit="bytes", doc="a KV connector's transfer buffer, taken from "
                                                                   "the KV cache")
    kv_tokens: int | None = setting(None, gt=0, unit="tokens", flag=True,
                                    doc="KV cache tokens per instance (overrides the size computed from the memory "
                                        "flags)")
    reserve_full_sequence: bool = setting(True, doc="admit a prefill only when its whole prompt's blocks fit "
                                                    "(vLLM's scheduler_reserve_full_isl)")
    enable_prefix_caching: bool = setting(True, key="prefix_caching", flag="--enable-prefix-caching",
                                          doc="vLLM v1's automatic prefix caching: a prompt's cached full blocks "
                                              "cost no prefill (engine_model/prefix_cache.py)")

    def memory_flags(self) -> MemoryFlags:
        return MemoryFlags(self.gpu_memory_utilization, self.max_num_batched_tokens,
                           self.max_num_seqs, self.block_size, self.kv_buffer_bytes, self.kv_tokens)


class PrefillKind(enum.Enum):
    """Why a prefill is queued: a new request (``FRESH``; it may be deflected), a context
    recomputed where it was preempted or stuck (``RECOMPUTE``), or one recomputed on the
    target of a migration (``MIGRATE``). Only a fresh prefill's end hands off to decode."""

    FRESH = "fresh"
    RECOMPUTE = "recompute"
    MIGRATE = "migrate"


@dataclass(slots=True)
class PrefillItem:
    """Prefill work queued on this engine."""

    req_id: int
    total_tokens: int
    kind: PrefillKind
    stop_at: int
    generated: int
    chunk_limit: int | None = None
    done_tokens: int = 0
    blocks: int = 0
    admitted: bool = False
    admit_seq: int = 0


@dataclass(slots=True)
class DecodeJoin:
    """A request whose KV is here and that waits for a decode slot."""

    req_id: int
    ctx: int
    generated: int
    stop_at: int
    blocks: int
    last_token_s: float | None
    watch_ctx: int | None = None
    admit_seq: int = 0  # a prefill continuing here keeps its admission's place (vLLM's running order); 0: new here


@dataclass(slots=True, frozen=True)
class DecodeRow:
    """A decode taken out of its batch: context and output so far (tokens), the output
    length it stops at, and the KV blocks it held there."""

    req_id: int
    ctx: int
    generated: int
    stop_at: int
    blocks: int

    @classmethod
    def removed_from(cls, table: DecodeTable, req_id: int) -> DecodeRow:
        """Remove ``req_id``'s row from ``table`` and return it."""
        row = table.remove(req_id)
        return cls(req_id, row["ctx"], row["generated"], row["stop_at"], row["blocks"])


class SegmentResult:
    """What a finished segment produced, for the simulator to act on: its iterations, end
    time (s) and mean iteration (s); prefills that ended; decodes that finished; (request,
    context tokens) that reached a watched length; the token gaps, as (iter0_s, slope_s,
    iterations, rows present before, rows new this segment) with the iterations' times in
    ``gap_series`` where they are listed, not affine (a new row's first gap is in
    ``first_gaps``, its later ones follow the series); rows that had no token yet (PD
    handoffs: the decode side emits the first token) with its time; whether the batch held
    a deflected prefill's chunk. A plain class: one is made per segment, and a dataclass's
    default factories cost more than the lists."""

    __slots__ = ("iterations", "end_s", "mean_iteration_s", "prefilled", "finished", "thresholds", "gaps",
                 "first_gaps", "gap_series", "first_tokens", "with_deflected")

    def __init__(self, iterations: int, end_s: float, mean_iteration_s: float = 0.0) -> None:
        self.iterations, self.end_s, self.mean_iteration_s = iterations, end_s, mean_iteration_s
        self.prefilled: list[PrefillItem] = []
        self.finished: list[int] = []
        self.thresholds: list[tuple[int, int]] = []
        self.gaps: tuple[float, float, int, int, int] | None = None
        self.first_gaps: list[float] = []
        self.gap_series: tuple[float, ...] = ()
        self.first_tokens: list[tuple[int, float]] = []
        self.with_deflected = False
