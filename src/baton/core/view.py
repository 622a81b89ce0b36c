"""The read-only window through which policies see the cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from baton.core.info import EXACT, EngineSample, InfoModel
from baton.core.instance import DEFAULT_LINK_BYTES_PER_S, InstanceState
from baton.core.load_columns import LoadColumns
from baton.core.request import Phase, RequestState


_NEVER_SCRAPED = EngineSample(float("-inf"), 0, 0, 0.0, 0.0)
# Up to these many instances the per-instance reads cost less than the columns' numpy calls
# (medians on the demo workload's clusters: the least token load of 12 decode instances
# 14 us against 33, of 48 52 against 68; the prefill loads of 4 instances 4.7 us against 8.5,
# of 16 10.1 against 8.6), with the same values.
_SCALAR_LEAST_LOAD_IDS = 32
_SCALAR_PREFILL_LOAD_IDS = 8


class PrefixSource(Protocol):
    """Where a runtime finds which instances hold which prefix blocks cached."""

    def matches(self, keys: Sequence[int]) -> dict[int, int]:
        """Instance -> how many leading ``keys`` it holds cached (absent: none)."""
        ...


class ClusterView:
    """Instances, requests and the current time, as maintained by a runtime.

    Reads are cheap: aggregates are kept incrementally by the runtime and decode
    progress is extrapolated in closed form. Which fields are the router's own bookings
    and which are scraped engine metrics (and how stale) is set by ``info``
    (``baton.core.info``). Candidate lists are cached and rebuilt only
    when roles or health change (``invalidate_roles``). Policies must treat everything
    here as read-only.
    """

    def __init__(self, instances: Mapping[int, InstanceState],
                 requests: Mapping[int, RequestState], info: InfoModel = EXACT,
                 prefix_source: PrefixSource | None = None) -> None:
        self._instances = instances
        self._requests = requests
        self.info = info
        self.now_s = 0.0
        self._prefill_ids: list[int] | None = None
        self._decode_ids: list[int] | None = None
        self._decode_set: frozenset[int] = frozenset()
        self.prefix_source = prefix_source  # where runtimes that see engine caches find them
        self._columns = LoadColumns(instances)

    # --- instances -------------------------------------------------------------------
    def invalidate_roles(self) -> None:
        """Runtimes call this after a role, health or membership change."""
        self._prefill_ids = self._decode_ids = None
        self._columns.revalidate()

    def _rebuild(self) -> None:
        live = [s for s in self._instances.values() if s.healthy]
        self._prefill_ids = [s.instance_id for s in live if s.role.prefills]
        self._decode_ids = [s.instance_id for s in live if s.role.decodes]
        self._decode_set = frozenset(self._decode_ids)

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

    def accepts_decodes(self, instance_id: int) -> bool:
        """Whether ``instance_id`` is one of ``decode_ids`` (a set lookup, not a scan)."""
        if self._decode_ids is None:
            self._rebuild()
        return instance_id in self._decode_set

    def instance(self, instance_id: int) -> InstanceState:
        return self._instances[instance_id]

    def link_bytes_per_s(self, *instance_ids: int) -> float:
        """The KV link (bytes/s) a move between ``instance_ids`` gets: the slowest of
        theirs (of every instance's when none is named). A cluster fact the runtime sets."""
        ids = instance_ids or tuple(self._instances)
        return min((self._instances[i].link_bytes_per_s for i in ids), default=DEFAULT_LINK_BYTES_PER_S)

    def has_instance(self, instance_id: int) -> bool:
        """Whether ``instance_id`` is an instance of this cluster (healthy or not)."""
        return instance_id in self._instances

    def instances(self) -> list[InstanceState]:
        return list(self._instances.values())

    def prefix_matches(self, keys: Sequence[int]) -> dict[int, int]:
        """Instance -> how many leading ``keys`` (a prompt's block keys) its engine holds
        in its prefix cache: the simulator's engine caches, or what the engines' KV events
        said live. Empty when the runtime has no such source."""
        if self.prefix_source is None or not keys:
            return {}
        return self.prefix_source.matches(keys)

    def kv_usages(self, ids: Sequence[int]) -> np.ndarray:
        """``kv_usage`` of every instance of ``ids`` (scraped: read as a column)."""
        if self.info.mode.scraped:
            cols = self._columns
            return cols.column("s_kv", cols.slots(ids))
        return np.array([self.kv_usage(i) for i in ids], dtype=np.float64)

    def token_intervals(self, ids: Sequence[int]) -> np.ndarray:
        """``token_interval_s`` of every instance of ``ids`` (scraped: read as a column)."""
        if self.info.mode.scraped:
            cols = self._columns
            return cols.column("s_interval", cols.slots(ids))
        return np.array([self.token_interval_s(i) for i in ids], dtype=np.float64)

    def prefill_moments(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``queued_prefill_moments`` of every instance of ``ids``: (counts, sums, sums
        of squares) of the prompt tokens queued there (own bookings)."""
        cols = self._columns
        slots = cols.slots(ids)
        return cols.column("queued", slots), cols.column("prefill", slots), cols.column("sq", slots)

    def decode_works(self, ids: Sequence[int]) -> np.ndarray:
        """``decode_work`` of every instance of ``ids`` (decodes running or with KV on the way)."""
        cols = self._columns
        slots = cols.slots(ids)
        return cols.column("n", slots) + cols.column("incoming_n", slots)

    def running_tokens_of(self, ids: Sequence[int]) -> np.ndarray:
        """``running_tokens`` of every instance of ``ids`` (tokens)."""
        if self.info.mode.bookings:
            cols = self._columns
            slots = cols.slots(ids)
            return cols.decode_ctx_tokens(slots, self.now_s) + cols.column("incoming", slots)
        return np.array([self.running_tokens(i) for i in ids], dtype=np.float64)

    # --- engine metrics: exact, or as of the last scrape (baton.core.info) ------------
    def engine_sample(self, instance_id: int) -> EngineSample:
        """The engine metrics a policy may see for an instance now."""
        inst = self._instances[instance_id]
        if not self.info.mode.scraped:
            return inst.engine_sample(self.now_s)
        return inst.sample or _NEVER_SCRAPED

    def running_requests(self, instance_id: int) -> int:
        """Requests the engine is running (vLLM's ``num_requests_running``)."""
        return self.engine_sample(instance_id).running

    def waiting_requests(self, instance_id: int) -> int:
        """Requests waiting in the engine's queue (``num_requests_waiting``)."""
        return self.engine_sample(instance_id).waiting

    def kv_usage(self, instance_id: int) -> float:
        """Fraction of an instance's KV blocks in use (``kv_cache_usage_perc``)."""
        return self.engine_sample(instance_id).kv_usage

    def token_interval_s(self, instance_id: int) -> float:
        """The instance's recent time between tokens of one request (s); 0 if unknown."""
        return self.engine_sample(instance_id).token_interval_s

    # --- own bookings (what the router placed and relayed); estimated without them ------
    def token_load(self, instance_id: int) -> float:
        """Tokens of work on an instance now (see ``InstanceState.token_load``); without
        own bookings, KV usage times capacity."""
        inst = self._instances[instance_id]
        if self.info.mode.bookings:
            return inst.token_load(self.now_s)
        return self.kv_usage(instance_id) * inst.kv_blocks_total * inst.block_size_tokens

    def token_loads(self, ids: Sequence[int]) -> np.ndarray:
        """``token_load`` of every instance of ``ids`` (tokens), read as columns: the
        same values as the per-instance reads, at a fraction of their cost (up to
        ``_SCALAR_LEAST_LOAD_IDS`` instances, the reads themselves cost less)."""
        if self.info.mode.bookings and len(ids) <= _SCALAR_LEAST_LOAD_IDS:
            insts, now_s = self._instances, self.now_s
            return np.array([insts[i].token_load(now_s) for i in ids], dtype=np.int64)
        if self.info.mode.bookings:
            cols = self._columns
            return cols.token_loads(cols.slots(ids), self.now_s)
        return np.array([self.token_load(i) for i in ids], dtype=np.float64)

    def least_token_load(self, ids: Sequence[int]) -> int | None:
        """The id of ``ids`` with the least ``token_load`` (the first of equals), or None:
        ``argmin`` of ``token_loads`` without computing every instance's load."""
        if not len(ids):
            return None
        if self.info.mode.bookings and len(ids) <= _SCALAR_LEAST_LOAD_IDS:
            insts, now_s = self._instances, self.now_s
            loads = [insts[i].token_load(now_s) for i in ids]
            return int(ids[loads.index(min(loads))])
        if self.info.mode.bookings:
            cols = self._columns
            return int(ids[cols.least_token_load(cols.slots(ids), self.now_s)])
        return int(ids[int(np.argmin(self.token_loads(ids)))])

    def token_loads_at_least(self, ids: Sequence[int], tokens: float) -> bool:
        """Whether every instance of ``ids`` has a ``token_load`` of at least ``tokens``."""
        if self.info.mode.bookings and len(ids):
            cols = self._columns
            return cols.token_loads_at_least(cols.slots(ids), self.now_s, tokens)
        return not len(ids) or bool(self.token_loads(ids).min() >= tokens)

    def prefill_loads(self, ids: Sequence[int]) -> np.ndarray:
        """``prefill_load`` of every instance of ``ids``, read as columns."""
        if self.info.mode.bookings and len(ids) > _SCALAR_PREFILL_LOAD_IDS:
            cols = self._columns
            return cols.prefill_loads(cols.slots(ids), self.now_s)
        return np.array([self.prefill_load(i) for i in ids], dtype=np.float64)

    def own_request_counts(self, ids: Sequence[int]) -> np.ndarray:
        """``own_requests`` of every instance of ``ids``, read as columns."""
        if self.info.mode.bookings:
            cols = self._columns
            return cols.column("reqs", cols.slots(ids))
        return np.array([self.own_requests(i) for i in ids], dtype=np.int64)

    def fewest_own_requests(self, ids: Sequence[int]) -> int:
        """The least ``own_requests`` of the instances of ``ids`` (non-empty)."""
        if self.info.mode.bookings:
            cols = self._columns
            return int(cols.column_min("reqs", cols.slots(ids)))
        return min(self.own_requests(i) for i in ids)

    def own_requests(self, instance_id: int) -> int:
        """Requests the router has outstanding on an instance (queued, incoming, decoding);
        without own bookings, the engine's running + waiting."""
        if self.info.mode.bookings:
            return self._instances[instance_id].num_requests
        return self.running_requests(instance_id) + self.waiting_requests(instance_id)

    def bound_requests(self, instance_id: int) -> int:
        """Requests bound early to decode on an instance whose KV has not started to move
        there (their shadow load; 0 without own bookings)."""
        return len(self._instances[instance_id].shadow) if self.info.mode.bookings else 0

    def incoming_tokens(self, instance_id: int) -> int:
        """KV tokens the router is moving to an instance (0 without own bookings)."""
        return self._instances[instance_id].incoming_tokens if self.info.mode.bookings else 0

    def prefill_load(self, instance_id: int) -> float:
        """Prefill work queued on an instance: tokens the router queued there (ties broken
        by decode context); without own bookings, the engine's waiting then running count."""
        if self.info.mode.bookings:
            inst = self._instances[instance_id]
            return inst.prefill_queue_tokens + inst.decode_ctx_tokens(self.now_s) * 1e-9
        return self.waiting_requests(instance_id) + self.running_requests(instance_id) * 1e-3

    def running_tokens(self, instance_id: int) -> float:
        """Context tokens of the decodes on an instance, running or with KV on the way
        (Arrow's decode load); without own bookings, KV usage times capacity."""
        inst = self._instances[instance_id]
        if self.info.mode.bookings:
            return inst.decode_ctx_tokens(self.now_s) + inst.incoming_tokens
        return self.kv_usage(instance_id) * inst.kv_blocks_total * inst.block_size_tokens

    def decode_work(self, instance_id: int) -> int:
        """Decodes the router has on an instance, running or with KV on the way."""
        inst = self._instances[instance_id]
        return inst.decodes.n + len(inst.incoming)

    def queued_prefills(self, instance_id: int) -> list[int]:
        """Prompt tokens still to prefill for each request queued on an instance, in
        queue order (own bookings)."""
        return list(self._instances[instance_id].prefill_queue.values())

    def queued_prefill_moments(self, instance_id: int) -> tuple[int, int, int]:
        """(count, sum, sum of squares) of the prompt tokens still queued on an instance:
        enough to total any quadratic per-prompt cost in O(1) (own bookings)."""
        inst = self._instances[instance_id]
        return len(inst.prefill_queue), inst.prefill_queue_tokens, inst.prefill_queue_sq_tokens

    def waiting_decodes(self, instance_id: int) -> list[int]:
        """Requests that already produced tokens and wait in this instance's queue to be
        recomputed (preempted here, or moved here by recompute)."""
        reqs = self._requests
        return [r for r in self._instances[instance_id].prefill_queue
                if reqs[r].generated_tokens > 0 and reqs[r].decode_instance == instance_id]

    # --- requests --------------------------------------------------------------------
    def request(self, req_id: int) -> RequestState:
        return self._requests[req_id]

    def has_request(self, req_id: int) -> bool:
        """Whether the runtime still tracks ``req_id`` and it has not ended (the live gateway
        forgets requests that end; the simulator keeps them, marked done)."""
        st = self._requests.get(req_id)
        return st is not None and not st.done

    def ended_request(self, req_id: int) -> RequestState | None:
        """A request's state while the runtime can still resolve it, ended or not: in a
        ``Completed`` observation the request has ended but its placement is readable.
        None once the runtime has forgotten it (policies keeping ids across calls must
        expect that live)."""
        return self._requests.get(req_id)

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

    def decode_snapshots(self, ids: Sequence[int]) -> tuple[np.ndarray, ...]:
        """``decode_snapshot`` of every instance of ``ids`` at once: (request ids, context
        tokens, generated tokens, position in ``ids`` of each row's instance)."""
        cols = self._columns
        k = cols.iterations_done(cols.slots(ids), self.now_s)
        tables = [self._instances[i].decodes for i in ids]
        counts = np.fromiter((t.n for t in tables), dtype=np.int64, count=len(tables))
        if not counts.sum():
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty, empty
        grown = np.repeat(k, counts)
        return (np.concatenate([t.col("req_id") for t in tables]),
                np.concatenate([t.col("ctx") for t in tables]) + grown,
                np.concatenate([t.col("generated") for t in tables]) + grown,
                np.repeat(np.arange(len(tables), dtype=np.int64), counts))

    def decode_rate_tokens_per_s(self, req_id: int) -> float:
        """Observed decode rate of a request: tokens since decode start over elapsed time,
        or its instance's current rate before it has a history."""
        state = self._requests[req_id]
        inst_id = state.decode_instance
        if inst_id is None:
            return 0.0
        if state.decode_start_s is not None and self.now_s > state.decode_start_s:
            made = self.generated_tokens(req_id) - 1
            if made > 0:
                return made / (self.now_s - state.decode_start_s)
        return self.instance_rate_tokens_per_s(inst_id)

    def instance_rate_tokens_per_s(self, instance_id: int) -> float:
        """Per-request decode rate on an instance, from its token interval (tokens/s)."""
        interval = self.token_interval_s(instance_id)
        return 1.0 / interval if interval > 0 else 0.0
