"""What a policy may return. Runtimes (simulator, gateway) execute these."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from baton.core.errors import BatonError
from baton.core.instance import Role

if TYPE_CHECKING:
    from baton.core.view import ClusterView


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


class DecisionError(BatonError):
    """A policy returned a decision no runtime can carry out: an unknown decision type, or
    one naming an instance that does not exist (a policy bug, raised in both runtimes)."""


class Executor(Protocol):
    """What a runtime does for each decision (the simulator and the gateway's control
    implement it). ``dispatch`` has already checked the decision is neither unknown nor
    stale; the executor does the side effects only its runtime can do."""

    def change_role(self, decision: ChangeRole, stage_index: int) -> None: ...

    def migrate(self, decision: Migrate, stage_index: int) -> None: ...

    def watch(self, decision: Watch, stage_index: int) -> None: ...

    def deflect(self, decision: Deflect, stage_index: int) -> None: ...

    def note_stale(self, kind: str) -> None:
        """A decision about a request that has ended since the policy read the view."""


# decision type -> its kind label, which is also the Executor method that carries it out
_KINDS: dict[type, str] = {ChangeRole: "change_role", Migrate: "migrate", Watch: "watch", Deflect: "deflect"}


def decision_kind(decision: object) -> str:
    """The label of a decision type (``migrate``, ``change_role``, ``watch``, ``deflect``)."""
    found = _KINDS.get(type(decision))
    if found is None:
        raise DecisionError(f"unknown decision {decision!r}; a policy may return only "
                            f"{', '.join(t.__name__ for t in _KINDS)}")
    return found


def dispatch(decision: Decision, executor: Executor, view: "ClusterView", stage_index: int) -> bool:
    """Carry out one decision through ``executor``; the one place both runtimes decide
    what is unknown (raises ``DecisionError``) and what is stale (dropped, counted through
    ``executor.note_stale``, returns False): a decision about a request that has ended, as
    happens live when a request finishes between a tick and its decisions."""
    kind = decision_kind(decision)
    instance = decision.instance_id if isinstance(decision, ChangeRole) else (
        decision.target_instance if isinstance(decision, Migrate) else getattr(decision, "instance", None))
    if instance is not None and not view.has_instance(instance):
        raise DecisionError(f"{kind} decision {decision!r} names instance {instance}, which does not exist")
    req_id = getattr(decision, "req_id", None)
    if req_id is not None and not view.has_request(req_id):
        executor.note_stale(kind)
        return False
    getattr(executor, kind)(decision, stage_index)
    return True


def apply_plan(plan: ArrivalPlan, executor: Executor, view: "ClusterView") -> str | None:
    """Apply an arrival plan's side effects in the one order both runtimes use: its role
    changes first, then its verdict. Returns None when the plan places the request, else
    the reason it does not (``plan.reject_reason``, or ``no_prefill_instance``). A plan
    naming an instance that does not exist or is unhealthy raises ``DecisionError``."""
    for change in plan.role_changes:
        dispatch(change, executor, view, -1)
    if plan.rejected:
        return plan.reject_reason or "rejected"
    if plan.prefill_instance is None:
        return "no_prefill_instance"
    check_usable(view, plan.prefill_instance, "prefill")
    if plan.decode_instance is not None:
        check_usable(view, plan.decode_instance, "decode")
    return None


def apply_decode_choice(choice: DecodeChoice | None, executor: Executor, view: "ClusterView") -> int | None:
    """Late binding: the choice's role changes first, then its instance (None: no choice)."""
    if choice is None:
        return None
    for change in choice.role_changes:
        dispatch(change, executor, view, -1)
    check_usable(view, choice.instance, "decode")
    return choice.instance


def check_usable(view: "ClusterView", instance_id: int, what: str) -> None:
    """Raise ``DecisionError`` unless ``instance_id`` exists and is healthy."""
    if not view.has_instance(instance_id) or not view.instance(instance_id).healthy:
        raise DecisionError(f"a policy chose {what} instance {instance_id}, which does not exist or is unhealthy")
