"""The import layers (docs/architecture.md, 'Stages'), checked statically with ``ast``.

``stages/`` builds on the library in ``spade_cli/``, never the reverse: only a command's thin
wrapper (``spade_cli/commands/<stage>.py``) calls into its own stage. And no two modules import
each other, not even through an import inside a function: shared types live in leaf modules.
Imports under ``if TYPE_CHECKING:`` are annotations only and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# A cycle still broken by an import inside a function, to be removed when its modules are reworked.
KNOWN_CYCLES = [{"stages.update", "stages.update_samples"}, {"stages.update", "stages.update_train"}]


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ("spade_cli", "stages"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(module: str) -> set[str]:
    """The spade modules ``module`` imports at run time, wherever the import statement sits."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        found |= {n for n in names if n in MODULES}
    return found - {module}


GRAPH = {m: imports(m) for m in MODULES}


def test_the_library_never_imports_a_stage() -> None:
    bad = {m: sorted(i for i in deps if i.split(".")[0] == "stages")
           for m, deps in GRAPH.items() if m.startswith("spade_cli") and not m.startswith("spade_cli.commands.")}
    assert not {m: d for m, d in bad.items() if d}, "spade_cli must not import stages/ (move the shared part down)"


def test_a_command_calls_only_its_own_stage() -> None:
    for m, deps in GRAPH.items():
        if m.startswith("spade_cli.commands."):
            stages = {i for i in deps if i.split(".")[0] == "stages"}
            assert stages <= {"stages", f"stages.{m.rpartition('.')[2]}"}, (m, stages)


def _cycles() -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    known = set().union(*KNOWN_CYCLES)
    cycles = [c for c in _cycles() if not c <= known]
    assert not cycles, f"import cycles (move the shared names into a leaf module): {cycles}"


def test_the_checker_sees_imports_inside_functions() -> None:
    assert "spade_cli.layout" in GRAPH["spade_cli.commands.paths"]  # imported inside `paths()`
    assert "spade_cli.sandbox.config" in GRAPH["spade_cli.sandbox.probe"]
