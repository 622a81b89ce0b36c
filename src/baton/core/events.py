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


@dataclass(slots=True, frozen=True)
class HiddenState:
    """The serving model's last-layer hidden state for ``req_id`` after ``generated_tokens``
    output tokens (a vector of the model's width), for learned length predictors. Only live
    runtimes with a hidden-state source report it."""

    req_id: int
    generated_tokens: int
    vector: tuple[float, ...]
    now_s: float


Observation = Completed | DecodeProgress | PrefillDone | HiddenState
