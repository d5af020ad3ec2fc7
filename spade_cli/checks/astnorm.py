"""A rename-invariant fingerprint of an environment's code: the key of validate's ``duplicate`` check.

``env_id`` hashes the code and hint almost verbatim, so a re-indented copy, a copy with its
variables renamed, or an old environment with a reworded hint gets a new id. ``ast_hash`` hashes
what the program does instead: the source is parsed with ``ast``, pruned, reordered and normalised
before ``ast.dump`` (no positions) and sha256:

- pruned (``prune``), until nothing more goes: dead statements (``pass``, expression statements
  without a call, code after ``return``/``raise``/``break``/``continue``, the dead branch of an
  ``if`` or ``while`` on a constant) and names nothing reads (pure assignments such as
  ``_UNUSED = 0`` or ``self._junk = []``, unused imports, functions and methods nothing calls or
  names, helper classes with no base and no Env API method). A name counts as read when it is
  loaded as a variable or attribute, named in ``global``, or spelled in a string (``getattr``);
- reordered (``reorder``): in the module and in every class, imports first and definitions last,
  each group sorted by its shape (the dump with bound names as ``_`` and constants as types); the
  other statements keep their order;
- formatting and comments vanish with the parse; docstrings go with the dead statements;
  argument and return annotations are dropped;
- every name the module itself binds (assigned or deleted variables, arguments, functions, classes,
  import aliases, ``except ... as``, attributes it assigns such as ``self.board``, methods it
  defines) becomes ``_N``, numbered in first-seen order, wherever it is used;
- string, bytes and number constants become their type (``<str>``, ``<int>``...): the same program
  with other numbers, word lists or messages is the same environment; an f-string keeps only its
  ``{values}``. ``True``, ``False``, ``None`` and ``...`` are kept, since they decide control flow.

Names the module does not bind keep their spelling: builtins (``len``, ``range``), imported modules
and what they export (``gymnasium``, ``spaces.Text``, ``self.np_random.integers``), methods of
library objects (``str.split``). So do names that carry the env contract even though the module
binds them: the gymnasium ``Env`` API (``reset``, ``step``, ``np_random``, the spaces, ``metadata``,
reset's ``seed`` and ``options``...) and every dunder (``__init__``). ``import numpy as np`` and
``import numpy as xp`` agree (the alias is renamed, the module name is not); ``import numpy`` and
``import random`` do not.

What it still does not catch (docs/design.md): a rewrite of the same behaviour in another
structure (a ``for`` turned into a ``while``, a helper inlined, ``x + 1`` written ``1 + x``, a
message built with ``+`` instead of an f-string), dead code that calls something (``print()``, an
unused ``self.np_random.random()``: a call may change state, so it is kept), a condition that is
always false but not a constant (``if len(x) < 0:``), and a different word list or answer table,
which is the same hash by design. It stops cheap edits, not a determined optimiser; a semantic
check would need to run the code.

    ast_hash("class E(gym.Env): ...")  # -> "ast2:3f0c...", or None when the code does not parse
"""

from __future__ import annotations

import ast
import builtins
import copy
import hashlib
import sys

# Bump when the normalisation changes: hashes stored by an older version are then recomputed.
VERSION = "ast2"

# The parser refuses nesting deeper than a few thousand levels; the walk and ast.dump below recurse
# in Python (3-4 frames a level, no C stack on 3.11+), so they get room for whatever parsed: a
# deeply nested copy must not escape the check by making the hash fail.
RECURSION_LIMIT = 100_000

# Names bound by an env that the harness, gymnasium or the contract give a meaning.
KEPT = frozenset({
    "reset", "step", "render", "close", "np_random", "np_random_seed", "observation_space",
    "action_space", "metadata", "render_mode", "reward_range", "spec", "unwrapped", "seed",
    "options", "self", "cls", "super",
}) | frozenset(dir(builtins))


def _literal(value: object) -> bool:
    """A string, bytes or number constant (``True``, ``False``, ``None`` and ``...`` decide control flow)."""
    return not (value is None or isinstance(value, bool) or value is Ellipsis)


