"""What migration and deflection may ask of the simulator: a narrow port, not the
``Simulator`` itself. ``Simulator`` satisfies ``SimPort`` structurally, so
``migration.py`` and ``deflection.py`` import this module and never ``simulator.py``;
event priorities and the flow-completion bookkeeping stay behind ``start_flow`` and
``stop_flow``. Times are in seconds, flow sizes in bytes, KV in blocks."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from baton.core.instance import InstanceState
from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.metrics import RunCounters
from baton.perf.model import PerfModel
from baton.engine_model.engine import Engine


class FlowKind(enum.Enum):
    """What a KV flow carries: a PD handoff's prompt KV, or a migrating decode's KV."""

    HANDOFF = "handoff"
    MIGRATION = "migration"


class FlowTag(NamedTuple):
    """Whose flow it is: the simulator hands a finished flow to its owner by this."""

    kind: FlowKind
    req_id: int


class SimPort(Protocol):
    """What migration and deflection may read and do in the simulated cluster."""

    @property
    def now(self) -> float: ...
    @property
    def states(self) -> Mapping[int, RequestState]: ...
    @property
    def instances(self) -> Mapping[int, InstanceState]: ...
    @property
    def engines(self) -> Mapping[int, Engine]: ...
    @property
    def view(self) -> ClusterView:
        """What policies see (read only; e.g. a decode's context now, mid-segment)."""
    @property
    def counters(self) -> RunCounters: ...
    @property
    def perf(self) -> PerfModel: ...
    @property
    def block_size(self) -> int:
        """Tokens per KV block (the cluster's engine flag)."""

    def kick(self, instance_id: int) -> None:
        """Make an engine notice new work: plan if idle, else cut its segment."""

    def reserve(self, instance_id: int, blocks: int) -> bool:
        """Take blocks for arriving KV on an instance and kick it; False if they are not
        free now or a waiting request is ahead."""

    def retry_receives(self, instance_id: int) -> None:
        """Blocks may have freed on an instance: start KV waiting to come in, and wake
        the engine if requests wait in its queue."""

    def start_flow(self, src: int, dst: int, nbytes: float, tag: FlowTag) -> int:
        """Start moving ``nbytes`` of KV from ``src`` to ``dst``; returns the flow id.
        When it ends, the simulator hands ``tag`` to its owner."""

    def stop_flow(self, flow_id: int) -> float:
        """End a flow now, whether or not it is through; returns the bytes it never sent
        (0.0 if it had already ended)."""

    def join(self, instance_id: int, st: RequestState, ctx: int, generated: int, blocks: int) -> None:
        """``st``'s KV (``ctx`` tokens, ``generated`` of them output, in ``blocks``
        already taken there) is on ``instance_id``: it joins the decode batch there."""
