"""Observations a runtime reports to policy stages (for estimators and bookkeeping)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Completed:
    """A request finished with ``output_tokens`` generated (its true length, now known)."""

    req_id: int
    output_tokens: int
    now_s: float


@dataclass(slots=True, frozen=True)
class DecodeProgress:
    """Instance ``instance_id`` ran ``iterations`` decode iterations; each running decode
    gained that many tokens. Reported once per batch-composition segment, not per token."""

    instance_id: int
    iterations: int
    mean_iteration_s: float
    now_s: float


@dataclass(slots=True, frozen=True)
class PrefillDone:
    """The prefill of ``req_id`` finished on ``instance_id`` (first token emitted)."""

    req_id: int
    instance_id: int
    now_s: float


Observation = Completed | DecodeProgress | PrefillDone
