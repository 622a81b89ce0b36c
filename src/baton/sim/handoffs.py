"""PD handoffs: a prompt's KV moving from its prefill instance to the instance that
decodes it (the simulator's side of a KV connector such as NIXL).

The decode side's blocks are reserved first; a handoff they do not fit yet waits in that
instance's receive queue, in order. The flow then moves the prompt's KV, alongside the
prefill under early binding. Once both the prefill and the bytes are through (plus the
last layers' tail when the prefill ends after the bytes), the source frees its copy and
the request joins the decode batch. The simulator drives it; it acts on the cluster
through ``SimPort``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from baton.core import bookings, lifecycle
from baton.core.request import Phase
from baton.engine_model.work import PrefillItem, PrefillKind
from baton.sim.port import FlowKind, FlowTag, SimPort


@dataclass(slots=True)
class Transfer:
    """A prefill-to-decode KV handoff."""

    req_id: int
    src: int
    dst: int
    dst_blocks: int
    bytes_done: bool = False
    prefill_done: bool = False
    alone_s: float = 0.0


class Handoffs:
    """The PD handoffs under way and the receive queues of every instance."""

    def __init__(self, port: SimPort, nic_bytes_per_s: float, layerwise_tail: float) -> None:
        self.port = port
        self.nic_bytes_per_s, self.layerwise_tail = nic_bytes_per_s, layerwise_tail
        self.transfers: dict[int, Transfer] = {}
        self.receive_wait: dict[int, deque[int]] = {i: deque() for i in port.instances}

    def begin(self, rid: int, src: int, dst: int) -> None:
        """Book the prompt's KV on the decode instance, reserve its blocks there and start
        moving it (or queue it until blocks free up)."""
        st = self.port.states[rid]
        blocks = -(-st.request.prompt_tokens // self.port.block_size)
        tr = Transfer(rid, src, dst, blocks)
        self.transfers[rid] = tr
        # Booked from now, not from when its blocks are reserved: the request is the decode
        # instance's (as a decode leg waiting in vLLM's queue is, and as the gateway books it
        # when it sends that leg), so a policy reading the decode side sees the requests
        # queued for its blocks; unbooked, a full decode side looked no busier than its KV.
        bookings.kv_heading_to(self.port.instances, st, dst, st.request.prompt_tokens)
        lifecycle.handoff_begun(st, self.port.now)
        if not self.port.reserve(dst, blocks):
            self.receive_wait[dst].append(rid)
            return
        self._send_prompt_kv(tr)

    def prefill_done(self, rid: int, src: int, dst: int, blocks: int) -> float | None:
        """The prefill ended on ``src``, where its KV stays (``blocks``) until the handoff
        completes. Returns when it completes if the bytes are already through (the last
        layers' tail), else None: the flow's end completes it."""
        self.port.engines[src].hold(rid, blocks, self.port.states[rid].request.prompt_tokens)
        lifecycle.transferring(self.port.states[rid])  # an early-bound flow may have begun in PREFILL
        tr = self.transfers.get(rid)
        if tr is None:
            self.begin(rid, src, dst)
            tr = self.transfers[rid]
        tr.prefill_done = True
        return self.port.now + tr.alone_s * self.layerwise_tail if tr.bytes_done else None

    def bytes_done(self, rid: int) -> bool:
        """The prompt's KV flow ended; True if the handoff completes now."""
        tr = self.transfers[rid]
        tr.bytes_done = True
        return tr.prefill_done

    def complete(self, rid: int) -> None:
        """The KV is on the decode instance: the source frees its copy, the request joins."""
        port = self.port
        tr = self.transfers.pop(rid)
        st = port.states[rid]
        lifecycle.transfer_ended(st, port.now)
        port.engines[tr.src].release_held(rid)
        # As with vLLM's KV connectors, the decode instance recomputes the prompt's last
        # token and samples the first output token: the client sees it from there.
        port.join(tr.dst, st, st.request.prompt_tokens, 0, tr.dst_blocks)
        self.retry_receives(tr.src)
        port.kick(tr.src)

    def _send_prompt_kv(self, tr: Transfer) -> None:
        port = self.port
        st = port.states[tr.req_id]
        lifecycle.transfer_started(st, port.now)
        if st.phase is not Phase.PREFILL:
            lifecycle.transferring(st)
        nbytes = port.perf.kv_bytes(st.request.prompt_tokens)
        tr.alone_s = port.perf.transfer_time_s(nbytes, self.nic_bytes_per_s)
        port.start_flow(tr.src, tr.dst, nbytes, FlowTag(FlowKind.HANDOFF, tr.req_id))

    def retry_receives(self, instance_id: int) -> None:
        """Blocks may have freed up on an instance: start transfers waiting to come in,
        and wake the engine if requests wait in its queue."""
        queue = self.receive_wait[instance_id]
        eng = self.port.engines[instance_id]
        started = False
        while queue:
            tr = self.transfers[queue[0]]
            if not eng.reserve(self.port.now, tr.dst_blocks):
                break
            queue.popleft()
            self._send_prompt_kv(tr)
            started = True
        if (started and eng.busy) or (not eng.busy and eng.waiting):
            self.port.kick(instance_id)  # the segment assumed those blocks free / work can start

    def recompute_a_stuck_one(self) -> bool:
        """Nothing runs, yet a prefilled request waits for blocks on its decode instance
        while its KV holds blocks on the source (two such handoffs in opposite directions
        wait for each other). As vLLM's prefill side frees KV nobody pulls after a timeout
        and the decode side then computes the prompt itself, the source gives its KV up
        and the request recomputes on its decode instance. True if one was released."""
        port = self.port
        for dst, queue in self.receive_wait.items():
            for rid in list(queue):
                tr = self.transfers[rid]
                if not tr.prefill_done:
                    continue
                queue.remove(rid)
                del self.transfers[rid]
                port.engines[tr.src].release_held(rid)
                st = port.states[rid]
                bookings.drop_bookings(port.instances, st)  # it prefills there instead
                lifecycle.back_to_prefill(st)
                port.counters.handoff_recomputes += 1
                port.engines[dst].add_prefill(PrefillItem(rid, st.request.prompt_tokens, PrefillKind.RECOMPUTE,
                                                          st.request.output_tokens, 0))
                self.retry_receives(tr.src)
                port.kick(dst)
                return True
        return False
