"""The packages' import graph (hdqt_cil and data_prep; every import statement, at module level or inside a
function): no cycle, and the layering of docs' house plan (kernels know nothing of quant; the numerics nothing of
continual learning)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "hdqt_cil", ROOT / "data_prep")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in package.rglob("*.py")}


def imported(name: str, path: Path) -> set[str]:
    """The package's modules that `name` imports: `import a.b`, `from a import b` (b a module or a name of a),
    relative forms resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


GRAPH = {name: imported(name, path) for name, path in MODULES.items()}


def test_the_graph_reads_the_packages():
    assert "hdqt_cil.quant.backend" in GRAPH and "hdqt_cil.kernels" in GRAPH["hdqt_cil.quant.backend"]
    assert "data_prep.sources" in GRAPH["data_prep.hapt"]
    assert "hdqt_cil.quant.quantizers" in GRAPH["hdqt_cil.quant.backend"]  # a relative import, resolved


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of `graph` closes (empty for an acyclic graph)."""
    state, found = {}, []

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle():
    found = cycles(GRAPH)
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def reachable(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for nxt in GRAPH[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


@pytest.mark.parametrize("layer, forbidden", [
    ("hdqt_cil.kernels", ("hdqt_cil.quant",)),
    ("hdqt_cil.quant", ("hdqt_cil.strategies", "hdqt_cil.trainer", "hdqt_cil.benchmarks", "hdqt_cil.experiment")),
])
def test_layers_import_nothing_above_them(layer, forbidden):
    for name in (n for n in GRAPH if n == layer or n.startswith(layer + ".")):
        bad = {m for m in reachable(name) if m.startswith(forbidden)}
        assert not bad, f"{name} reaches {sorted(bad)}"
