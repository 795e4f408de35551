"""The import graph of ``src/openrft``, read from the source (every import, the ones inside functions too):
no module imports itself through others, and the packages' arrows go one way (docs/design.md, "Packages")."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in (SOURCE / "openrft").rglob("*.py"):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the openrft modules it imports (``from a.b import c`` counts as ``a.b.c`` when c is a module)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names if a.name.startswith("openrft")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("openrft"):
                targets |= {known(f"{node.module}.{a.name}") for a in node.names}
        graph[module] = {t for t in targets if t and t != module}
    return graph


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same arrows between the top-level parts (``openrft.rewards``, ``openrft.calls.outbound``...). The root
    package is left out: every module is inside it, and its one import is the lazy ``openrft.Client``."""

    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module != "openrft":
            packages.setdefault(part(module), set()).update(part(t) for t in targets if t != "openrft")
    return {name: {t for t in targets if t != name} for name, targets in packages.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_the_packages_arrows_go_one_way():
    assert cycles(package_graph(import_graph())) == []


def test_rewards_and_tools_share_only_the_calls_layer():
    """Rewards and tools both call the outside through ``openrft.calls``; neither imports the other, and
    tools (run inside rollouts) do not reach up into the engine."""
    packages = package_graph(import_graph())
    assert "openrft.tools" not in packages["openrft.rewards"]
    assert not {"openrft.rewards", "openrft.engine"} & packages["openrft.tools"]
    assert packages["openrft.calls"] <= {"openrft.errors", "openrft.spec"}
