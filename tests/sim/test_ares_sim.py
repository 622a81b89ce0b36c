"""ARES inside the simulator: migrations happen, every request still ends with all its
tokens, and the decode token-load variance over time actually drops."""

import numpy as np
import pytest

from baton.metrics import SLO
from baton.sim import ClusterSpec, simulate
from baton.workload import SyntheticSpec, generate


def workload():
    spec = SyntheticSpec(requests=160, rate_rps=0.8, prompt="uniform", prompt_low=64, prompt_high=1024,
                         output="reasoning", output_cap=16384, cap_share=0.17, output_median=1500,
                         output_sigma=1.0)
    return generate(spec, np.random.default_rng(2))


@pytest.fixture(scope="module")
def runs():
    reqs = workload()
    cluster = ClusterSpec(prefill=1, decode=3, nic_gbps=25)
    return reqs, {p: simulate(reqs, cluster, p, seed=0) for p in ("pd-kv", "ares-oracle", "ares", "ares-none")}


def test_every_request_ends_with_all_its_tokens(runs):
    reqs, results = runs
    for res in results.values():
        assert all(r.finished for r in res.records)
        assert sum(r.output_tokens for r in res.records) == sum(r.output_tokens for r in reqs)


def test_migrations_happen_and_lower_load_variance(runs):
    _, results = runs
    base = results["pd-kv"].summary(SLO())
    for policy in ("ares-oracle", "ares"):
        s = results[policy].summary(SLO())
        assert s["migrations"] > 0 and s["migration_bytes"] > 0
        assert s["load_variance_tokens2"] < 0.8 * base["load_variance_tokens2"], policy
    assert base["migrations"] == 0
