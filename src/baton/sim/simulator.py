"""The discrete-event simulator: builds the ClusterView, runs the event loop, carries
every request through its life (arrival, prefill, decode, end), calls the scheduler and
executes its decisions. Its helpers act on the cluster through ``SimPort`` (PD handoffs,
migrations, deflections); the ``Recorder`` measures."""

from __future__ import annotations

import time
from collections.abc import Callable

from baton.core import bookings, lifecycle
from baton.core.decisions import (ChangeRole, Decision, Deflect, Migrate, Watch, apply_decode_choice, apply_plan,
                                  check_usable, dispatch)
from baton.core.errors import BatonError, ConfigError
from baton.core.info import InfoModel
from baton.core.events import DecodeProgress
from baton.core.instance import InstanceState, Role
from baton.core.request import Phase, Request, RequestState
from baton.core.view import ClusterView
from baton.metrics import RunCounters
from baton.perf.model import PerfModel
from baton.policies.base import Scheduler
from baton.core.flow_control import FlowControlSettings
from baton.sim.gate import gate_for
from baton.sim.boundaries import Boundaries
from baton.sim.clock import (ARRIVAL, FLOW_DONE, PUBLISH, SAMPLE, SCRAPE, SEG_END, TICK, XFER_DONE,
                             EventQueue)
from baton.sim.cluster import ClusterSpec
from baton.sim.deflection import deflect as deflect_queued
from baton.engine_model.engine import Engine
from baton.engine_model.kv import EngineCaches
from baton.engine_model.work import DecodeJoin, PrefillItem, PrefillKind
from baton.sim.handoffs import Handoffs
from baton.sim.migration import Migrator
from baton.sim.flows import FlowEvents
from baton.sim.network import Network
from baton.core.prefix import RequestKeys
from baton.sim.recorder import Recorder, SimResult


class SimulationError(BatonError):
    """The simulation reached an impossible state (a bug, reported with context)."""


