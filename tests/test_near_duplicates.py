"""Near-duplicate environments: the rename-invariant AST hash and validate's `duplicate` verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.checks.astnorm import ast_hash, normalised_dump
from spade_cli.core.records import env_id_for
from tests.conftest import run_spade

BENIGN_DIR = Path(__file__).parent / "envs_benign"
ORIGINAL = (BENIGN_DIR / "guess_number.py").read_text()

# guess_number.py with every name the module binds renamed, re-indented (2 spaces), other quotes,
# other numbers and texts, comments added, the docstring reworded, annotations added, and the
# gymnasium alias changed.
DISGUISED = '''"""A totally new environment about finding a secret value."""
import gymnasium as gymn   # the env library


class SecretValueGame(gymn.Env):
  """Find the value."""
  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)   # seeds np_random
    self.secret = int(self.np_random.integers(5, 501))
    self.count = 0
    return 'Pick a value between 5 and 500.', {}

  def step(self, action: str) -> tuple:
    # one more turn
    self.count += 1
    try:
      value = int(action.strip().split()[-1])
    except (ValueError, IndexError):
      return 'A value please.', 0.0, False, self.count >= 20, {'n': self.count}
    if value == self.secret:
      return 'Yes!', 1.0, True, False, {'n': self.count}
    way = 'up' if value < self.secret else 'down'
    return f'{value}: no, go {way}.', 0.0, False, self.count >= 20, {'n': self.count}
'''


@pytest.mark.unit
def test_a_renamed_reindented_recommented_copy_has_the_same_hash() -> None:
    assert env_id_for(DISGUISED, "h") != env_id_for(ORIGINAL, "h")
    assert ast_hash(DISGUISED) == ast_hash(ORIGINAL) is not None
    assert ast_hash(ORIGINAL).startswith("ast2:") and len(ast_hash(ORIGINAL)) == 5 + 16


@pytest.mark.unit
@pytest.mark.parametrize("name", ["arithmetic_chain.py", "json_tools.py", "text_adventure.py"])
def test_genuinely_different_envs_differ(name: str) -> None:
    assert ast_hash((BENIGN_DIR / name).read_text()) != ast_hash(ORIGINAL)


@pytest.mark.unit
def test_structure_and_meaningful_names_count() -> None:
    def used(code: str, *names: str) -> str:  # a name nothing reads is dropped before hashing
        return code + "".join(f"print({n})\n" for n in names)

    base = used("def f(x):\n    return len(x)\n", "f")
    assert ast_hash(base) == ast_hash(used("def g(y):\n    return len(y)\n", "g"))  # renamed
    assert ast_hash(base) != ast_hash(used("def f(x):\n    return sum(x)\n", "f"))  # another builtin
    assert ast_hash(base) != ast_hash(used("def f(x):\n    return len(x) + 1\n", "f"))  # another expression
    assert ast_hash(used("import numpy as np\n", "np")) == ast_hash(used("import numpy as xp\n", "xp"))
    assert ast_hash(used("import numpy\n", "numpy")) != ast_hash(used("import random\n", "random"))  # module names are kept
    # a library attribute keeps its name, an attribute the module assigns does not
    lib = used("def f(s):\n    return s.np_random.integers(3)\n", "f")
    assert ast_hash(lib) != ast_hash(lib.replace("integers", "random"))
    own = "class A(Env):\n    def m(self):\n        self.board = 1\n        return self.board\n    def step(self, a):\n        return self.m()\n"
    assert ast_hash(own) == ast_hash(own.replace("board", "grid"))
    # the Env API is kept even though the module defines it: `step` is not any method
    env = "class E:\n    def step(self, a):\n        return a\n"
    assert ast_hash(env) != ast_hash(used(env.replace("step", "walk"), "E().walk"))
    assert ast_hash(used("x = True\n", "x")) != ast_hash(used("x = False\n", "x")) != ast_hash(used("x = None\n", "x"))
    assert "<str>" in normalised_dump(used("x = 'abc'\n", "x")) and "abc" not in normalised_dump(used("x = 'abc'\n", "x"))


# Trivial edits of guess_number.py that leave what it does unchanged: each must keep the hash.
EDITS = {
    "dead module statement": lambda c: c + "\n_UNUSED = 0\n",
    "dead statements in a method": lambda c: c.replace(
        "        self.turns += 1\n", "        pass\n        self.turns += 1\n        if False:\n            self.turns = -1\n"),
    "code after a return": lambda c: c.replace(
        "            return \"Correct!\", 1.0, True, False, {\"turn\": self.turns}\n",
        "            return \"Correct!\", 1.0, True, False, {\"turn\": self.turns}\n            self.turns = 0\n"),
    "unused import": lambda c: "import os\nimport json as _j\n" + c,
    "unused helper function": lambda c: c + "\n\ndef _helper(x):\n    return x * 2\n\n\ndef _caller():\n    return _helper(3)\n",
    "unused method and attribute": lambda c: c.replace(
        "    def step(self, action):\n", "    def _spare(self):\n        return self.turns\n\n    def step(self, action):\n"
    ).replace("        self.turns = 0\n", "        self.turns = 0\n        self._junk = [1, 2, 3]\n"),
    "unused helper class": lambda c: c + "\n\nclass _Notes:\n    size = 3\n",
    "reordered methods": lambda c: _swap_methods(c),
    "changed message words": lambda c: c.replace('"Correct!"', '"Well done, that is it!"').replace(
        '"{guess} is wrong; go {hint}."', '"You said {guess}; that is not it, try going {hint}!"'),
}


def _swap_methods(code: str) -> str:
    head, rest = code.split("    def reset(", 1)
    reset, step = rest.split("    def step(", 1)
    return head + "    def step(" + step.rstrip("\n") + "\n\n    def reset(" + reset.rstrip("\n") + "\n"


@pytest.mark.unit
@pytest.mark.parametrize("edit", list(EDITS))
def test_a_trivial_edit_keeps_the_hash(edit: str) -> None:
    edited = EDITS[edit](ORIGINAL)
    assert edited != ORIGINAL and compile(edited, "e", "exec")  # the edit applied and still parses
    assert ast_hash(edited) == ast_hash(ORIGINAL), edit


@pytest.mark.unit
def test_definitions_reordered_around_their_use_keep_the_hash() -> None:
    a = "def one():\n    return 1\n\n\ndef two():\n    return [2]\n\n\nprint(one(), two())\n"
    b = "def two():\n    return [2]\n\n\ndef one():\n    return 1\n\n\nprint(one(), two())\n"
    assert ast_hash(a) == ast_hash(b)
    assert ast_hash(a) != ast_hash(a.replace("[2]", "(2,)"))  # what a definition does still counts


@pytest.mark.unit
def test_edits_that_change_behaviour_change_the_hash() -> None:
    # a call is kept even when its result is unused: it may draw from the env's random state
    assert ast_hash(ORIGINAL.replace("        self.turns = 0\n", "        self.turns = 0\n        self.np_random.random()\n")) \
        != ast_hash(ORIGINAL)
    assert ast_hash(ORIGINAL.replace("guess < self.target", "guess > self.target")) != ast_hash(ORIGINAL)
    assert ast_hash(ORIGINAL.replace("if guess == self.target:", "if True:")) != ast_hash(ORIGINAL)


@pytest.mark.unit
def test_code_that_does_not_parse_has_no_hash() -> None:
    assert ast_hash("def broken(:\n") is None and ast_hash("x = '\\x00'") is not None
    assert ast_hash("") is None and ast_hash(None) is None and ast_hash("\0") is None
    assert ast_hash("x = " + "-" * 100000 + "1\n") is None  # nesting past the parser's limit
    # nesting the parser accepts is hashed, however deep the walk must go: no escape from the check
    deep = ORIGINAL + "\nX = " + "-" * 3000 + "1\nprint(X)\n"
    assert ast_hash(deep) is not None and ast_hash(deep) == ast_hash(deep.replace("X", "Y"))
    inside = ORIGINAL + "\n\ndef f():\n    return " + "-" * 3000 + "1\n\n\nprint(f())\n"
    assert ast_hash(inside) is not None and ast_hash(inside) != ast_hash(ORIGINAL)


@pytest.mark.unit
def test_the_bundled_pool_twice_hashes_to_its_distinct_envs() -> None:
    """24 designs of the bundled pool's size: every one hashes, the copies collide, nothing else."""
    from spade_cli.envs import pool

    codes = [e["code"] for e in pool.load_folder(pool.BUNDLED_POOL)] * 2
    hashes = [ast_hash(c) for c in codes]
    assert len(codes) == 24 and None not in hashes and len(set(hashes)) == 12


