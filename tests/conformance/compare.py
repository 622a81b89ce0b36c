"""What the two runtimes did, in one vocabulary: each request's placement and the actions
(migrations, deflections, role flips) of the run.

A placement is (prefill instance, decode instance) as first decided, migrations left out:
live from the gateway's decision log (``/admin/decisions``: a ``deflect`` entry replaces
the queued prefill and its decode; a colocated leg logs the same instance twice),
simulated from the record's path without its migration hops (the simulator appends an
instance when a prefill starts there, when KV joins there, and at each migration).
"""

from __future__ import annotations

import itertools
from collections import Counter

from baton.sim.simulator import SimResult
from tests.conformance.harness import Samples, total

Placement = tuple[int, int]
ACTIONS = ("migrations", "deflections", "flips")


def live_placements(decisions: list[tuple[str, int, int]]) -> dict[int, Placement]:
    """Request id -> (prefill, decode) from the gateway's decision log."""
    prefill: dict[int, int] = {}
    decode: dict[int, int] = {}
    for kind, rid, inst in decisions:
        if kind == "prefill":
            prefill[rid] = inst
        elif kind == "decode":
            decode[rid] = inst
        elif kind == "deflect":
            prefill[rid] = decode[rid] = inst
    return {rid: (p, decode.get(rid, p)) for rid, p in prefill.items()}


def sim_placements(result: SimResult) -> dict[int, Placement]:
    """Request id -> (prefill, decode) from the simulator's records."""
    out = {}
    for r in result.records:
        hops = [result.instance_names.index(n) for n in r.path.split(">")] if r.path else []
        hops = hops[:len(hops) - r.migrations]
        if hops:
            out[r.req_id] = (hops[0], hops[-1])
    return out


def shares(placements: dict[int, Placement]) -> dict[tuple[str, int], float]:
    """Share of placements per (phase, instance): each request counts once as a prefill
    and once as a decode."""
    counts = Counter(("prefill", p) for p, _ in placements.values())
    counts.update(("decode", d) for _, d in placements.values())
    n = sum(counts.values()) or 1
    return {k: v / n for k, v in counts.items()}


def tvd(a: dict[int, Placement], b: dict[int, Placement], groups: list[list[int]] | None = None) -> float:
    """Total variation distance between the two runs' per-(phase, instance) shares (0..1),
    the least over renamings of interchangeable instances (``groups``: instances that
    started in the same role on the same engine): which of two idle decode instances a
    policy picks on a tie, or lends to prefill, is a name, not a behaviour."""
    sa, sb = shares(a), shares(b)
    best = 1.0
    for rename in _renamings(groups or []):
        moved = {(phase, rename.get(i, i)): v for (phase, i), v in sb.items()}
        best = min(best, 0.5 * sum(abs(sa.get(k, 0.0) - moved.get(k, 0.0)) for k in set(sa) | set(moved)))
    return best


def _renamings(groups: list[list[int]]):
    """Every mapping of instance ids that permutes each group within itself."""
    for perms in itertools.product(*(itertools.permutations(g) for g in groups)):
        yield {i: j for g, p in zip(groups, perms) for i, j in zip(g, p)}


def interchangeable(cluster: tuple[int, int, int]) -> list[list[int]]:
    """Instance ids by starting role (prefill, decode, mixed: ids in that order)."""
    p, d, m = cluster
    return [list(range(p)), list(range(p, p + d)), list(range(p + d, p + d + m))]


def live_actions(metrics: Samples) -> dict[str, float]:
    return {"migrations": total(metrics, "baton_migrations_total", result="ok"),
            "deflections": total(metrics, "baton_deflections_total"),
            "flips": total(metrics, "baton_role_flips_total")}


def sim_actions(result: SimResult) -> dict[str, float]:
    """The simulator's counts; a deflection is any request prefilled on a decode-capable
    instance with a chunk limit (at arrival or re-planned), as the gateway counts them."""
    return {"migrations": result.counters.migrations,
            "deflections": sum(1 for r in result.records if r.deflected),
            "flips": result.counters.role_changes}
