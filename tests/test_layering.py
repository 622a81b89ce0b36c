"""core and policies must stay pure: no runtime, asyncio or HTTP imports."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "baton"
FORBIDDEN = ("baton.sim", "baton.gateway", "baton.cli", "asyncio", "aiohttp", "http", "httpx",
             "requests", "urllib", "socket", "starlette", "uvicorn", "fastapi")


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("layer", ["core", "policies", "perf", "predict", "protocol"])
def test_pure_layers_do_not_import_runtimes(layer):
    offenders = []
    for path in (SRC / layer).rglob("*.py"):
        for name in imports_of(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                offenders.append(f"{path.relative_to(SRC)} imports {name}")
    assert not offenders, offenders


def test_checker_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\nfrom baton.sim.engine import Engine\n")
    assert imports_of(bad) == ["asyncio", "baton.sim.engine"]
