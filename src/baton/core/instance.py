"""Per-instance state that policies read through the ``ClusterView``.

The runtime mutates it incrementally as work arrives, moves and finishes, so that reading
any aggregate is O(1). Decode progress between two state changes is not written per
token: the instance carries a *segment* (start time, iteration time and its growth per
iteration), and readers extrapolate the number of completed iterations in closed form.
"""

from __future__ import annotations

import bisect
import enum
import math
from dataclasses import dataclass, field

from baton.core.decode_table import DecodeTable
from baton.core.info import EngineSample


DEFAULT_LINK_BYTES_PER_S = 100e9 / 8  # a hand-built instance's KV link; runtimes set their own


class Role(str, enum.Enum):
    """What new work an instance accepts. Existing work always drains where it is."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"  # colocated: prefills and decodes, chunked prefill

    @property
    def prefills(self) -> bool:
        return self in (Role.PREFILL, Role.MIXED)

    @property
    def decodes(self) -> bool:
        return self in (Role.DECODE, Role.MIXED)


@dataclass(slots=True)
class Segment:
    """Iterations k = 0.. of one batch composition: iteration k lasts ``iter0_s + slope_s * k``
    (decodes alone), or, for a chunked prefill that runs several iterations beside the same
    decodes, ``iters_s[k]`` as listed (``ends_s[k]``: the time iteration k ends, each the
    previous end plus its duration, as one-iteration segments would end;
    ``prefill_blocks[k]``: blocks its chunks take beyond iteration 0's once iteration k is
    under way)."""

    start_s: float
    iter0_s: float
    slope_s: float
    max_iters: int
    block_size: int = 16
    rows: int = 0
    residue_ge: tuple[int, ...] = ()
    iters_s: tuple[float, ...] = ()
    ends_s: tuple[float, ...] = ()
    prefill_blocks: tuple[int, ...] = ()
    # the last answer of iterations_done (many readers ask at one moment) and the cut it
    # was read under (cut_segment shortens a running segment; nothing else changes one)
    done_at_s: float = field(default=-math.inf, repr=False, compare=False)
    done_k: int = field(default=0, repr=False, compare=False)
    done_top: int = field(default=-1, repr=False, compare=False)

    def block_growth(self, k: int) -> int:
        """Extra KV blocks the running work holds once iteration k is under way
        (iteration 0's blocks are already counted by the instance)."""
        if k <= 0:
            return 0
        return self.decode_growth(k) + (self.prefill_blocks[k] if self.prefill_blocks else 0)

    def decode_growth(self, k: int) -> int:
        """The running decodes' share of ``block_growth``."""
        if k <= 0 or not self.rows:
            return 0
        whole, part = divmod(k, self.block_size)
        return self.rows * whole + (self.residue_ge[self.block_size - part] if part else 0)

    def elapsed_s(self, k: int) -> float:
        """Time from the segment start to the end of iteration k-1 (k iterations done)."""
        if self.ends_s:
            return self.ends_s[k - 1] - self.start_s if k > 0 else 0.0
        return k * self.iter0_s + self.slope_s * k * (k - 1) / 2.0

    def iterations_done(self, now_s: float) -> int:
        """Iterations completed by ``now_s`` (an iteration ending exactly at now counts)."""
        if now_s == self.done_at_s and self.max_iters == self.done_top:
            return self.done_k
        if self.ends_s:  # times, not durations: an end event's own time counts that iteration
            k = bisect.bisect_right(self.ends_s, now_s, 0, self.max_iters)
        else:
            k = self._affine_done(now_s - self.start_s)
        self.done_at_s, self.done_k, self.done_top = now_s, k, self.max_iters
        return k

    def _affine_done(self, dt: float) -> int:
        """Iterations of the affine form done within ``dt`` s of the start: the quadratic's
        root, then corrected by the exact sums (the root's rounding can be one off)."""
        if dt <= 0.0:
            return 0
        a, b = self.slope_s / 2.0, self.iter0_s - self.slope_s / 2.0
        if a > 1e-300:
            k = int((-b + math.sqrt(b * b + 4.0 * a * dt)) / (2.0 * a))
        else:
            k = int(dt / self.iter0_s)
        top, iter0, slope = self.max_iters, self.iter0_s, self.slope_s
        k = 0 if k < 0 else (top if k > top else k)
        # elapsed_s(k) written out (no ends_s here), the same operations in the same order
        while k > 0 and k * iter0 + slope * k * (k - 1) / 2.0 > dt:
            k -= 1
        while k < top and (k + 1) * iter0 + slope * (k + 1) * k / 2.0 <= dt:
            k += 1
        return k

    def end_s(self, k: int) -> float:
        """When iteration k-1 ends (k iterations done), in s."""
        return self.ends_s[k - 1] if self.ends_s and k > 0 else self.start_s + self.elapsed_s(k)

    def iteration_s(self, k: int) -> float:
        return self.iters_s[k] if self.iters_s else self.iter0_s + self.slope_s * k


@dataclass(slots=True)
class InstanceState:
    """One engine instance as policies see it. All token counts are in tokens.

    - ``prefill_queue``: request id -> prompt tokens still to prefill here (FIFO order).
    - ``shadow``: requests bound to decode here whose prefill still runs elsewhere
      (request id -> prompt tokens); SIBYL's shadow load.
    - ``incoming``: requests whose KV is moving here or waiting to join the batch
      (request id -> context tokens).
    - ``decodes``: the running decode batch.

    Policies read these through ``ClusterView``, which decides per field whether they see
    the runtime's exact value or the last scrape (``baton.core.info``).
    """

    instance_id: int
    role: Role
    kv_blocks_total: int
    block_size_tokens: int
    prefill_queue: dict[int, int] = field(default_factory=dict)
    prefill_queue_tokens: int = 0
    prefill_queue_sq_tokens: int = 0  # sum of squares of the queued lengths (quadratic predictors)
    shadow: dict[int, int] = field(default_factory=dict)
    shadow_tokens: int = 0
    incoming: dict[int, int] = field(default_factory=dict)
    incoming_tokens: int = 0
    decodes: DecodeTable = field(default_factory=DecodeTable)
    kv_blocks_used: int = 0
    recent_iteration_s: float = 0.0
    recent_token_interval_s: float = 0.0
    segment: Segment | None = None
    healthy: bool = True
    # engine-side counts, kept by the runtime (vLLM's num_requests_running / _waiting)
    running_requests: int = 0
    waiting_requests: int = 0
    sample: EngineSample | None = None  # the last scrape policies may see (scraped views)
    # the dirty set of the load columns this instance is registered with (core.load_columns)
    load_dirty: set[int] | None = None
    # its link for KV (bytes/s): a fact of the cluster the runtime sets (the simulated
    # cluster's nic_gbps, the gateway's link_gbps); policies read it here, never guess it
    link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S

    def __post_init__(self) -> None:
        self.decodes.on_change = self.touch

    def touch(self) -> None:
        """A load term changed: the load columns re-read this instance before their next read."""
        if self.load_dirty is not None:
            self.load_dirty.add(self.instance_id)

    def set_sample(self, sample: EngineSample) -> None:
        """A new scrape of the engine's metrics (what scraped views read)."""
        self.sample = sample
        self.touch()

    def set_segment(self, segment: Segment | None) -> None:
        """Start (or end, with None) the running decode segment."""
        self.segment = segment
        self.touch()

    def cut_segment(self, max_iters: int) -> None:
        """Shorten the running segment to ``max_iters`` iterations."""
        assert self.segment is not None
        self.segment.max_iters = max_iters
        self.touch()

    # --- incremental bookkeeping used by runtimes -------------------------------------
    def queue_prefill(self, req_id: int, tokens: int) -> None:
        self.prefill_queue[req_id] = tokens
        self.prefill_queue_tokens += tokens
        self.prefill_queue_sq_tokens += tokens * tokens
        self.touch()

    def progress_prefill(self, req_id: int, tokens: int) -> None:
        left = self.prefill_queue[req_id]
        self.prefill_queue[req_id] = left - tokens
        self.prefill_queue_tokens -= tokens
        self.prefill_queue_sq_tokens += (left - tokens) ** 2 - left * left
        self.touch()

    def drop_prefill(self, req_id: int) -> None:
        left = self.prefill_queue.pop(req_id)
        self.prefill_queue_tokens -= left
        self.prefill_queue_sq_tokens -= left * left
        self.touch()

    def add_shadow(self, req_id: int, tokens: int) -> None:
        self.shadow[req_id] = tokens
        self.shadow_tokens += tokens

    def drop_shadow(self, req_id: int) -> None:
        self.shadow_tokens -= self.shadow.pop(req_id, 0)

    def add_incoming(self, req_id: int, tokens: int) -> None:
        self.incoming[req_id] = tokens
        self.incoming_tokens += tokens
        self.touch()

    def drop_incoming(self, req_id: int) -> None:
        self.incoming_tokens -= self.incoming.pop(req_id, 0)
        self.touch()

    # --- reads ------------------------------------------------------------------------
    def kv_blocks_used_at(self, now_s: float) -> int:
        """KV blocks allocated at ``now_s``, including decode growth inside a segment."""
        seg = self.segment
        if seg is None:
            return self.kv_blocks_used
        # once the last iteration is done nothing more is allocated until the next plan
        k = min(seg.iterations_done(now_s), seg.max_iters - 1)
        return self.kv_blocks_used + seg.block_growth(k)

    def kv_blocks_free_at(self, now_s: float) -> int:
        return self.kv_blocks_total - self.kv_blocks_used_at(now_s)

    def kv_usage_at(self, now_s: float) -> float:
        """Fraction of KV blocks in use at ``now_s``, 0..1."""
        return self.kv_blocks_used_at(now_s) / self.kv_blocks_total if self.kv_blocks_total else 1.0

    def recent_iteration_s_at(self, now_s: float) -> float:
        """Duration of the last completed iteration (seconds)."""
        seg = self.segment
        if seg is not None:
            k = seg.iterations_done(now_s)
            if k > 0:
                return seg.iteration_s(k - 1)
        return self.recent_iteration_s

    def iterations_since_sync(self, now_s: float) -> int:
        """Decode iterations finished since the decode table was last written."""
        return self.segment.iterations_done(now_s) if self.segment else 0

    def decode_ctx_tokens(self, now_s: float) -> int:
        """Sum of the running decodes' context lengths at ``now_s``."""
        return self.decodes.ctx_sum + self.decodes.n * self.iterations_since_sync(now_s)

    def token_load(self, now_s: float) -> int:
        """Tokens of work on this instance: decode contexts + incoming KV + queued prefill."""
        return self.decode_ctx_tokens(now_s) + self.incoming_tokens + self.prefill_queue_tokens

    def engine_sample(self, now_s: float) -> EngineSample:
        """The engine's metrics as a scrape at ``now_s`` would read them."""
        interval = self.recent_iteration_s_at(now_s) if self.decodes.n else self.recent_token_interval_s
        return EngineSample(now_s, self.running_requests, self.waiting_requests, self.kv_usage_at(now_s), interval)

    @property
    def num_requests(self) -> int:
        """Requests holding or about to hold a slot here (queued, incoming, decoding)."""
        return len(self.prefill_queue) + len(self.incoming) + self.decodes.n

    def decode_rate_tokens_per_s(self, now_s: float) -> float:
        """Per-request decode rate on this instance (one token per iteration), tokens/s."""
        it = self.recent_iteration_s_at(now_s) if self.decodes.n else self.recent_token_interval_s
        return 1.0 / it if it > 0 else 0.0
