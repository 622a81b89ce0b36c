"""The import rules of ARCHITECTURE: pure layers import no runtime, the simulator imports
nothing from the layers above it, only the gateway's run module imports its server, and
no import cycle anywhere (imports under ``if TYPE_CHECKING:`` and inside functions count)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "baton"
FORBIDDEN = ("baton.sim", "baton.emulator", "baton.gateway", "baton.cli", "asyncio", "aiohttp", "http", "httpx",
             "requests", "urllib", "socket", "starlette", "uvicorn", "fastapi")
ABOVE_SIM = ("baton.profiling", "baton.experiments", "baton.gateway", "baton.cli", "baton.report")


def module_name(path: Path) -> str:
    """``baton.x.y`` of a file under a ``baton`` package folder."""
    parts = list(path.with_suffix("").parts)
    parts = parts[len(parts) - 1 - parts[::-1].index("baton"):]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_statements(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) of every import anywhere in a file (under
    ``if TYPE_CHECKING:`` and inside functions too), relative imports resolved."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module_name(path).split(".")
                pkg = pkg[: len(pkg) - node.level + (path.name == "__init__.py")]
                base = ".".join(pkg + ([base] if base else []))
            out.append((base, [a.name for a in node.names]))
    return out


def imports_of(path: Path) -> list[str]:
    """Every module a file imports, and ``package.name`` for each name imported from a
    package (it may be a module)."""
    return [n for base, names in import_statements(path) for n in [base, *(f"{base}.{a}" for a in names)]]


def graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from package import module``: both)."""
    mods = {module_name(p): p for p in root.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for m, p in mods.items():
        found = set()
        for base, names in import_statements(p):
            # ``from package import module`` runs the package's __init__ first: both count
            found.update([base, *(f"{base}.{a}" for a in names if f"{base}.{a}" in mods)])
        edges[m] = {n for n in found if n in mods and n != m}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


@pytest.mark.parametrize("layer", ["core", "policies", "perf", "predict", "protocol", "engine_model"])
def test_pure_layers_do_not_import_runtimes(layer):
    offenders = []
    for path in (SRC / layer).rglob("*.py"):
        for name in imports_of(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                offenders.append(f"{path.relative_to(SRC)} imports {name}")
    assert not offenders, offenders


def test_simulator_imports_nothing_above_it():
    offenders = [f"{p.relative_to(SRC)} imports {n}" for p in (SRC / "sim").rglob("*.py")
                 for n in imports_of(p) if n.startswith(ABOVE_SIM)]
    assert not offenders, offenders


def test_only_the_run_modules_import_the_gateway_server():
    runs = {SRC / "gateway" / "server.py", SRC / "gateway" / "run.py", SRC / "gateway" / "epp_run.py",
            SRC / "gateway" / "workers.py"}
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if "baton.gateway.server" in imports_of(p) and p not in runs]
    assert not offenders, offenders


def test_gateway_control_speaks_no_http():
    for part in ("control.py", "engine_health.py"):  # Control and the part split off from it
        names = imports_of(SRC / "gateway" / part)
        assert not [n for n in names if n.startswith(("aiohttp", "baton.gateway.flow", "baton.gateway.server"))], part


def test_no_import_cycle():
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()) or [])


def test_checker_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "baton" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from baton.pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    edges = graph(tmp_path / "baton")
    assert edges["baton.pkg.a"] == {"baton.pkg.b"} and "baton.pkg.a" in edges["baton.pkg.b"]
    assert find_cycle(edges) in (["baton.pkg.a", "baton.pkg.b", "baton.pkg.a"],
                                 ["baton.pkg.b", "baton.pkg.a", "baton.pkg.b"])
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\nfrom baton.engine_model.engine import Engine\n")
    assert imports_of(bad)[:2] == ["asyncio", "baton.engine_model.engine"]
