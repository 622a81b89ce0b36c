"""Request classes live (``gateway.classes``), table-driven: where a request's band, tenant
and SLOs come from, which client headers the config allows (a 400 naming the header
otherwise, never a silent default), and config errors that name the key at fault."""

from __future__ import annotations

import pytest

from baton.core.errors import ConfigError
from baton.core.settings import parse
from baton.gateway.auth import key_id
from baton.gateway.classes import MAX_LABELS, Classes, ClassSettings, Labels, RequestClass
from baton.protocol.errors import ApiError

BASE = {"objectives": {"interactive": {"priority": 2, "ttft_slo_ms": 1000, "tpot_slo_ms": 50},
                       "batch": {"priority": 0, "ttft_slo_ms": 30000, "tpot_slo_ms": 200}},
        "models": {"chat-model": "interactive"},
        "tenants": {"team-a": {"api_keys": ["ka"], "objective": "batch"}, "team-b": {"api_keys": ["kb"]}}}
KA, KB = key_id(b"ka"), key_id(b"kb")
INTERACTIVE = RequestClass(2, "", 1.0, 0.05)
BATCH = RequestClass(0, "", 30.0, 0.2)


def classes(client_headers: str = "none", **more) -> Classes:
    settings = parse(ClassSettings, {**BASE, "client_headers": client_headers, **more}, "classes")
    settings.check()
    return Classes(settings)


@pytest.mark.parametrize("mode,headers,client,model,want", [
    ("none", {}, "", None, RequestClass()),  # nothing classes it: band 0, the gateway's SLOs
    ("none", {}, "", "chat-model", INTERACTIVE),  # by model name
    ("none", {}, KA, "chat-model", BATCH._replace(tenant="team-a")),  # the key's tenant's objective first
    ("none", {}, KB, "chat-model", INTERACTIVE._replace(tenant="team-b")),  # a tenant without one: by model
    ("objective", {"x-baton-objective": "batch"}, "", "chat-model", BATCH),  # the header first
    ("objective", {"x-gateway-inference-objective": "batch"}, "", None, BATCH),  # GIE's name for it
    ("all", {"x-baton-priority": "7", "x-baton-ttft-slo-ms": "250"}, "", "chat-model",
     RequestClass(7, "", 0.25, 0.05)),  # values override the objective's
    ("all", {"x-baton-tenant": "t1"}, "", None, RequestClass(tenant="t1")),
    ("all", {"x-gateway-inference-fairness-id": "t2"}, "", None, RequestClass(tenant="t2")),
    ("all", {"x-baton-tenant": "team-a"}, KA, None, BATCH._replace(tenant="team-a")),  # its own tenant: fine
])
def test_class_of_a_request(mode, headers, client, model, want):
    assert classes(mode).of(headers, client, model) == want


@pytest.mark.parametrize("mode,headers,client,code,names", [
    ("none", {"x-baton-priority": "5"}, "", "class_header_forbidden", "x-baton-priority"),
    ("none", {"x-baton-objective": "batch"}, "", "class_header_forbidden", "x-baton-objective"),
    ("objective", {"x-baton-tenant": "me"}, "", "class_header_forbidden", "x-baton-tenant"),
    ("objective", {"x-baton-objective": "urgent"}, "", "unknown_objective", "urgent"),
    ("all", {"x-baton-priority": "high"}, "", "invalid_priority", "x-baton-priority"),
    ("all", {"x-baton-priority": "5000"}, "", "invalid_priority", "x-baton-priority"),
    ("all", {"x-baton-ttft-slo-ms": "-3"}, "", "invalid_slo", "x-baton-ttft-slo-ms"),
    ("all", {"x-baton-tpot-slo-ms": "nan"}, "", "invalid_slo", "x-baton-tpot-slo-ms"),
    ("all", {"x-baton-tenant": "a b"}, "", "invalid_tenant", "x-baton-tenant"),
    ("all", {"x-baton-tenant": "team-b"}, KA, "invalid_tenant", "another tenant"),  # no claiming another's
    ("all", {"x-baton-tenant": "a", "x-gateway-inference-fairness-id": "b"}, "", "conflicting_headers", "disagree"),
])
def test_a_bad_or_forbidden_class_header_is_a_400_that_names_it(mode, headers, client, code, names):
    with pytest.raises(ApiError) as err:
        classes(mode).of(headers, client, None)
    assert err.value.status == 400 and err.value.code == code and names in err.value.message


@pytest.mark.parametrize("raw,message", [
    ({"models": {"m": "nope"}}, "classes.models.m: unknown objective 'nope'"),
    ({"default_objective": "nope"}, "classes.default_objective: unknown objective"),
    ({"tenants": {"t": {"objective": "nope"}}}, "classes.tenants.t.objective: unknown objective"),
    ({"tenants": {"t": {"api_keys": ["k"]}, "u": {"api_keys": ["k"]}}}, "a key of tenant t too"),
    ({"tenants": {"a b": {}}}, "classes.tenants.a b: expected 1-64"),
    ({"objectives": {"x": {"priority": 5000}}}, "classes.objectives.x.priority: expected a number <= 1000"),
    ({"client_headers": "some"}, "classes.client_headers: expected one of none, objective, all"),
])
def test_config_errors_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse(ClassSettings, raw, "classes").check()


def test_labels_are_bounded():
    labels = Labels({"0", "2", ""})
    assert labels(2) == "2" and labels("") == "none"
    seen = {labels(f"t{k}") for k in range(MAX_LABELS + 5)}
    assert len(seen) == MAX_LABELS + 1 and "other" in seen
    assert labels("t0") == "t0"  # one seen before keeps its own label


def test_the_example_config_classes_as_its_comments_say(monkeypatch):
    from pathlib import Path
    monkeypatch.setenv("BATON_METRICS_TOKEN", "metrics-token-for-tests")  # as its first line says

    from baton.gateway.config import load_config
    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "gateway-classes.yaml")
    c = Classes(cfg.classes)
    search, research = key_id(b"search-key-change-me"), key_id(b"research-key-change-me")
    assert c.of({}, search, "chat") == RequestClass(1, "search", 1.0, 0.05)  # by model
    assert c.of({}, research, "chat") == RequestClass(0, "research", 30.0, 0.2)  # its tenant's objective
    assert c.of({"x-baton-objective": "interactive"}, research, None).priority == 1
    assert c.of({}, search, "other-model").priority == 0  # the default objective
    with pytest.raises(ApiError):
        c.of({"x-baton-priority": "3"}, search, None)
