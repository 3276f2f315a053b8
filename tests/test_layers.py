"""The package's floors, read from its source with ``ast`` (every ``import`` that runs, at module level
or inside a function): imports run one way, down ``cli`` → ``service`` → ``api`` → ``platform`` →
``algorithms`` → ``simulators`` → ``workloads``, ``hardware``; no module imports itself back through
others; the core never imports Ray; ``client.py`` imports nothing of the package; no module is over 700
lines."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "archplace"
# floor of each top-level subpackage; equal floors may import each other (no circles, checked apart)
FLOOR = {"hardware": 0, "workloads": 0, "tune_configs": 0, "simulators": 1, "algorithms": 2, "platform": 3,
         "api": 4, "service": 5, "cli": 6}
CORE = ("archplace.workloads", "archplace.hardware", "archplace.simulators", "archplace.algorithms.solvers")
MAX_LINES = 700


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The longest module of the package that ``name`` names (``a.b.func`` -> ``a.b``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> tuple[set[str], set[str]]:
    """(modules of the package that ``module`` imports, top-level names of other packages it imports).
    ``from pkg import sub`` counts as importing ``pkg.sub`` when ``sub`` is a module, else ``pkg``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    inner, outer = set(), set()
    tree = ast.parse(path.read_text())
    # ``if TYPE_CHECKING:`` imports never run: type annotations may name a class one floor up
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source
                       for a in node.names]
        else:
            continue
        for t in targets:
            if t == "archplace" or t.startswith("archplace."):
                r = _resolve(t)
                if r and r != module and r != "archplace":
                    inner.add(r)
            else:
                outer.add(t.split(".")[0])
    return inner, outer


GRAPH = {m: imports(m) for m in MODULES}


def floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOOR.get(parts[1]) if len(parts) > 1 else None


def test_every_subpackage_has_a_floor():
    tops = {m.split(".")[1] for m in MODULES if m.count(".") >= 1 and (PKG / m.split(".")[1]).is_dir()}
    assert tops <= set(FLOOR), tops - set(FLOOR)


def test_imports_run_down_the_floors():
    up = [(m, t) for m, (inner, _) in GRAPH.items() for t in inner
          if floor(m) is not None and floor(t) is not None and floor(t) > floor(m)]
    assert not up, "imports from a lower floor to a higher one:\n" + "\n".join(f"{a} -> {b}" for a, b in up)


def test_no_import_circles():
    """Tarjan's strongly connected components of the module graph: every one is a single module."""
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v][0]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_core_never_imports_ray():
    """Neither directly nor through a module of the package it imports."""
    core = [m for m in MODULES if m.startswith(CORE)]
    for m in core:
        seen, todo = {m}, [m]
        while todo:
            v = todo.pop()
            assert "ray" not in GRAPH[v][1], f"{m} imports ray" + (f" through {v}" if v != m else "")
            for w in GRAPH[v][0] - seen:
                seen.add(w)
                todo.append(w)


def test_client_imports_nothing_of_the_package():
    assert GRAPH["archplace.client"][0] == set()


def test_no_module_is_over_700_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_checker_sees_what_it_should():
    """The import reader itself: relative and absolute, module-level and in functions, a submodule
    imported through its package."""
    inner, outer = GRAPH["archplace.cli.commands"]
    assert {"archplace.api", "archplace.cli.graphs", "archplace.cli.serve"} <= inner
    assert "archplace.cli" not in inner and "json" in outer
    assert "archplace.workloads.hf_config" in GRAPH["archplace.workloads.models"][0]
    assert "ray" in GRAPH["archplace.platform.tasks"][1]
    assert floor("archplace.cli.serve") == 6 and floor("archplace.workloads.graph") == 0
