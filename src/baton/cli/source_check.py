"""Warn when the simulated engine is not the one a trace was produced under."""

from __future__ import annotations

import dataclasses
import sys

from baton.core.instance import Role
from baton.experiments import Experiment
from baton.workload import mismatches


def check_source_engine(exp: Experiment) -> dict:
    """Print one ``warning:`` line to stderr per engine setting (max_num_batched_tokens,
    max_num_seqs, block_size) where a role's simulated engine differs from the trace's
    source engine (``baton.workload.source_engine``); return ``{"source_engine": {...}}``
    for run.json, or {} when the trace records none."""
    src = exp.workload.source_engine()
    if src is None:
        return {}
    c = exp.cluster
    roles = [r for r, n in ((Role.PREFILL, c.prefill), (Role.DECODE, c.decode), (Role.MIXED, c.mixed)) if n]
    seen: set[str] = set()
    for role in roles:
        over = {Role.PREFILL: c.prefill_engine, Role.DECODE: c.decode_engine}.get(role)
        where = f"cluster.{role.value}_engine" if over is not None else "cluster.engine"
        for line in mismatches(src, c.engine_for(role), where):
            if line not in seen:
                seen.add(line)
                print(f"warning: {line}", file=sys.stderr)
    return {"source_engine": dataclasses.asdict(src)}
