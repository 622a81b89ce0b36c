"""What a simulated run measures, kept apart from running it: per-request records, token
gaps, load samples, the role log, and the counters that only measurement fills. The
simulator tells the ``Recorder`` what happened; it reads the cluster's state and never
calls back, so nothing it does can change a run."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field


from baton.core.instance import InstanceState, Role
from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.metrics import SLO, GapHistogram, LoadSeries, RequestRecord, RunCounters, summarize
from baton.engine_model.work import SegmentResult
from baton.engine_model.prefix_cache import CacheStats


_SCALAR_IDS = 16  # decode instances up to which decode_start reads loads one by one


@dataclass(slots=True)
class SimResult:
    """Records and aggregates of one run."""

    records: list[RequestRecord]
    tbt: GapHistogram
    counters: RunCounters
    load: LoadSeries
    makespan_s: float
    wall_s: float
    decode_columns: list[int]
    output_tokens: int
    role_log: list[tuple[float, int, str]] = field(default_factory=list)  # (time s, instance, new role)
    tbt_deflected: GapHistogram | None = None
    policy_report: dict[str, float] = field(default_factory=dict)  # the policy's own figures
    instance_names: list[str] = field(default_factory=list)  # by instance id
    prefix_cache: dict[int, CacheStats] = field(default_factory=dict)  # by instance id, engines caching prefixes
    placement_order: list[int] = field(default_factory=list)  # request ids as the policy placed them

    def summary(self, slo: SLO, warmup_s: float | None = None) -> dict[str, float]:
        out = summarize(self.records, self.tbt, self.counters, self.load, slo, self.makespan_s,
                        self.decode_columns, warmup_s)
        out["wall_s"] = self.wall_s
        out["events"] = self.counters.events
        hist = self.tbt_deflected
        out["p95_deflected_tbt_s"] = hist.percentile_s(95) if hist is not None and hist.total else float("nan")
        out["p99_deflected_tbt_s"] = hist.percentile_s(99) if hist is not None and hist.total else float("nan")
        out.update(prefix_cache_summary(self.prefix_cache))
        out.update(self.policy_report)
        return out


def prefix_cache_summary(stats: Mapping[int, CacheStats]) -> dict[str, float]:
    """Cluster-wide prefix caching: prompt tokens looked up and found in a cache, and
    ``prefix_cache_hit_rate`` = found / looked up (NaN when no engine caches prefixes)."""
    queries = sum(s.queries for s in stats.values())
    hits = sum(s.hits for s in stats.values())
    return {"prefix_cache_queries_tokens": queries, "prefix_cache_hits_tokens": hits,
            "prefix_cache_hit_rate": hits / queries if queries else float("nan")}


class Recorder:
    """Measures one run; ``result`` assembles its ``SimResult``. Times are simulated
    seconds, passed in by the simulator."""

    def __init__(self, view: ClusterView, instances: Mapping[int, InstanceState], counters: RunCounters,
                 sample_interval_s: float, names: list[str] | None = None) -> None:
        self.view, self.instances, self.counters = view, instances, counters
        self.names = names if names is not None else [f"instance-{i}" for i in instances]
        self.records: list[RequestRecord] = []
        self.tbt = GapHistogram()
        self.tbt_deflected = GapHistogram()  # gaps of iterations that carried a deflected prefill chunk
        self.load = LoadSeries(sample_interval_s)
        self.role_log: list[tuple[float, int, str]] = [(0.0, i, s.role.value) for i, s in instances.items()]
        self._flipped: dict[int, tuple[float, Role]] = {}  # instance -> (flip time, new role) until new work
        self.placement_order: list[int] = []

    def placed(self, now_s: float, req_id: int, prefill_instance: int) -> None:
        """The policy placed a request (in this order: flow control's, when it is on)."""
        self.placement_order.append(req_id)
        self.new_work(now_s, prefill_instance, Role.PREFILL)

    def ended(self, st: RequestState) -> None:
        """A request finished or was rejected."""
        self.records.append(RequestRecord.from_state(st, self.names))

    def segment_gaps(self, result: SegmentResult) -> None:
        """The token gaps of a segment's decode rows."""
        if result.gaps is None:
            return
        iter0, slope, k, old, new = result.gaps
        series = result.gap_series
        for hist in (self.tbt, self.tbt_deflected) if result.with_deflected else (self.tbt,):
            if series:
                hist.add(series, old)
                hist.add(series[1:], new)
            else:
                hist.add_affine(iter0, slope, k, old)
                hist.add_affine(iter0 + slope, slope, k - 1, new)
            if result.first_gaps:  # most segments have no row joined with an earlier token
                hist.add(result.first_gaps)

    def gap(self, gap_s: float) -> None:
        """One token gap outside a decode segment (a recompute's token)."""
        self.tbt.add([gap_s])

    def role_changed(self, now_s: float, instance_id: int, role: Role, exposed_requests: int) -> None:
        self.counters.role_changes += 1
        self.counters.flip_exposed_requests += exposed_requests
        self.role_log.append((now_s, instance_id, role.value))
        self._flipped[instance_id] = (now_s, role)

    def new_work(self, now_s: float, instance_id: int, role: Role) -> None:
        """Work of ``role`` placed on an instance: time from its flip to the first such."""
        flip = self._flipped.get(instance_id)
        if flip is not None and flip[1] is role:
            self.counters.flip_first_work_s.append(now_s - flip[0])
            del self._flipped[instance_id]

    def decode_start(self, dst: int, ctx: int) -> None:
        """Optimal-assignment ratio at decode start: was ``dst`` the least loaded decode
        instance, counting on it everything but this request (by requests and by tokens)?"""
        ids = self.view.decode_ids
        if not self.view.accepts_decodes(dst):
            return
        self.counters.decode_starts += 1
        view = self.view
        count, tokens = view.own_requests(dst) - 1, view.token_load(dst) - ctx
        if len(ids) <= _SCALAR_IDS:  # the same reads one by one: cheaper than refreshing columns
            self.counters.least_by_count += all(view.own_requests(i) >= count for i in ids)
            self.counters.least_by_tokens += all(view.token_load(i) >= tokens for i in ids)
            return
        self.counters.least_by_count += count <= view.fewest_own_requests(ids)
        self.counters.least_by_tokens += view.token_loads_at_least(ids, tokens)

    def sample(self, now_s: float) -> None:
        """Every instance's token load now."""
        self.load.times_s.append(now_s)
        self.load.rows.append([s.token_load(now_s) for s in self.instances.values()])

    def result(self, makespan_s: float, wall_start: float, preemptions: int, bytes_moved: float,
               policy_report: dict[str, float], prefix_cache: dict[int, CacheStats] | None = None) -> SimResult:
        """The run's result; ``wall_start`` is ``time.perf_counter()`` when it began;
        ``prefix_cache``: each caching engine's prefix-cache counters."""
        self.counters.preemptions = preemptions
        self.counters.transfer_bytes = bytes_moved - self.counters.migration_bytes
        decode_cols = [i for i, s in self.instances.items() if s.role.decodes]
        out_tokens = sum(r.output_tokens for r in self.records if r.finished)
        return SimResult(sorted(self.records, key=lambda r: r.req_id), self.tbt, self.counters,
                         self.load, makespan_s, time.perf_counter() - wall_start, decode_cols, out_tokens,
                         self.role_log, self.tbt_deflected, policy_report, self.names, prefix_cache or {},
                         self.placement_order)
