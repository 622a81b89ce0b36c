"""Per-request records, and export to CSV or Parquet."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path

from baton.core.errors import ConfigError
from baton.core.request import Phase, RequestState


PATH_SEP = ">"  # between the instances a request visited, in its record's ``path``


def _between(start: float | None, end: float | None) -> float:
    return end - start if start is not None and end is not None else float("nan")


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are seconds; NaN where not applicable. A value
    nothing changes once made; not frozen because a frozen constructor of 24 fields costs
    about 2 us more, once per simulated request.

    Breakdown: ``queue_s`` (arrival to prefill start), ``prefill_s`` (prefill start to
    end), ``transfer_s`` (KV transfer; overlaps the prefill under early binding),
    ``decode_wait_s`` (KV ready on the decode instance to its first token: waiting for a
    slot or blocks, plus the first iteration; 0 when colocated), ``decode_s`` (first token
    to the end), ``receive_wait_s`` (a PD handoff waiting for the decode instance to free
    blocks before its KV could move; NaN without a handoff). Without early binding
    ``ttft_s`` is their sum from ``queue_s`` to ``decode_wait_s``."""

    req_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    finished: bool
    reject_reason: str
    ttft_s: float
    tpot_s: float
    e2e_s: float
    normalized_latency_s: float
    queue_s: float
    transfer_s: float
    prefill_s: float
    decode_wait_s: float
    decode_s: float
    preemptions: int
    migrations: int
    path: str
    deflected: bool = False
    priority: int = 0
    tenant: str = ""
    ttft_slo_s: float = float("nan")  # its own targets (NaN: the run's)
    tpot_slo_s: float = float("nan")
    receive_wait_s: float = float("nan")

    @classmethod
    def from_state(cls, s: RequestState, names: Sequence[str] | None = None) -> "RequestRecord":
        """The record of a request that ended; ``names`` (by instance id) name the
        instances of its ``path`` (``prefill-0>decode-1``), else their ids."""
        nan = float("nan")
        r = s.request
        finished = s.phase is Phase.FINISHED
        ttft = (s.first_token_s - r.arrival_s) if s.first_token_s is not None else nan
        e2e = (s.finish_s - r.arrival_s) if finished and s.finish_s is not None else nan
        tpot = ((s.finish_s - s.first_token_s) / (r.output_tokens - 1)
                if finished and r.output_tokens > 1 and s.first_token_s is not None else nan)
        queue = (s.prefill_start_s - r.arrival_s) if s.prefill_start_s is not None else nan
        transfer = (s.transfer_end_s - s.transfer_start_s
                    if s.transfer_end_s is not None and s.transfer_start_s is not None else nan)
        prefill = _between(s.prefill_start_s, s.prefill_end_s)
        # KV ready here (transfer end, or prefill end when nothing moved) -> first token
        ready = s.transfer_end_s if s.transfer_end_s is not None else s.prefill_end_s
        decode_wait = _between(ready, s.first_token_s)
        decode = _between(s.first_token_s, s.finish_s) if finished else nan
        return cls(r.req_id, r.arrival_s, r.prompt_tokens, r.output_tokens, finished,
                   s.reject_reason or "", ttft, tpot, e2e,
                   e2e / r.output_tokens if finished else nan, queue, transfer, prefill,
                   max(decode_wait, 0.0) if decode_wait == decode_wait else nan, decode,
                   s.preemptions, s.migrations, PATH_SEP.join(names[i] if names else str(i) for i in s.path),
                   s.chunk_limit_tokens is not None, r.priority, r.tenant,
                   nan if r.ttft_slo_s is None else r.ttft_slo_s, nan if r.tpot_slo_s is None else r.tpot_slo_s,
                   _between(s.handoff_start_s, s.transfer_start_s))


def write_records(records: list[RequestRecord], path: str | Path) -> Path:
    """Write records as CSV, or Parquet when the path ends in .parquet (needs pyarrow)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [f.name for f in fields(RequestRecord)]
    if path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("Parquet output needs pyarrow: pip install -e '.[parquet]'") from None
        table = pa.table({n: [getattr(r, n) for r in records] for n in names})
        pq.write_table(table, path)
        return path
    get = attrgetter(*names)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        writer.writerows([("true" if v else "false") if v is True or v is False else v for v in get(r)]
                         for r in records)  # booleans as true/false, as every other tool reads them
    return path
