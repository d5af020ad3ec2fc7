"""A rename-invariant fingerprint of an environment's code: the key of validate's ``duplicate`` check.

``env_id`` hashes the code and hint almost verbatim, so a re-indented copy, a copy with its
variables renamed, or an old environment with a reworded hint gets a new id. ``ast_hash`` hashes
what the program does instead: the source is parsed with ``ast`` and normalised before
``ast.dump`` (no positions) and sha256:

- formatting and comments vanish with the parse; docstrings and every other bare constant
  statement are dropped; argument and return annotations are dropped;
- every name the module itself binds (assigned or deleted variables, arguments, functions, classes,
  import aliases, ``except ... as``, attributes it assigns such as ``self.board``, methods it
  defines) becomes ``_N``, numbered in first-seen order, wherever it is used;
- string, bytes and number constants become their type (``<str>``, ``<int>``...): the same program
  with other numbers or word lists is the same environment. ``True``, ``False``, ``None`` and
  ``...`` are kept, since they decide control flow.

Names the module does not bind keep their spelling: builtins (``len``, ``range``), imported modules
and what they export (``gymnasium``, ``spaces.Text``, ``self.np_random.integers``), methods of
library objects (``str.split``). So do names that carry the env contract even though the module
binds them: the gymnasium ``Env`` API (``reset``, ``step``, ``np_random``, the spaces, ``metadata``,
reset's ``seed`` and ``options``...) and every dunder (``__init__``). ``import numpy as np`` and
``import numpy as xp`` agree (the alias is renamed, the module name is not); ``import numpy`` and
``import random`` do not.

What it does not catch, by design: a structural change (reordered methods, an extra statement, a
``for`` turned into a ``while``) makes another hash. It stops cosmetic copies, not a determined
optimiser; a semantic check would need to run the code.

    ast_hash("class E(gym.Env): ...")  # -> "ast1:3f0c...", or None when the code does not parse
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import sys

# Bump when the normalisation changes: hashes stored by an older version are then recomputed.
VERSION = "ast1"

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
        if node.value is not None and not isinstance(node.value, bool) and node.value is not Ellipsis:
            node.value = f"<{type(node.value).__name__}>"
        node.kind = None
        return node


def normalised_dump(code: str) -> str:
    """The normalised ``ast.dump`` of ``code``; raises SyntaxError/ValueError when it does not parse."""
    tree = ast.parse(code)
    tree = _Normaliser(*_bound(tree)).visit(tree)
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def ast_hash(code: str | None) -> str | None:
    """``ast1:`` + 16 hex digits of sha256 of the normalised AST, or None when ``code`` is empty or
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