def _bound(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(variable names, attribute names) that the module binds itself."""
    names: set[str] = set()
    attrs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            attrs.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            attrs.add(node.name)  # a method is used as self.name
        elif isinstance(node, ast.alias) and node.asname:
            names.add(node.asname)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
    keep = {n for n in names | attrs if n in KEPT or (n.startswith("__") and n.endswith("__"))}
    return names - keep, attrs - keep


class _Normaliser(ast.NodeTransformer):
    def __init__(self, names: set[str], attrs: set[str]) -> None:
        self.names, self.attrs = names, attrs
        self.index: dict[str, str] = {}  # one numbering for both kinds: `def move` is `self.move`

    def canon(self, name: str) -> str:
        return self.index.setdefault(name, f"_{len(self.index)}")

    def _name(self, name: str | None, kind: set[str]) -> str | None:
        return self.canon(name) if name in kind else name

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        return [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(node, field, None), list):
                setattr(node, field, self._body(getattr(node, field)))
        return super().generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._name(node.id, self.names)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        node.attr = self._name(node.attr, self.attrs)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg, node.annotation = self._name(node.arg, self.names), None
        return node

    def visit_keyword(self, node: ast.keyword) -> ast.AST:
        self.generic_visit(node)
        node.arg = self._name(node.arg, self.names)
        return node

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        node.name = self._name(node.name, self.names)
        if not isinstance(node, ast.ClassDef):
            node.returns = None
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def visit_alias(self, node: ast.alias) -> ast.AST:
        node.asname = self._name(node.asname, self.names)
        return node

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> ast.AST:
        node.names = [self._name(n, self.names) for n in node.names]
        return node

    visit_Nonlocal = visit_Global

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.AST:
        node.name = self._name(node.name, self.names)
        return self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs | ast.MatchStar) -> ast.AST:
        node.name = self._name(node.name, self.names)
        return self.generic_visit(node)

    visit_MatchStar = visit_MatchAs

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if _literal(node.value):
            node.value = f"<{type(node.value).__name__}>"
        node.kind = None
        return node

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        # an f-string is its values: the words around them are a message, whatever they say
        node.values = [v for v in node.values if not isinstance(v, ast.Constant)]
        return self.generic_visit(node)


_IMPURE = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)
_ENDS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _pure(node: ast.AST | None) -> bool:
    return node is None or not any(isinstance(n, _IMPURE) for n in ast.walk(node))


def _used(tree: ast.AST) -> set[str]:
    """Every name the program reads: variables, attributes, and identifier-like strings (getattr)."""
    used: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            used.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            used.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            used.add(n.value)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            used.update(n.names)
    return used


class _Pruner:
    """Drops what cannot change what the env does: dead statements (``pass``, pure expression
    statements, code after ``return``/``raise``, ``if False:`` branches), and names nothing reads
    (pure assignments, imports, functions and methods, helper classes that are no env)."""

    def __init__(self, used: set[str]) -> None:
        self.used = used
        self.changed = False

    def unused(self, name: str) -> bool:
        return name not in self.used and name not in KEPT and not (name.startswith("__") and name.endswith("__"))

    def _target_unused(self, t: ast.expr) -> bool:
        if isinstance(t, ast.Name):
            return self.unused(t.id)
        if isinstance(t, ast.Attribute):
            return self.unused(t.attr) and _pure(t.value)
        if isinstance(t, (ast.Tuple, ast.List)):
            return all(self._target_unused(e) for e in t.elts)
        return False

    def _stmt(self, s: ast.stmt) -> list[ast.stmt]:
        """The statements ``s`` stands for: [] when dead, its branch for a constant ``if``."""
        if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and _pure(s.value)):
            return []
        if isinstance(s, (ast.If, ast.While)) and isinstance(s.test, ast.Constant):
            if isinstance(s, ast.If):
                return self.body(s.body if s.test.value else s.orelse)
            if not s.test.value:
                return self.body(s.orelse)
        if isinstance(s, ast.Assign) and _pure(s.value) and all(self._target_unused(t) for t in s.targets):
            return []
        if isinstance(s, (ast.AugAssign, ast.AnnAssign)) and _pure(s.value) and self._target_unused(s.target):
            return []
        if isinstance(s, (ast.Import, ast.ImportFrom)) and getattr(s, "module", None) != "__future__":
            s.names = [a for a in s.names if not self.unused(a.asname or a.name.split(".")[0])]
            return [s] if s.names else []
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.unused(s.name):
            return []
        if isinstance(s, ast.ClassDef) and self.unused(s.name) and not s.bases and not s.decorator_list \
                and not any(isinstance(b, _DEFS) and (b.name in KEPT or b.name.startswith("__")) for b in s.body):
            return []  # a helper class: no base, no Env API method, never used
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(s, field, None), list) and getattr(s, field):
                setattr(s, field, self.body(getattr(s, field)) or [ast.Pass()])
        for h in getattr(s, "handlers", []):
            h.body = self.body(h.body) or [ast.Pass()]
        for case in getattr(s, "cases", []):
            case.body = self.body(case.body) or [ast.Pass()]
        return [s]

    def body(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            kept = self._stmt(s)
            if kept != [s]:
                self.changed = True
            out += kept
            if out and isinstance(out[-1], _ENDS):
                self.changed |= s is not stmts[-1]
                break  # what follows is never reached
        return out


def prune(tree: ast.Module) -> ast.Module:
    """Dead code and unread names removed, until nothing more goes (a helper used only by a dead
    function is dead once that function is gone)."""
    for _ in range(32):
        p = _Pruner(_used(tree))
        tree.body = p.body(tree.body)
        if not p.changed:
            break
    return tree


class _Shape(ast.NodeTransformer):
    """Every name the module binds as ``_``, constants as their type: a definition's shape."""

    def __init__(self, names: set[str], attrs: set[str]) -> None:
        self.bound = names | attrs

    def visit(self, node: ast.AST) -> ast.AST:
        for field in ("id", "attr", "arg", "name", "asname"):
            if getattr(node, field, None) in self.bound:
                setattr(node, field, "_")
        if isinstance(node, ast.Constant) and _literal(node.value):
            node.value = type(node.value).__name__
        return self.generic_visit(node)


def _shape(node: ast.AST, bound: tuple[set[str], set[str]]) -> str:
    return ast.dump(_Shape(*bound).visit(copy.deepcopy(node)), include_attributes=False)


def reorder(tree: ast.Module) -> ast.Module:
    """Imports first and definitions last, each sorted by shape; the other statements keep their
    order. Functions, methods and imports may come in any order without changing the program."""
    bound = _bound(tree)

    def arrange(body: list[ast.stmt]) -> list[ast.stmt]:
        imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))]
        defs = [s for s in body if isinstance(s, _DEFS)]
        rest = [s for s in body if s not in imports and s not in defs]
        for d in defs:
            d.body = arrange(d.body)
        return (sorted(imports, key=lambda s: _shape(s, bound)) + rest
                + sorted(defs, key=lambda s: _shape(s, bound)))

    tree.body = arrange(tree.body)
    return tree


def normalised_dump(code: str) -> str:
    """The normalised ``ast.dump`` of ``code``; raises SyntaxError/ValueError when it does not parse."""
    tree = reorder(prune(ast.parse(code)))
    tree = _Normaliser(*_bound(tree)).visit(tree)
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def ast_hash(code: str | None) -> str | None:
    """``ast2:`` + 16 hex digits of sha256 of the normalised AST, or None when ``code`` is empty or
    does not parse (the syntax check reports that)."""
    if not isinstance(code, str) or not code.strip():
        return None
    old = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(old, RECURSION_LIMIT))
        dump = normalised_dump(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    finally:
        sys.setrecursionlimit(old)
    return f"{VERSION}:{hashlib.sha256(dump.encode()).hexdigest()[:16]}"


def current(value: object) -> bool:
    """Whether a stored hash was made by this version of the normalisation."""
    return isinstance(value, str) and value.startswith(VERSION + ":")