# -- validate --------------------------------------------------------------------------------------

def _design(code: str | None, hint: str = "Binary search: halve the range each turn.", **extra) -> dict:
    return {"schema": "spade.design/1", "code": code, "hint": hint, **extra}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check(row: dict) -> dict:
    return next(c for c in row["checks"] if c["name"] == "duplicate")


@pytest.mark.integration
def test_validate_flags_near_duplicates_within_the_iteration(tmp_path: Path) -> None:
    other = (BENIGN_DIR / "json_tools.py").read_text()
    rows = [_design(ORIGINAL), _design(DISGUISED), _design(ORIGINAL, "A different hint entirely."),
            _design(other), _design("def broken(:\n")]
    out = tmp_path / "v.jsonl"
    r = run_spade("validate", "--designs", _write(tmp_path / "d.jsonl", rows), "--out", out, "--workers", "2")
    assert r.returncode == 0, r.stderr
    got = _read(out)
    assert [g["reason"] for g in got] == [None, "duplicate", "duplicate", None, "syntax_error"]
    first = got[0]["env_id"]
    assert first in _check(got[1])["detail"] and first in _check(got[2])["detail"]
    assert got[1]["stats"]["duplicate_of"] == first and _check(got[0])["ok"]
    assert got[1]["stats"]["ast_hash"] == got[0]["stats"]["ast_hash"] == ast_hash(ORIGINAL)
    assert "ast_hash" not in got[4]["stats"]  # a design that does not parse is the syntax check's
    # the duplicate is judged before any process starts: no sandbox check on it
    assert [c["name"] for c in got[1]["checks"]] == ["code", "size", "syntax", "env_class", "duplicate"]


