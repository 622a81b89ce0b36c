"""Requests and their lifecycle state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Phase(enum.Enum):
    """Where a request is in its lifecycle."""

    WAITING = "waiting"          # arrived, prefill not started
    PREFILL = "prefill"          # prefill chunks running
    TRANSFER = "transfer"        # KV moving to the decode instance
    DECODE = "decode"            # its KV on the decode instance: in the batch or joining it
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass(slots=True, frozen=True)
class Request:
    """One inference request as it arrives.

    ``output_tokens`` is the true output length. Policies must not read it directly;
    only oracle estimators (``baton.predict.oracle``) do, so ablations stay honest.

    ``prefix_ids`` says what the tokens are, for prefix caching: one id per block of
    ``prefix_block_tokens`` tokens of the sequence (prompt, then output where known), equal
    ids meaning equal tokens (Mooncake's ``hash_ids``, 512 tokens each; hashes of token
    ids or text). Empty: the content is unknown and nothing is reused.
    """

    req_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_ids: tuple[int, ...] = ()
    prefix_block_tokens: int = 0
    priority: int = 0  # its band: higher goes first under flow control
    tenant: str = ""  # whose it is (flow control's fairness, per-tenant figures)
    ttft_slo_s: float | None = None  # its own targets (None: the run's)
    tpot_slo_s: float | None = None


@dataclass(slots=True)
class RequestState:
    """Mutable lifecycle state of a request, owned by the runtime, read by policies.

    Token counts for a request that is decoding live in its instance's decode table
    (they advance in closed form); use ``ClusterView.generated_tokens`` to read them.
    """

    request: Request
    phase: Phase = Phase.WAITING
    prefill_instance: int | None = None
    decode_instance: int | None = None
    bound_early: bool = False
    chunk_limit_tokens: int | None = None  # set when the prefill was deflected onto a decode instance
    generated_tokens: int = 0
    prefill_start_s: float | None = None
    first_token_s: float | None = None
    prefill_end_s: float | None = None
    handoff_start_s: float | None = None  # its KV's handoff to the decode instance began (blocks asked for)
    transfer_start_s: float | None = None
    transfer_end_s: float | None = None
    decode_start_s: float | None = None
    finish_s: float | None = None
    last_token_s: float | None = None
    reject_reason: str | None = None
    preemptions: int = 0
    migrations: int = 0
    migrating: bool = False
    path: list[int] = field(default_factory=list)
    # keys of the prompt's full blocks as its engines key them (``core/prefix.py``; live:
    # the gateway's chain over token ids), for prefix-aware placement; empty when unknown
    block_keys: tuple[int, ...] = ()

    @property
    def req_id(self) -> int:
        return self.request.req_id

    @property
    def done(self) -> bool:
        return self.phase in (Phase.FINISHED, Phase.REJECTED)

    def visit(self, instance_id: int) -> None:
        """Append an instance to the request's path unless it is already the last one."""
        if not self.path or self.path[-1] != instance_id:
            self.path.append(instance_id)
