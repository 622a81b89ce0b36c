"""What a policy may return. Runtimes (simulator, gateway) execute these."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from baton.core.instance import Role


@dataclass(slots=True, frozen=True)
class ArrivalPlan:
    """Placement of a new request, filled in by arrival stages in pipeline order.

    - ``prefill_instance``: where the prefill runs.
    - ``decode_instance``: set now for early binding (SIBYL); left None for late binding.
    - ``prefill_chunk_limit_tokens``: cap on this request's prefill chunk per iteration,
      used when the prefill is deflected onto a decode-capable instance (Kairos).
    - ``reject_reason``: set to reject the request; the runtime records the reason.
    - ``role_changes``: instances to flip before the request is placed (Arrow moves an
      instance between pools while dispatching); the runtime applies them first.
    - ``watch_context_tokens``: a ``Watch`` at this context length, reported to the stage
      that set it (``watch_stage``, filled in by the scheduler) through ``on_threshold``
      (CascadeInfer's stage boundary).
    """

    prefill_instance: int | None = None
    decode_instance: int | None = None
    prefill_chunk_limit_tokens: int | None = None
    reject_reason: str | None = None
    role_changes: tuple["ChangeRole", ...] = ()
    watch_context_tokens: int | None = None
    watch_stage: int | None = None

    @property
    def rejected(self) -> bool:
        return self.reject_reason is not None


class MigrationMode(str, enum.Enum):
    """How a running decode moves.

    - ``live``: pre-copy the KV in rounds while it keeps decoding, pause for the last delta;
    - ``stop-copy``: pause it and copy the whole context (ARES section 4.4: the paused
      request's KV is sent while the rest of the batch runs on);
    - ``recompute``: drop it at the source and re-prefill its context on the target.
    """

    LIVE = "live"
    STOP_COPY = "stop-copy"
    RECOMPUTE = "recompute"


@dataclass(slots=True, frozen=True)
class Migrate:
    """Move a decoding request to ``target_instance``."""

    req_id: int
    target_instance: int
    mode: MigrationMode = MigrationMode.LIVE


@dataclass(slots=True, frozen=True)
class ChangeRole:
    """Change an instance's role; work already on it drains (finishes) where it is."""

    instance_id: int
    role: Role


@dataclass(slots=True, frozen=True)
class Deflect:
    """Re-plan a request whose prefill is still queued (not started): prefill and decode it
    on ``instance`` in chunks of at most ``chunk_limit_tokens`` (Kairos's proactive
    deflection). A runtime ignores it once the prefill has started."""

    req_id: int
    instance: int
    chunk_limit_tokens: int


@dataclass(slots=True, frozen=True)
class DecodeChoice:
    """Late binding with side effects: decode on ``instance`` after applying
    ``role_changes`` (a stage's ``choose_decode`` may return this instead of an id)."""

    instance: int
    role_changes: tuple[ChangeRole, ...] = ()


@dataclass(slots=True, frozen=True)
class Watch:
    """Ask to be told (``Stage.on_threshold``) when a request's context reaches ``context_tokens``."""

    req_id: int
    context_tokens: int


Decision = Migrate | ChangeRole | Watch | Deflect
