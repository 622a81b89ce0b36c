"""Settings defined once (``core.settings``): the errors a bad config gets name the key path,
the value, what was expected and the closest known key, at the top level and nested in an
engine, a cluster and a policy stage, in both config files."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from baton.core import settings
from baton.core.errors import ConfigError
from baton.core.settings import setting
from baton.experiments.config import experiment_from_dict
from baton.gateway.config import parse_config

ENGINE = {"url": "http://127.0.0.1:9000", "role": "decode"}


@pytest.mark.parametrize("raw,message", [
    # unknown keys, with a suggestion
    ({"engines": [ENGINE], "max_inflite": 3}, "max_inflite: unknown key (did you mean 'max_inflight'?)"),
    ({"engines": [{**ENGINE, "rol": "x"}]}, "engines[0].rol: unknown key (did you mean 'role'?)"),
    ({"engines": [ENGINE], "outlier_detection": {"intervl_s": 1}},
     "outlier_detection.intervl_s: unknown key (did you mean 'interval_s'?)"),
    ({"engines": [ENGINE], "policy": {"stages": [{"stage": "sibyl", "alpah": 0.9}]}},
     "policy.stages[0].alpah: unknown key (did you mean 'alpha'?)"),
    # out of range
    ({"engines": [ENGINE], "max_inflight": 0}, "max_inflight: expected a number > 0, got 0"),
    ({"engines": [{**ENGINE, "kv_blocks": -3}]}, "engines[0].kv_blocks: expected a number > 0, got -3"),
    ({"engines": [ENGINE], "outlier_detection": {"max_ejection_percent": 150}},
     "outlier_detection.max_ejection_percent: expected a number <= 100, got 150.0"),
    ({"engines": [ENGINE], "policy": {"stages": [{"stage": "sibyl", "tick_s": 0}]}},
     "policy.stages[0].tick_s: expected a number > 0, got 0.0"),
    # wrong type
    ({"engines": [ENGINE], "port": "80"}, "port: expected an integer, got '80'"),
    ({"engines": [{**ENGINE, "role": "boss"}]}, "engines[0].role: expected one of prefill, decode, mixed, got 'boss'"),
    ({"engines": [ENGINE], "policy": {"stages": [{"stage": "sibyl", "prob": "yes"}]}},
     "policy.stages[0].prob: expected true or false, got 'yes'"),
    ({"engines": [{**ENGINE, "api_key": 5}]}, "engines[0].api_key: expected a string, got (hidden)"),
    # choices, with a suggestion
    ({"engines": [ENGINE], "pd_protocol": "nixel"}, "pd_protocol: expected one of nixl, sglang, got 'nixel' "
                                                    "(did you mean 'nixl'?)"),
])
def test_gateway_config_errors_name_the_key_value_and_expectation(raw, message):
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert str(err.value) == message


@pytest.mark.parametrize("raw,message", [
    ({"clustr": {}}, "clustr: unknown key (did you mean 'cluster'?)"),
    ({"cluster": {"prefil": 2}}, "cluster.prefil: unknown key (did you mean 'prefill'?)"),
    ({"cluster": {"engine": {"max_num_seq": 8}}}, "cluster.engine.max_num_seq: unknown key (did you mean "
                                                  "'max_num_seqs'?)"),
    ({"cluster": {"decode_engine": {"gpu_memory_utilization": 1.5}}},
     "cluster.decode_engine.gpu_memory_utilization: expected a number <= 1, got 1.5"),
    ({"cluster": {"nic_gbps": "fast"}}, "cluster.nic_gbps: expected a number, got 'fast'"),
    ({"workload": {"synthetic": {"cap_share": 2}}}, "workload.synthetic.cap_share: expected a number <= 1, got 2.0"),
    ({"workload": {"kind": "sessions", "agent_share": -1}}, "workload.agent_share: expected a number >= 0, "
                                                            "got -1.0"),
    ({"slo": {"ttft_s": 0}}, "slo.ttft_s: expected a number > 0, got 0.0"),
    ({"view": {"mode": "psychic"}}, "view.mode: expected one of exact, scraped, scraped-only, got 'psychic'"),
])
def test_experiment_config_errors_name_the_key_value_and_expectation(raw, message):
    with pytest.raises(ConfigError) as err:
        experiment_from_dict(raw)
    assert str(err.value) == message


def test_given_values_are_typed_and_defaults_fill_the_rest():
    exp = experiment_from_dict({"cluster": {"prefill": 1, "nic_gbps": 25, "engine": {"max_num_seqs": 8},
                                            "decode_engine": {"block_size": 16}},
                                "workload": {"kind": "sessions", "sessions": 3, "requests": 10}, "seed": 4})
    assert exp.cluster.prefill == 1 and exp.cluster.decode == 2 and isinstance(exp.cluster.nic_gbps, float)
    assert exp.cluster.decode_engine.max_num_seqs == 8  # over cluster.engine
    assert exp.workload.sessions.sessions == 3 and exp.workload.requests == 10 and exp.seed == 4


@dataclass
class Inner:
    """A nested settings type."""

    depth_tokens: int = setting(4, ge=1, unit="tokens", doc="how deep")


@dataclass
class Outer:
    """A settings type."""

    name: str = setting(doc="required")
    inner: Inner = setting(factory=Inner, doc="nested")
    mode: str | None = setting(None, choices=("a", "b"), doc="a choice")
    share: float = setting(0.5, ge=0, le=1, doc="a share")
    derived: int = 0  # not a setting: never read from YAML


def test_json_schema_carries_types_bounds_units_defaults_and_required_keys():
    schema = settings.json_schema(Outer, "t")
    assert schema["required"] == ["name"] and schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"name", "inner", "mode", "share"}
    assert schema["properties"]["share"] == {"type": "number", "description": "a share", "default": 0.5,
                                             "minimum": 0, "maximum": 1}
    inner = schema["properties"]["inner"]["properties"]["depth_tokens"]
    assert inner == {"type": "integer", "description": "how deep (tokens)", "default": 4, "minimum": 1}
    assert schema["properties"]["mode"]["enum"] == ["a", "b"]


def test_missing_required_and_internal_fields():
    with pytest.raises(ConfigError, match="^name: required"):
        settings.parse(Outer, {}, "")
    with pytest.raises(ConfigError, match="derived: unknown key"):
        settings.parse(Outer, {"name": "x", "derived": 1}, "")
    assert settings.parse(Outer, {"name": "x", "inner": {"depth_tokens": 2}}, "").inner.depth_tokens == 2
