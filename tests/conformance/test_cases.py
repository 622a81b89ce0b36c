"""The conformance table itself, checked without servers: every policy has a case, every
case is classified with a reason, and every trace does what its case says in the
simulator even when timing is perturbed (so a live failure is the gateway's, not the
trace's).

Perturbations (``ROBUST_RUNS``): each arrival moved by up to +-50 ms, the whole trace by
+-150 ms against the ticks (a late start, a tick loop that drifts), engines 0.9x to 1.2x as
fast, scrapes seen up to 0.3 s late (the gateway's scrape loop sleeps a whole interval
after each scrape, so its scrapes drift later than the simulator's fixed ones). The live
machine is loaded, and these are the margins its timing noise needs. EXACT cases must keep
every placement; acting cases must still act; the others must keep their spread of
placements within half the live tolerance (``STABLE_TVD``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from baton.policies.catalog import POLICIES
from tests.conformance.cases import CASES, DISTRIBUTION, EXACT, TVD_TOLERANCE
from tests.conformance.compare import ACTIONS, interchangeable, sim_actions, sim_placements, tvd
from tests.conformance.runner import run_sim

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# (engine time factor, jitter seed, scrape delay s, all arrivals shifted by s)
ROBUST_RUNS = [(0.9, 1, 0.0, 0.0), (1.0, 2, 0.15, 0.0), (1.2, 3, 0.3, 0.0), (1.0, 4, 0.0, 0.15), (1.1, 5, 0.1, -0.15)]
STABLE_TVD = TVD_TOLERANCE / 2
JITTER_S = 0.05
POLICY_SEEDS = 24
PERTURBED_SEEDS = 8  # policy seeds also run under every timing perturbation


def composed_policies(node: Any) -> list[dict]:
    """Every ``{name, stages: [...]}`` mapping anywhere in a parsed YAML document."""
    if isinstance(node, dict):
        found = [node] if isinstance(node.get("stages"), list) and "name" in node else []
        return found + [p for v in node.values() for p in composed_policies(v)]
    if isinstance(node, list):
        return [p for v in node for p in composed_policies(v)]
    return []


def test_every_catalog_policy_has_a_case() -> None:
    names = {c.name for c in CASES if isinstance(c.policy, str)}
    assert set(POLICIES) <= names, f"policies without a conformance case: {sorted(set(POLICIES) - names)}"
    assert all(c.policy == c.name for c in CASES if isinstance(c.policy, str) and not c.flow)


def test_every_composed_policy_of_the_examples_has_a_case() -> None:
    composed = {c.name: c.policy for c in CASES if not isinstance(c.policy, str)}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for policy in composed_policies(yaml.safe_load(path.read_text())):
            assert composed.get(policy["name"]) == policy, f"{path.name}: no case runs {policy}"


def test_every_case_is_classified_with_a_reason() -> None:
    assert len({c.name for c in CASES}) == len(CASES)
    for c in CASES:
        assert c.compare in (EXACT, DISTRIBUTION) and c.why, c.name
        assert c.acts <= set(ACTIONS), c.name
        assert len(c.trace) >= 10 and all(r.prompt_tokens >= 6 for r in c.trace), c.name
        gaps = np.diff([r.arrival_s for r in c.requests()])
        assert gaps.min() >= 0.1 - 1e-9, f"{c.name}: arrivals closer than 100 ms may reach the gateway out of order"


def _perturbed(case, speed: float, seed: int, delay_s: float, shift_s: float, policy_seed: int = 0):
    jitter = np.random.default_rng(seed).uniform(-JITTER_S, JITTER_S, len(case.trace)) + shift_s
    return run_sim(case, jitter.tolist(), speed, delay_s, seed=policy_seed)


@pytest.mark.parametrize("name", [c.name for c in CASES if c.compare == EXACT])
def test_deterministic_traces_are_robust_in_the_simulator(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    reference = sim_placements(run_sim(case))
    for speed, seed, delay, shift in ROBUST_RUNS:
        got = sim_placements(_perturbed(case, speed, seed, delay, shift))
        differ = {r: (reference[r], got[r]) for r in reference if got.get(r) != reference[r]}
        assert not differ, f"x{speed}, seed {seed}, delay {delay}, shift {shift}: placements change {differ}"


@pytest.mark.parametrize("name", [c.name for c in CASES if c.compare == DISTRIBUTION])
def test_distribution_traces_are_stable_in_the_simulator(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    reference, groups = sim_placements(run_sim(case)), interchangeable(case.cluster)
    for speed, seed, delay, shift in ROBUST_RUNS:
        distance = tvd(reference, sim_placements(_perturbed(case, speed, seed, delay, shift)), groups)
        assert distance <= STABLE_TVD, f"x{speed}, seed {seed}, delay {delay}, shift {shift}: TVD {distance:.3f}"


@pytest.mark.parametrize("name", [c.name for c in CASES if c.acts])
def test_traces_make_their_policy_act_in_the_simulator(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    for speed, seed, delay, shift in ROBUST_RUNS:
        acted = sim_actions(_perturbed(case, speed, seed, delay, shift))
        assert all(acted[a] > 0 for a in case.acts), f"x{speed}, seed {seed}, delay {delay}, shift {shift}: {acted}"


@pytest.mark.parametrize("name", [c.name for c in CASES if c.acts])
def test_traces_make_their_policy_act_whatever_its_random_draws(name: str) -> None:
    """The gateway's random stream is seeded like the simulator's, but what each draw falls
    on depends on live timing (how many sequences a snapshot holds when a window is thinned,
    which candidates a sample sees): a trace must make its policy act under any stream."""
    case = next(c for c in CASES if c.name == name)
    for seed in range(1, POLICY_SEEDS + 1):
        acted = sim_actions(run_sim(case, seed=seed))
        assert all(acted[a] > 0 for a in case.acts), f"policy seed {seed}: {acted}"
    for seed in range(1, PERTURBED_SEEDS + 1):  # and with timing perturbed as well
        for speed, jitter_seed, delay, shift in ROBUST_RUNS:
            acted = sim_actions(_perturbed(case, speed, jitter_seed, delay, shift, seed))
            assert all(acted[a] > 0 for a in case.acts), \
                f"policy seed {seed}, x{speed}, jitter seed {jitter_seed}, delay {delay}, shift {shift}: {acted}"


@pytest.mark.parametrize("name", [c.name for c in CASES if c.flow])
def test_flow_control_order_is_robust_in_the_simulator(name: str) -> None:
    """Flow control releases the same requests in the same order, and sheds the same ones,
    under every timing perturbation."""
    case = next(c for c in CASES if c.name == name)
    reference = run_sim(case)
    shed = {r.req_id for r in reference.records if r.reject_reason == "shed"}
    assert shed and reference.placement_order != sorted(reference.placement_order), "the trace must make it act"
    for speed, seed, delay, shift in ROBUST_RUNS:
        got = _perturbed(case, speed, seed, delay, shift)
        assert got.placement_order == reference.placement_order, f"x{speed}, seed {seed}: {got.placement_order}"
        assert {r.req_id for r in got.records if r.reject_reason == "shed"} == shed