@pytest.mark.integration
def test_validate_flags_near_duplicates_of_the_memory(tmp_path: Path) -> None:
    old = (BENIGN_DIR / "arithmetic_chain.py").read_text()
    kept = (BENIGN_DIR / "text_adventure.py").read_text()
    memory = _write(tmp_path / "memory.jsonl", [
        # as regret writes it today: the code, no hash
        {"schema": "spade.memory/1", "env_id": "mem-code", "title": "t", "hint": "h", "history": [],
         "code": ORIGINAL},
        # with the hash regret can copy from the validation row (the code is not read then)
        {"schema": "spade.memory/1", "env_id": "mem-hash", "title": "t", "hint": "h", "history": [],
         "ast_hash": ast_hash(old), "code": "not even python ("},
        # a hash of another normalisation version is recomputed from the code
        {"schema": "spade.memory/1", "env_id": "mem-stale", "title": "t", "hint": "h", "history": [],
         "ast_hash": "ast0:0000", "code": kept + "\nprint(1)\n"},
    ])
    rows = [_design(DISGUISED, "A brand-new hint."), _design(old.replace("    ", "\t")), _design(kept)]
    out = tmp_path / "v.jsonl"
    r = run_spade("validate", "--designs", _write(tmp_path / "d.jsonl", rows), "--out", out,
                  "--memory", memory, "--workers", "2")
    assert r.returncode == 0, r.stderr
    got = _read(out)
    assert [g["reason"] for g in got] == ["duplicate", "duplicate", None]
    assert "mem-code" in _check(got[0])["detail"] and "memory" in _check(got[0])["detail"]
    assert got[1]["stats"]["duplicate_of"] == "mem-hash"