class Simulator(FlowEvents):
    """Runs a workload on a cluster under a scheduler. ``closed_form=False`` is the
    per-iteration reference mode."""

    def __init__(self, cluster: ClusterSpec, perf: PerfModel, scheduler: Scheduler,
                 requests: list[Request], closed_form: bool = True,
                 sample_interval_s: float = 1.0,
                 progress: Callable[[float, int, int], None] | None = None,
                 info: InfoModel = InfoModel(), flow: FlowControlSettings | None = None, ttft_slo_s: float = 2.0) -> None:
        if not info.mode.bookings and scheduler.needs_bookings:
            raise ConfigError(f"view: policy {scheduler.name!r} needs the router's own bookings; "
                              "it cannot run with view mode scraped-only")
        self.cluster, self.perf, self.scheduler, self.info = cluster, perf, scheduler, info
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.req_id))
        bs = cluster.engine.block_size
        roles = cluster.roles()
        configs = [cluster.engine_for(role) for role in roles]
        blocks = [perf.kv_tokens_for(cfg.memory_flags()) // bs for cfg in configs]
        self.block_size = bs
        self.instances = {i: InstanceState(i, r, blocks[i], bs, link_bytes_per_s=cluster.nic_bytes_per_s)
                          for i, r in enumerate(roles)}
        self._keys = RequestKeys(lambda req_id: self.states[req_id].request)
        keys = self._keys if any(r.prefix_ids for r in self.requests) else None
        self.engines = {i: Engine(s, configs[i], perf, closed_form, keys) for i, s in self.instances.items()}
        self.states: dict[int, RequestState] = {}
        self.view = ClusterView(self.instances, self.states, info, EngineCaches(self.engines))
        self.net = Network(cluster.nic_bytes_per_s, cluster.nic_latency_s)
        self.migrator = Migrator(self)
        self.handoffs = Handoffs(self, cluster.nic_bytes_per_s, cluster.layerwise_tail)
        self.watch_owner: dict[int, int] = {}
        self.pending_watch: dict[int, int] = {}
        self.stale_decisions: dict[str, int] = {}  # by kind: about requests that had ended
        self.counters = RunCounters()
        self.recorder = Recorder(self.view, self.instances, self.counters, sample_interval_s,
                                 cluster.instance_names())
        self.sample_interval_s = sample_interval_s
        self.events = EventQueue()
        self.now = 0.0
        self._open, self._settling = 0, None  # requests open; the engine whose segment end is handled
        self._progress = progress
        # a context must fit every instance it may land on (capacities differ by role)
        self._max_tokens = min(blocks) * bs if blocks else 0
        self._max_model_len = cluster.max_model_len(perf.max_model_len)
        self.gate = gate_for(flow, self.view, ttft_slo_s, self.place, self.reject)  # None: no flow control
        for eng in self.engines.values() if self.gate is not None else ():
            eng.multi_iteration_prefill = False  # the gate releases work at every segment end: one per chunk
        self.boundaries = Boundaries(self.engines)

    # --- event loop ----------------------------------------------------------------------
    def run(self) -> SimResult:
        """Process every event; every request ends finished or rejected."""
        wall0 = time.perf_counter()
        self.view.now_s = 0.0
        for stage_index, decision in self.scheduler.start(self.view):
            self.execute(decision, stage_index)
        self.events.arrive_at([r.arrival_s for r in self.requests])
        for stage_index, interval in self.scheduler.tickers:
            self.events.push(interval, TICK, (stage_index, interval))
        self.events.push(0.0, SAMPLE, ())
        if self.info.mode.scraped:
            self.events.push(0.0, SCRAPE, ())
        self._open = len(self.requests)
        handlers = {SEG_END: self._on_segment_end, FLOW_DONE: self._on_flow_done,
                    XFER_DONE: self.handoffs.complete, ARRIVAL: self._on_arrival,
                    TICK: self._on_tick, SAMPLE: self._on_sample, SCRAPE: self._on_scrape,
                    PUBLISH: self._on_publish}
        bounds = self.boundaries
        while self.events and self._open > 0:
            t, kind, payload = self.events.pop()
            self.now = self.view.now_s = t
            if bounds.heap and bounds.heap[0][0] <= t:
                bounds.catch_up(t)
            self.counters.events += 1
            handlers[kind](*payload)
        if self._open > 0:
            raise self._stalled("")
        self._on_sample()
        return self.recorder.result(self.now, wall0, sum(e.preemptions for e in self.engines.values()),
                                    self.net.bytes_moved, self.scheduler.report(),
                                    {i: e.cache.stats for i, e in self.engines.items() if e.cache is not None})

    def kick(self, instance_id: int) -> None:
        """Make an engine notice new work: plan if idle, else cut its segment. An engine
        whose segment end is being handled plans once, when all of it is handled."""
        if instance_id == self._settling:
            return
        eng = self.engines[instance_id]
        if not eng.busy:
            end = eng.plan(self.now)
            if end is not None:
                self.events.push(end, SEG_END, (instance_id, eng.version))
                self.boundaries.planned(instance_id)
            if self._after_plan(instance_id, eng):
                self.retry_receives(instance_id)  # blocks freed, or the waiting queue moved
        else:
            end = eng.interrupt(self.now)
            if end is not None:
                self.events.push(end, SEG_END, (instance_id, eng.version))

    def _after_plan(self, instance_id: int, eng: Engine) -> bool:
        """Book prefill starts and preemptions; True if something was preempted or
        admitted (either may unblock KV waiting to arrive here)."""
        changed = bool(eng.preempted or eng.started)
        for rid in eng.preempted:
            st = self.states[rid]
            if st.phase is Phase.DECODE:
                self.migrator.cancel(rid)  # its KV is gone: a move in flight has nothing to move
            lifecycle.preempted(st, eng.prefills[rid].generated, self.now)  # the table row is gone
        eng.preempted.clear()
        for rid in eng.started:
            st = self.states[rid]
            if st.prefill_start_s is None:
                lifecycle.prefill_started(st, instance_id, self.now)
                if st.bound_early and st.decode_instance != instance_id:
                    self.handoffs.begin(rid, instance_id, st.decode_instance)
        eng.started = []
        return changed

    # --- handlers ----------------------------------------------------------------------
    def _on_arrival(self, index: int) -> None:
        req = self.requests[index]
        st = RequestState(req)
        self.states[req.req_id] = st
        if self.scheduler.needs_prefix_keys:
            st.block_keys = self._keys(req.req_id, self.block_size)[:req.prompt_tokens // self.block_size]
        if self._max_model_len is not None and req.prompt_tokens + req.output_tokens > self._max_model_len:
            return self.reject(st, "context")
        if req.prompt_tokens + req.output_tokens > self._max_tokens:
            return self.reject(st, "exceeds_kv_capacity")
        return self.gate.arrive(st) if self.gate is not None else self.place(st)

    def place(self, st: RequestState) -> None:
        """Ask the policy where an arrival goes and queue its prompt there."""
        req = st.request
        plan = self.scheduler.plan_arrival(self.view, st)
        reason = apply_plan(plan, self, self.view)
        if reason is not None:
            return self.reject(st, reason)
        p = plan.prefill_instance
        assert p is not None
        bookings.bind(self.instances, st, p, plan.decode_instance, plan.prefill_chunk_limit_tokens)
        self.recorder.placed(self.now, req.req_id, p)
        if plan.watch_context_tokens is not None and plan.watch_stage is not None:
            self.watch(Watch(req.req_id, plan.watch_context_tokens), plan.watch_stage)
        self.engines[p].add_prefill(PrefillItem(req.req_id, req.prompt_tokens, PrefillKind.FRESH,
                                                req.output_tokens, 0, plan.prefill_chunk_limit_tokens))
        self.kick(p)

    def _on_segment_end(self, instance_id: int, version: int) -> None:
        eng = self.engines[instance_id]
        if version != eng.version or not eng.busy:
            return
        result = eng.finish(self.now)
        # All the segment's outputs are placed before the engine plans again, as vLLM's next
        # step sees them all: a colocated prefill joining must not plan before the next joins
        self._settling = instance_id
        self.recorder.segment_gaps(result)
        for rid, t in result.first_tokens:
            lifecycle.first_token(self.states[rid], t)
        for rid in result.finished:
            self.finish(self.states[rid])
        for rid, ctx in result.thresholds:
            owner = self.watch_owner.pop(rid, None)
            if owner is not None:
                for d in self.scheduler.on_threshold(owner, self.view, rid, ctx):
                    self.execute(d, owner)
        for item in result.prefilled:
            self._on_prefilled(instance_id, item)
        self.migrator.at_boundary(instance_id)
        if self.scheduler.observes and result.gaps is not None:
            self.scheduler.observe(self.view, DecodeProgress(
                instance_id, result.iterations, result.mean_iteration_s, self.now))
        if self.gate is not None:
            self.gate.pump()  # what it releases is placed before the engine plans again, too
        self.retry_receives(instance_id)  # while settling: its wake-up is the plan below, not a cut of it
        self._settling = None
        self.kick(instance_id)

    def _on_prefilled(self, instance_id: int, item: PrefillItem) -> None:
        st = self.states[item.req_id]
        if item.kind is not PrefillKind.FRESH:
            return self._resume_local(instance_id, item, st)
        done = lifecycle.prefill_ended(st, instance_id, self.now)
        if self.scheduler.observes:
            self.scheduler.observe(self.view, done)
        if st.request.output_tokens <= 1:
            lifecycle.token_emitted(st, self.now)
            self.engines[instance_id].free_request(st.req_id, item.blocks, item.total_tokens)
            return self.finish(st)
        dst = st.decode_instance if st.bound_early else apply_decode_choice(
            self.scheduler.decode_choice(self.view, st), self, self.view)
        if dst is None:
            self.engines[instance_id].free_request(st.req_id, item.blocks, item.total_tokens)
            return self.reject(st, "no_decode_instance")
        check_usable(self.view, dst, "decode")
        bookings.decode_on(st, dst)
        if dst == instance_id:
            lifecycle.token_emitted(st, self.now, 1)  # colocated: the prefill's iteration samples it
            return self.join(instance_id, st, st.request.prompt_tokens + 1, 1, item.blocks, item.admit_seq)
        done_s = self.handoffs.prefill_done(st.req_id, instance_id, dst, item.blocks)
        if done_s is not None:
            self.events.push(done_s, XFER_DONE, (st.req_id,))

    def _resume_local(self, instance_id: int, item: PrefillItem, st: RequestState) -> None:
        """A recompute (after preemption or migration) ended: it emits one token."""
        if st.first_token_s is not None:  # else preempted before the decode side's first token
            self.recorder.gap(self.now - st.last_token_s)
        lifecycle.token_emitted(st, self.now)
        generated = item.generated + 1
        if generated >= item.stop_at:
            self.engines[instance_id].free_request(st.req_id, item.blocks, item.total_tokens)
            return self.finish(st)
        self.join(instance_id, st, item.total_tokens + 1, generated, item.blocks, item.admit_seq)

    def join(self, instance_id: int, st: RequestState, ctx: int, generated: int, blocks: int,
             admit_seq: int = 0) -> None:
        """``st``'s KV is here (``ctx`` tokens in ``blocks``): join the batch (``admit_seq``: a prefill continuing here keeps its place)."""
        self.recorder.new_work(self.now, instance_id, Role.DECODE)
        first = st.decode_start_s is None
        lifecycle.decoding(st, instance_id, self.now)
        bookings.joining(self.instances, st, instance_id, ctx)
        if first:  # the assignment's quality, judged with it placed
            self.recorder.decode_start(instance_id, ctx)
        watch = self.pending_watch.pop(st.req_id, None)
        self.engines[instance_id].add_join(DecodeJoin(
            st.req_id, ctx, generated, st.request.output_tokens, blocks,
            st.last_token_s if generated else None, watch, admit_seq))
        self.kick(instance_id)

    # --- KV moving in: reservations and flows (PD handoffs: handoffs.py) -----------------
    def reserve(self, instance_id: int, blocks: int) -> bool:
        """Reserve KV blocks on an instance now, cutting its segment to stay consistent."""
        if not self.engines[instance_id].reserve(self.now, blocks):
            return False
        self.kick(instance_id)
        return True

    def retry_receives(self, instance_id: int) -> None:
        """Blocks may have freed up on an instance: start KV waiting to come in."""
        self.handoffs.retry_receives(instance_id)

    # --- ends ----------------------------------------------------------------------------
    def finish(self, st: RequestState) -> None:
        done = lifecycle.completed(st, self.now)
        self.migrator.cancel(st.req_id)
        self.watch_owner.pop(st.req_id, None)
        self._keys.drop(st.req_id, self.block_size)
        self.recorder.ended(st)
        self._open -= 1
        if self.gate is not None:
            self.gate.completed(st)
        if self.scheduler.observes:
            self.scheduler.observe(self.view, done)

    def reject(self, st: RequestState, reason: str) -> None:
        lifecycle.ended(st, self.now, reason)
        bookings.drop_bookings(self.instances, st)
        self._keys.drop(st.req_id, self.block_size)
        self.recorder.ended(st)
        self._open -= 1

    # --- policy ticks and decisions ------------------------------------------------------
    def _on_tick(self, stage_index: int, interval_s: float) -> None:
        for d in self.scheduler.tick(stage_index, self.view):
            self.execute(d, stage_index)
        self.events.push(self.now + interval_s, TICK, (stage_index, interval_s))

    def execute(self, decision: Decision, stage_index: int) -> bool:
        """Carry out one policy decision (``core.decisions.dispatch``); False if stale."""
        return dispatch(decision, self, self.view, stage_index)

    # --- core.decisions.Executor ---------------------------------------------------------
    def change_role(self, decision: ChangeRole, stage_index: int) -> None:
        check_usable(self.view, decision.instance_id, "role-change")
        inst = self.instances[decision.instance_id]
        if inst.role is not decision.role:
            inst.role = decision.role
            self.recorder.role_changed(self.now, decision.instance_id, decision.role, inst.num_requests)
            self.view.invalidate_roles()

    def migrate(self, decision: Migrate, stage_index: int) -> None:
        self.migrator.start(decision)

    def deflect(self, decision: Deflect, stage_index: int) -> None:
        deflect_queued(self, decision)

    def note_stale(self, kind: str) -> None:
        self.stale_decisions[kind] = self.stale_decisions.get(kind, 0) + 1

    def watch(self, decision: Watch, stage_index: int) -> None:
        st = self.states.get(decision.req_id)
        if st is None or st.done:
            return
        self.watch_owner[decision.req_id] = stage_index
        inst = st.decode_instance
        if st.phase is Phase.DECODE and inst is not None and self.engines[inst].set_watch(
                decision.req_id, decision.context_tokens):
            self.kick(inst)
        else:
            self.pending_watch[decision.req_id] = decision.context_tokens

    def _stalled(self, why: str) -> SimulationError:
        stuck = [s.req_id for s in self.states.values() if not s.done][:5]
        return SimulationError(f"simulation stalled at t={self.now:.3f}s with {self._open} requests open "
                               f"(e.g. {stuck}){why}")

    def _on_scrape(self) -> None:
        """Read every engine's metrics; policies see them ``delay_s`` later."""
        samples = tuple((i, inst.engine_sample(self.now)) for i, inst in self.instances.items())
        if self.info.delay_s > 0:
            self.events.push(self.now + self.info.delay_s, PUBLISH, (samples,))
        else:
            self._on_publish(samples)
        if self._open > 0:
            self.events.push(self.now + self.info.scrape_interval_s, SCRAPE, ())

    def _on_publish(self, samples: tuple) -> None:
        for i, sample in samples:
            self.instances[i].set_sample(sample)

    def _on_sample(self) -> None:
        if self.gate is not None:
            self.gate.pump()
        self.recorder.sample(self.now)
        if self._progress is not None:
            self._progress(self.now, len(self.recorder.records), len(self.requests))
        if self._open > 0 and self.events.work == 0 and not self.net.flows \
                and not any(e.busy for e in self.engines.values()) and not self.handoffs.recompute_a_stuck_one():
            raise self._stalled(" and nothing left to run")
        if self._open > 0:
            self.events.push(self.now + self.sample_interval_s, SAMPLE, ())
