"""LiveCodeBench v6 for lm-eval (``lm:spade_lcb_v6``): the prompt, and the model's program run in spade's sandbox.

An item is a row of ``livecodebench/code_generation_lite`` in its published schema
(``question_content``, ``starter_code``, ``public_test_cases`` and ``private_test_cases`` as JSON
strings, the private ones possibly base64 + zlib + pickle, ``metadata`` with ``func_name`` for
LeetCode-style problems). ``prompt`` is LiveCodeBench's own generation prompt; ``score`` takes the
last fenced Python block after any reasoning, and runs it against every test inside one confined
env process of spade's sandbox (the same tiers, rlimits and seccomp as designed environments):
the judge below is a Gym env whose single step receives the program. It passes when every test's
output matches (stdin tests: the whitespace-split lines; functional tests: the JSON return value).

Compared with LiveCodeBench's runner: one time limit for the whole test set (60 s of the
sandbox's step timeout) instead of one per test, and outputs compared as tokens per line (its
float tolerance is not reproduced).
"""

from __future__ import annotations

import atexit
import base64
import io
import json
import pickle
import re
import threading
import zlib
from typing import Any

_FENCE = re.compile(r"```(?:python|py)?\n(.*?)```", re.S)
_POOL: Any = None
_LOCK = threading.Lock()

PROMPT_HEAD = ("You will be given a question (problem specification) and will generate a correct Python program "
               "that matches the specification and passes all tests.\n\n")
STARTER = ("You will use the following starter code to write the solution to the problem and enclose your code "
           "within delimiters.\n```python\n{starter}\n```\n\n")
STDIN = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on "
         "the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program "
         "runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n"
         "```\n\n")

JUDGE = '''
import contextlib, io, json, sys
import gymnasium as gym

TESTS = json.loads({tests!r})
FUNC = {func!r}


def _passes(program, test):
    if test["testtype"] == "functional":
        ns = {{}}
        exec(program, ns)
        args = [json.loads(line) for line in test["input"].split("\\n") if line.strip()]
        got = getattr(ns["Solution"](), FUNC)(*args)
        return json.loads(json.dumps(got)) == json.loads(test["output"])
    out = io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(test["input"])
    try:
        with contextlib.redirect_stdout(out):
            try:
                exec(program, {{"__name__": "__main__"}})
            except SystemExit:
                pass
    finally:
        sys.stdin = old
    lines = lambda s: [line.split() for line in s.strip().splitlines() if line.strip()]
    return lines(out.getvalue()) == lines(test["output"])


class Judge(gym.Env):
    """One step: the action is the program; reward 1.0 when it passes every test."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "send the program", {{}}

    def step(self, action):
        passed = 0
        for test in TESTS:
            try:
                ok = _passes(action, test)
            except BaseException:
                ok = False
            if not ok:
                break
            passed += 1
        return f"{{passed}}/{{len(TESTS)}} tests passed", float(passed == len(TESTS)), True, False, {{}}
'''


def prompt(doc: dict) -> str:
    starter = (doc.get("starter_code") or "").strip()
    body = STARTER.format(starter=starter) if starter else STDIN
    return PROMPT_HEAD + f"Question: {doc['question_content']}\n\n" + body + "### Answer: (use the provided format with backticks)\n\n"


class _StrOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # a str needs no class: refuse every one
        raise pickle.UnpicklingError(f"refused {module}.{name}")


def tests(doc: dict) -> list[dict]:
    """Public then private test cases; the private ones decoded as LiveCodeBench stores them."""
    out = json.loads(doc.get("public_test_cases") or "[]")
    private = doc.get("private_test_cases") or "[]"
    try:
        out += json.loads(private)
    except json.JSONDecodeError:
        # LiveCodeBench's own encoding: base64 of zlib of a pickled JSON string. Only plain
        # values are unpickled (no class can be loaded), so a crafted file cannot run code here.
        raw = _StrOnly(io.BytesIO(zlib.decompress(base64.b64decode(private)))).load()
        out += json.loads(raw)
    return out


def program(completion: str) -> str:
    text = completion.rsplit("</think>", 1)[-1]
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else ""


def _pool() -> Any:
    global _POOL
    with _LOCK:
        if _POOL is None:
            from spade_cli.sandbox import SandboxConfig, SandboxPool

            # Room for test data embedded in the judge and for long programs; timeouts set per item.
            _POOL = SandboxPool(SandboxConfig(tier="auto", max_code_chars=20_000_000, max_action_chars=65536,
                                              step_timeout_s=60.0, episode_timeout_s=120.0, memory_mb=2048))
            atexit.register(_POOL.close)
        return _POOL


def score(doc: dict, completion: str) -> float:
    """1.0 when the completion's program passes every test of ``doc`` in the sandbox, else 0.0."""
    from spade_cli.sandbox import EnvError

    code = program(completion)
    if not code.strip():
        return 0.0
    cases = tests(doc)
    func = (json.loads(doc.get("metadata") or "{}") or {}).get("func_name")
    try:
        env = _pool().open(JUDGE.format(tests=json.dumps(cases), func=func), env_id=str(doc.get("question_id", "")))
        try:
            env.reset("judge", seed=0)
            _, reward, _, _, _ = env.step("judge", code)
        finally:
            env.close()
    except EnvError:  # the program hung, blew a limit or crashed the judge: a failed submission
        return 0.0
    return float(reward)
