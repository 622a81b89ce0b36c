"""Matching a paper's regime: the knob goes where the baseline's figure is nearest the
paper's (the same knob for both policies), the YAML block is checked, and reproduce shows
the matched run beside the default."""

import json

import pytest

from baton.core.errors import ConfigError
from baton.experiments import Experiment
from baton.experiments.matching import Match, calibrate, parse_match, with_knob
from tests.cli.test_cli import baton
from tests.cli.test_reproduce import TINY


def test_the_knob_goes_where_the_baseline_figure_is_nearest_the_target():
    seen = []

    def measure(exp, policy):
        seen.append((exp.cluster.engine.kv_tokens, policy))
        return {"p99_tpot_s": 10.0 / exp.cluster.engine.kv_tokens}  # less KV, a longer tail

    m = Match("p99_tpot_s", 0.0001, "kv_tokens", (50_000, 100_000, 200_000), policy="pd-kv")
    c = calibrate(m, Experiment(), "ils", measure)
    assert (c.value, c.figure) == (100_000, 0.0001) and seen[0][1] == "pd-kv" and len(c.tried) == 3


def test_bisection_closes_in_between_grid_values_that_bracket_the_target():
    m = Match("p99_tpot_s", 10.0 / 140_000, "kv_tokens", (100_000, 200_000), refine=4)
    c = calibrate(m, Experiment(), "pd-kv", lambda exp, _: {"p99_tpot_s": 10.0 / exp.cluster.engine.kv_tokens})
    assert len(c.tried) == 2 + 4 and abs(c.value - 140_000) <= 100_000 / 2 ** 4


def test_with_knob_sets_every_role_or_the_rate():
    exp = Experiment()
    assert with_knob(exp, "kv_tokens", 1234).cluster.engine.kv_tokens == 1234
    assert with_knob(exp, "rate_rps", 3.5).workload.synthetic.rate_rps == 3.5


@pytest.mark.parametrize("block,match", [({"metric": "x", "target": 1, "knob": "flux", "values": [1]}, "match.knob"),
                                         ({"metric": "x", "target": 1, "knob": "kv_tokens"}, "match.values"),
                                         ({"metric": "x", "target": -1, "knob": "kv_tokens", "values": [1]},
                                          "match.target")])
def test_bad_match_blocks_name_the_key(block, match):
    with pytest.raises(ConfigError, match=match):
        parse_match(block, "f.yaml")


MATCHED = TINY.replace("claim: -0.5\n", "claim: -0.2\nmatch: {metric: p99_tpot_s, target: 0.02, knob: kv_tokens, "
                                          "values: [20000, 200000]}\n")


def test_reproduce_shows_the_matched_run_beside_the_default(tmp_path):
    (tmp_path / "repro" / "ares").mkdir(parents=True)
    (tmp_path / "repro" / "ares" / "tiny.yaml").write_text(MATCHED)
    p = baton("reproduce", "ares", "--dir", str(tmp_path / "repro"), "--repeats", "2", "--json", "--quiet",
              "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    out = {c["name"]: c for c in json.loads(p.stdout)["claims"]}
    assert list(out) == ["tiny", "tiny (matched)"]
    matched = out["tiny (matched)"]["matched"]
    assert matched["knob"] == "kv_tokens" and matched["value"] in (20000, 200000) and len(matched["tried"]) == 2
    assert "matched" not in out["tiny"]