@pytest.mark.unit
def test_pool_copies_are_not_near_duplicates() -> None:
    """Pool rows are not Designer output: the pool deals copies and one-template reasoning-gym tasks
    on purpose, distinct by env_id; only an exact copy of the code is a duplicate among them."""
    from spade_cli.core.records import Design
    from stages.validate import duplicates

    gen = {"backend": "pool"}
    rows = [Design(code=ORIGINAL, hint="h", gen=gen), Design(code=ORIGINAL + "\nSPADE_POOL_COPY = 1\n", hint="h",
            gen=gen), Design(code=ORIGINAL + "\nSPADE_POOL_COPY = 2\n", hint="h", gen=gen),
            Design(code=ORIGINAL + "\n", hint="other", gen=gen),
            Design(code=ORIGINAL + "\nSPADE_POOL_COPY = 3\n", hint="h")]  # no pool row: near-duplicate
    dups = duplicates(rows, [])
    assert [detail is None for detail, _, _ in dups] == [True, True, True, False, False]
    # the copy marker is a dead statement: the designer's row is a near-duplicate of the first copy
    assert dups[3][1] == rows[0].env_id and dups[4][1] == rows[0].env_id
    assert dups[1][2] == dups[2][2] == dups[4][2] == ast_hash(ORIGINAL)


# guess_number.py rewritten in another structure, same messages: a new AST hash, the same game
RESTRUCTURED = ORIGINAL.replace("        self.turns += 1\n", "        self.turns = self.turns + 1\n").replace(
    '        hint = "higher" if guess < self.target else "lower"\n',
    '        if guess < self.target:\n            hint = "higher"\n        else:\n            hint = "lower"\n')


@pytest.mark.unit
def test_behaviour_marks_later_copies_and_spares_pool_rows() -> None:
    from spade_cli.checks import behaviour

    fp = behaviour.fingerprint(["Guess 1 to 100", "Too  HIGH"], 0.0, 2, False)
    assert fp == behaviour.fingerprint(["guess 7 to 250", "too high"], 0.0, 2, False)  # numbers, case, spaces
    assert fp != behaviour.fingerprint(["Guess 1 to 100", "too low"], 0.0, 2, False)
    assert fp != behaviour.fingerprint(["Guess 1 to 100", "Too  HIGH"], 1.0, 2, True)

    def row(env: str, valid: bool = True, pool: bool = False) -> dict:
        return {"env_id": env, "valid": valid, "reason": None if valid else "trivial", "checks": [],
                "stats": {"behaviour": fp}, "gen": {"backend": "pool"} if pool else {"backend": "hf"}}

    seen = behaviour.seen_in([row("a", valid=False)])  # an invalid row is no original
    assert seen == {}
    rows = [behaviour.mark_duplicate(r, i, seen) for i, r in
            enumerate([row("p1", pool=True), row("p2", pool=True), row("a"), row("b")])]
    assert [r["reason"] for r in rows] == [None, None, None, "duplicate"]
    assert rows[3]["stats"]["duplicate_of"] == "a" and "input row 3" in rows[3]["checks"][-1]["detail"]
    assert behaviour.seen_in(rows) == {fp: (2, "a")}  # what a resumed run starts from


@pytest.mark.integration
def test_validate_flags_a_restructured_copy_by_its_behaviour(tmp_path: Path) -> None:
    assert ast_hash(RESTRUCTURED) != ast_hash(ORIGINAL)  # the AST key alone lets it through
    other = (BENIGN_DIR / "json_tools.py").read_text()
    rows = [_design(ORIGINAL), _design(other), _design(RESTRUCTURED, "Another hint.")]
    out = tmp_path / "v.jsonl"
    r = run_spade("validate", "--designs", _write(tmp_path / "d.jsonl", rows), "--out", out, "--workers", "2")
    assert r.returncode == 0, r.stderr
    got = _read(out)
    assert [g["reason"] for g in got] == [None, None, "duplicate"]
    last = got[2]["checks"][-1]
    assert last["name"] == "duplicate_behaviour" and got[0]["env_id"] in last["detail"]
    assert got[2]["stats"]["duplicate_of"] == got[0]["env_id"]
    assert got[0]["stats"]["behaviour"] != got[1]["stats"]["behaviour"]
