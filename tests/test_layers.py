"""The import layers (docs/architecture.md, 'Layout'), checked statically with ``ast``.

``stages/`` builds on the library in ``spade_cli/``, never the reverse: only a command's thin
wrapper (``spade_cli/commands/<stage>.py``) calls into its own stage, and a stage calls no other
stage (what two stages share lives in the library). And no two modules import each other, not even
through an import inside a function: shared types live in leaf modules. Every stage builds its
``Stage`` through ``Stage.begin``.
Imports under ``if TYPE_CHECKING:`` are annotations only and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# The library's folders, bottom layer first: a folder imports only from folders before it (and
# from itself). The command line (spade_cli's own top-level modules and commands/) sits above all.
FOLDERS = ["core", "sandbox", "backends", "models", "training", "designer", "rollout", "checks", "envs",
           "evaluation", "reporting"]
# spade_cli's own top-level modules: the command line, shared by every command
TOP_LEVEL = {"spade_cli", "spade_cli.__main__", "spade_cli.app", "spade_cli.cli", "spade_cli.summary"}


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


def _stage_of(module: str) -> str:
    """The stage a module of ``stages/`` belongs to: ``stages.serve_server`` is part of ``serve``."""
    return module.split(".")[1].split("_")[0]


def test_a_stage_calls_no_other_stage() -> None:
    calls = {m: sorted(d for d in deps if d.startswith("stages.") and _stage_of(d) != _stage_of(m))
             for m, deps in GRAPH.items() if m.startswith("stages.")}
    assert not {m: d for m, d in calls.items() if d}, "a stage calls another stage (move the shared part down)"


def test_every_stage_begins_through_stage_begin() -> None:
    """``Stage.begin`` checks the outputs and fingerprints the inputs; a hand-built ``Stage`` skips that."""
    built = []
    for m, path in MODULES.items():
        if m.startswith("stages."):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "Stage":
                    built.append(f"{path.name}:{node.lineno}")
    assert not built, f"build the Stage with Stage.begin: {built}"


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
    cycles = _cycles()
    assert not cycles, f"import cycles (move the shared names into a leaf module): {cycles}"


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "spade_cli" and len(parts) > 1 and (ROOT / "spade_cli" / parts[1]).is_dir() else None


def test_the_library_is_grouped_in_folders() -> None:
    """A new module goes into the folder of what it serves, not beside the command line."""
    loose = {m for m in MODULES if m.startswith("spade_cli") and _folder(m) is None} - TOP_LEVEL
    assert not loose, f"modules outside spade_cli's folders: {sorted(loose)}"
    folders = {p.name for p in (ROOT / "spade_cli").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(FOLDERS) | {"commands"}, "a new folder goes into FOLDERS and docs/architecture.md"


def test_the_folders_are_layered() -> None:
    rank = {f: i for i, f in enumerate(FOLDERS)}
    wrong = {}
    for m, deps in GRAPH.items():
        here = _folder(m)
        if here not in rank:
            continue
        # spade_cli itself is a leaf (the version); anything else outside a lower folder is above
        above = {d for d in deps if d.startswith("spade_cli.") and (_folder(d) not in rank or rank[_folder(d)] > rank[here])}
        if above:
            wrong[m] = sorted(above)
    assert not wrong, f"a folder imports from a layer above it: {wrong}"


def test_the_checker_sees_imports_inside_functions() -> None:
    assert "spade_cli.core.layout" in GRAPH["spade_cli.commands.paths"]  # imported inside `paths()`
    assert "spade_cli.sandbox.config" in GRAPH["spade_cli.sandbox.probe"]
