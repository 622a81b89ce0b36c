"""The read-only window through which policies see the cluster."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from baton.core.instance import InstanceState
from baton.core.request import Phase, RequestState


class ClusterView:
    """Instances, requests and the current time, as maintained by a runtime.

    Reads are cheap: aggregates are kept incrementally by the runtime and decode
    progress is extrapolated in closed form. Candidate lists are cached and rebuilt only
    when roles or health change (``invalidate_roles``). Policies must treat everything
    here as read-only.
    """

    def __init__(self, instances: Mapping[int, InstanceState],
                 requests: Mapping[int, RequestState]) -> None:
        self._instances = instances
        self._requests = requests
        self.now_s = 0.0
        self._prefill_ids: list[int] | None = None
        self._decode_ids: list[int] | None = None

    # --- instances -------------------------------------------------------------------
    def invalidate_roles(self) -> None:
        """Runtimes call this after a role or health change."""
        self._prefill_ids = self._decode_ids = None

    def _rebuild(self) -> None:
        live = [s for s in self._instances.values() if s.healthy]
        self._prefill_ids = [s.instance_id for s in live if s.role.prefills]
        self._decode_ids = [s.instance_id for s in live if s.role.decodes]

    @property
    def prefill_ids(self) -> list[int]:
        """Healthy instances that accept new prefills, in id order."""
        if self._prefill_ids is None:
            self._rebuild()
        return self._prefill_ids  # type: ignore[return-value]

    @property
    def decode_ids(self) -> list[int]:
        """Healthy instances that accept new decodes, in id order."""
        if self._decode_ids is None:
            self._rebuild()
        return self._decode_ids  # type: ignore[return-value]

    def instance(self, instance_id: int) -> InstanceState:
        return self._instances[instance_id]

    def instances(self) -> list[InstanceState]:
        return list(self._instances.values())

    def kv_usage(self, instance_id: int) -> float:
        """Fraction of an instance's KV blocks in use now."""
        return self._instances[instance_id].kv_usage_at(self.now_s)

    def token_load(self, instance_id: int) -> int:
        """Tokens of work on an instance now (see ``InstanceState.token_load``)."""
        return self._instances[instance_id].token_load(self.now_s)

    # --- requests --------------------------------------------------------------------
    def request(self, req_id: int) -> RequestState:
        return self._requests[req_id]

    def active_request_ids(self) -> list[int]:
        return [r for r, s in self._requests.items() if not s.done]

    def generated_tokens(self, req_id: int) -> int:
        """Output tokens generated so far by a request, at ``now_s``."""
        state = self._requests[req_id]
        if state.phase is Phase.DECODE and state.decode_instance is not None:
            inst = self._instances[state.decode_instance]
            if req_id in inst.decodes:
                return inst.decodes.get(req_id, "generated") + inst.iterations_since_sync(self.now_s)
        return state.generated_tokens

    def context_tokens(self, req_id: int) -> int:
        """Prompt plus generated tokens of a request, at ``now_s``."""
        return self._requests[req_id].request.prompt_tokens + self.generated_tokens(req_id)

    def decode_snapshot(self, instance_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request ids, context tokens, generated tokens) of an instance's running decodes."""
        inst = self._instances[instance_id]
        k = inst.iterations_since_sync(self.now_s)
        table = inst.decodes
        return table.col("req_id").copy(), table.col("ctx") + k, table.col("generated") + k

    def decode_rate_tokens_per_s(self, req_id: int) -> float:
        """Observed decode rate of a request: tokens since decode start over elapsed time,
        or its instance's current rate before it has a history."""
        state = self._requests[req_id]
        inst_id = state.decode_instance
        if inst_id is None:
            return 0.0
        inst = self._instances[inst_id]
        if state.decode_start_s is not None and self.now_s > state.decode_start_s:
            made = self.generated_tokens(req_id) - 1
            if made > 0:
                return made / (self.now_s - state.decode_start_s)
        return inst.decode_rate_tokens_per_s(self.now_s)
