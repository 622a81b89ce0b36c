"""Gateway config: every error names the key at fault."""

import pytest

from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.gateway.config import load_config, parse_config

ENGINE = {"url": "http://127.0.0.1:9000", "role": "decode"}


def test_defaults_and_metric_names():
    cfg = parse_config({"engines": [ENGINE, {"url": "http://h:1", "role": "prefill", "type": "sglang",
                                             "metric_names": {"running": "my_running"}}]})
    assert cfg.engines[0].role is Role.DECODE and cfg.engines[0].name == "127.0.0.1:9000"
    assert cfg.engines[0].metric_names["kv_usage"] == "vllm:kv_cache_usage_perc"
    assert cfg.engines[1].metric_names == {"running": "my_running", "waiting": "sglang:num_queue_reqs",
                                           "kv_usage": "sglang:token_usage", "preemptions": None}


def test_admin_token_from_environment(monkeypatch):
    monkeypatch.setenv("BATON_ADMIN_TOKEN", "admin-token-from-env")
    assert parse_config({"engines": [ENGINE]}).admin_token == "admin-token-from-env"
    assert parse_config({"engines": [ENGINE], "admin_token": "admin-token-in-config"}).admin_token == "admin-token-in-config"


@pytest.mark.parametrize("raw, where", [
    ([], "expected a mapping"),
    ({}, "engines"),
    ({"engines": [{"url": "ftp://x", "role": "decode"}]}, "engines[0].url"),
    ({"engines": [{"url": "http://x:1", "role": "boss"}]}, "engines[0].role"),
    ({"engines": [{**ENGINE, "type": "trt"}]}, "engines[0].type"),
    ({"engines": [{**ENGINE, "kv_blocks": -3}]}, "engines[0].kv_blocks"),
    ({"engines": [{**ENGINE, "colour": 1}]}, "engines[0].colour"),
    ({"engines": [{**ENGINE, "metric_names": {"speed": "x"}}]}, "engines[0].metric_names"),
    ({"engines": [ENGINE, ENGINE]}, "unique"),
    ({"engines": [ENGINE], "port": "80"}, "port"),
    ({"engines": [ENGINE], "pd_protocol": "carrier-pigeon"}, "pd_protocol"),
    ({"engines": [ENGINE], "max_inflight": 0}, "max_inflight"),
    ({"engines": [ENGINE], "link_gbps": 0}, "link_gbps"),
    ({"engines": [ENGINE], "listen": 1}, "listen"),
])
def test_errors_name_the_key(raw, where):
    with pytest.raises(ConfigError, match=None) as exc:
        parse_config(raw)
    assert where in str(exc.value)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines: [\n")
    with pytest.raises(ConfigError, match="bad.yaml:2: malformed YAML"):
        load_config(bad)


def test_serve_cli_reports_config_errors_in_one_line(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "gw.yaml"
    bad.write_text("engines:\n  - {url: 'http://x:1', role: boss}\n")
    out = subprocess.run([sys.executable, "-m", "baton.cli.main", "serve", "--config", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "engines[0].role" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "baton.cli.main", "serve", "--config", str(bad), "--policy", "x"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2


def test_the_example_config_is_valid():
    from pathlib import Path
    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "gateway-1p2d.yaml")
    assert [e.role for e in cfg.engines] == [Role.PREFILL, Role.DECODE, Role.DECODE]


def test_client_keys_need_a_token_for_metrics(monkeypatch):
    monkeypatch.delenv("BATON_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("BATON_METRICS_TOKEN", raising=False)
    engines = [{"url": "http://127.0.0.1:1", "role": "mixed"}]
    with pytest.raises(ConfigError, match="metrics_token"):
        parse_config({"engines": engines, "api_keys": ["k"]})
    assert parse_config({"engines": engines, "api_keys": ["k"], "metrics_token": "metrics-token-for-tests"}).metrics_token == "metrics-token-for-tests"
    monkeypatch.setenv("BATON_METRICS_TOKEN", "admin-token-from-env")
    assert parse_config({"engines": engines, "api_keys": ["k"]}).metrics_token == "admin-token-from-env"


@pytest.mark.parametrize("engine, says", [
    ({"url": "http://127.0.0.1:99999", "role": "mixed"}, "engines[0].url: expected a port in 1-65535"),
    ({"url": "http://127.0.0.1:0", "role": "mixed"}, "expected a port in 1-65535"),
    ({"url": "http://:8000", "role": "mixed"}, "expected an http(s) URL"),
    ({"url": "http://127.0.0.1:8000", "role": "mixed", "name": "a\nb"}, "engines[0].name: only letters"),
    ({"url": "http://127.0.0.1:8000", "role": "mixed", "name": 'x"} 1'}, "only letters, digits and -_.:"),
    ({"url": "http://127.0.0.1:8000", "role": "mixed", "name": "n" * 129}, "at most 128 characters"),
    ({"url": "http://127.0.0.1:8000", "role": "mixed", "name": "123"}, "must not be all digits"),
    ({"url": "http://127.0.0.1:8000", "role": "mixed", "kv_blocks": 10**15}, "engines[0].kv_blocks"),
])
def test_an_engine_s_port_name_and_blocks_are_checked(engine, says):
    """An engine (from a config, or the admin API's add call, which parses the same way)
    with a port out of range, a name that is no label, or an absurd block count is refused
    with the key named, not taken (a name with a newline became a metric label and a log
    line; port 99999 made a later URL read raise)."""
    with pytest.raises(ConfigError) as err:
        parse_config({"engines": [engine]})
    assert says in str(err.value)
    parse_config({"engines": [{"url": "http://127.0.0.1:8000", "role": "mixed", "name": "prefill-0.a_b:1",
                               "kv_blocks": 4096}]})  # an ordinary one passes


@pytest.mark.parametrize("key", ["admin_token", "metrics_token"])
@pytest.mark.parametrize("token, says", [
    ("t0ken", "at least 16 characters"),
    ("change-me", "example token shipped with Baton"),
    ("replace-with-a-long-random-token", "example token shipped with Baton"),
])
def test_guessable_tokens_are_refused_at_start(monkeypatch, key, token, says):
    """First hour, item 4: the quick start and compose shipped `change-me` as the admin token,
    and the admin API can add engines by URL."""
    monkeypatch.delenv("BATON_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=f"{key}: .*{says}"):
        parse_config({"engines": [ENGINE], key: token})
    monkeypatch.setenv("BATON_" + key.upper(), token)
    with pytest.raises(ConfigError, match=key):
        parse_config({"engines": [ENGINE]})


def test_no_shipped_file_carries_a_token_and_compose_publishes_on_loopback():
    """Every example config, the compose file and the docs: no admin or metrics token a copied
    file would start with, and the gateway published on 127.0.0.1 only."""
    import re
    from pathlib import Path

    import yaml

    from baton.gateway.config import SHIPPED_EXAMPLE_TOKENS
    root = Path(__file__).resolve().parents[2]
    for path in [*root.glob("examples/**/*.yaml"), *root.glob("docs/**/*.md"), root / "README.md"]:
        for token in re.findall(r"^\s*(?:admin|metrics)_token:\s*([^\s#]+)", path.read_text(), re.M):
            assert token in ("...",) or token.startswith("$"), (path, token)
    compose = yaml.safe_load((root / "compose.yaml").read_text())["services"]["gateway"]
    assert compose["ports"] == ["127.0.0.1:8000:8000"]
    assert compose["environment"]["BATON_ADMIN_TOKEN"] == "${BATON_ADMIN_TOKEN:-}"
    assert "change-me" in SHIPPED_EXAMPLE_TOKENS
