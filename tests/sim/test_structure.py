"""The simulator's layout: its helpers act through the SimPort and never import the
simulator; the Recorder only measures; no module grows past 400 lines."""

from baton.sim.port import SimPort
from tests.sim.helpers import req, run
from tests.test_layering import SRC, graph

SIM = SRC / "sim"
HELPERS = ("migration", "deflection", "handoffs")
EDGES = graph()


def sim_imports(name: str) -> set[str]:
    """The baton.sim modules a sim module imports (short names)."""
    mod = "baton.sim" if name == "__init__" else f"baton.sim.{name}"
    return {n.removeprefix("baton.sim.") for n in EDGES[mod] if n.startswith("baton.sim.")}


def test_only_the_entry_points_import_the_simulator():
    importers = sorted(p.stem for p in SIM.glob("*.py") if "simulator" in sim_imports(p.stem))
    assert importers == ["__init__", "runner"]


def test_helpers_reach_the_simulator_only_through_the_port():
    for name in HELPERS:
        assert sim_imports(name) <= {"port", "network"}, name


def test_the_recorder_and_the_lower_modules_never_import_upwards():
    assert not sim_imports("recorder")
    assert not sim_imports("port")
    for name in ("clock", "network"):
        assert not sim_imports(name), name


def test_the_engine_model_is_below_the_simulator_and_the_emulator():
    """One engine model under two clocks: it imports neither runtime (both import it)."""
    model = {m: e for m, e in EDGES.items() if m.startswith("baton.engine_model")}
    assert {"baton.engine_model.engine", "baton.engine_model.kv", "baton.engine_model.work"} <= set(model)
    for mod, edges in model.items():
        assert not {n for n in edges if n.startswith(("baton.sim", "baton.emulator"))}, mod
    for runtime in ("baton.sim.simulator", "baton.emulator.engine_loop"):
        assert "baton.engine_model.engine" in EDGES[runtime], runtime


def test_the_simulator_offers_every_member_of_the_port():
    sim, _ = run([req(0, 0.0, 100, 5)])
    members = {n for n in vars(SimPort) if not n.startswith("_")}
    assert members and not {n for n in members if not hasattr(sim, n)}


def test_no_simulator_or_engine_model_module_reaches_400_lines():
    files = [*SIM.glob("*.py"), *(SRC / "engine_model").glob("*.py")]
    sizes = {f"{p.parent.name}/{p.name}": len(p.read_text().splitlines()) for p in files}
    assert all(n < 400 for n in sizes.values()), sizes


def test_instances_carry_the_simulated_clusters_link_for_policies():
    from baton.sim import ClusterSpec, EngineConfig
    sim, _ = run([req(0, 0.0, 100, 5)], cluster=ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16),
                                                              nic_gbps=25))
    assert {inst.link_bytes_per_s for inst in sim.instances.values()} == {25e9 / 8}
    assert sim.view.link_bytes_per_s() == 25e9 / 8
