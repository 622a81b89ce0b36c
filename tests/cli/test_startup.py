"""``baton simulate`` starts with what a simulation needs: the gateway, the emulator's
engine loop, the HTTP and metrics libraries, process pools and YAML stay unimported (a
whole-process run of a small trace is mostly start-up)."""

import json
import subprocess
import sys

RUN = r'''
import json, sys
from baton.cli.main import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}), file=sys.stderr)
'''

HEAVY = ("baton.gateway", "baton.emulator.engine_loop", "baton.emulator.server", "prometheus_client", "aiohttp",
         "zmq", "grpc", "matplotlib", "ray", "torch", "concurrent.futures.process", "yaml")


def _modules(tmp_path, *args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    out = json.loads(done.stderr.strip().splitlines()[-1])
    assert out["rc"] == 0, done.stderr
    return out["modules"]


def test_simulate_imports_no_runtime_it_does_not_run(tmp_path):
    mods = _modules(tmp_path, "simulate", "--mixed", "1", "--prefill", "0", "--decode", "0", "--policy",
                    "colocated-rr", "--requests", "20", "--rate", "0.3", "--quiet", "--json", "--out", str(tmp_path))
    loaded = [m for m in mods if m.startswith(HEAVY)]
    assert loaded == []
    assert "baton.sim.simulator" in mods and "baton.engine_model.prefill_run" in mods  # it did simulate


def test_serve_help_still_has_the_gateway_flags():
    done = subprocess.run([sys.executable, "-m", "baton.cli.main", "serve", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "--workers" in done.stdout and "--port" in done.stdout
