"""Policies that need a kind of cluster say so before they run (issue 34, item 6)."""

from __future__ import annotations

import pytest
import yaml

from baton.core.errors import ConfigError
from baton.perf import presets
from baton.policies import scheduler_for
from tests.cli.test_cli import baton


@pytest.mark.parametrize("policy,prefill,decode,mixed,ok", [
    ("cascade", 0, 0, 4, True),
    ("cascade", 2, 2, 0, False),   # a PD cluster: it would serve every request some other way
    ("cascade", 1, 0, 3, False),
    ("least-loaded", 2, 2, 0, True),
    ("least-loaded", 0, 0, 4, True),
])
def test_colocated_only_policies_refuse_other_clusters(policy, prefill, decode, mixed, ok):
    from baton.profiling.qoe import extras_for

    sched = scheduler_for(policy, presets.build("llama-3.2-3b@h100"), 0, extras=extras_for(policy, "llama-3.2-3b@h100"))
    if ok:
        sched.check_cluster(prefill, decode, mixed)
    else:
        with pytest.raises(ConfigError, match="colocated instances only"):
            sched.check_cluster(prefill, decode, mixed)


def test_simulate_and_serve_refuse_cascade_on_a_pd_cluster(tmp_path):
    sim = baton("simulate", "--policy", "cascade", "--requests", "20", "--preset", "llama-3.2-3b@h100",
                "--out", str(tmp_path / "o"))
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({"policy": "cascade", "preset": "llama-3.2-3b@h100", "engines": [
        {"name": "p", "url": "http://127.0.0.1:9", "role": "prefill"},
        {"name": "d", "url": "http://127.0.0.1:9", "role": "decode"}]}))
    serve = baton("serve", "--config", str(config), timeout=60)
    for p in (sim, serve):
        assert p.returncode != 0 and "Traceback" not in p.stderr
        assert "runs on colocated instances only" in p.stderr, p.stderr
