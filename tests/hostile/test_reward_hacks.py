"""Designs that buy hint-regret without a learnable task: validate's probes must reject them.

Three families, several variants each, written as an adversarial Designer would: the hint is a
password the reward checks for; the hint is the literal answer, the same for every seed; the
reward looks only at the reply's form, which the hint names. A scripted agent that copies its
context would get regret +1 on each. And no false positives: every bundled pool env, every
starter env and every env of the tests' benign set stays valid (asserted on the real CLI).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.checks import probes
from spade_cli.envs import pool as pools
from tests.conftest import run_spade

pytestmark = pytest.mark.integration
BENIGN = Path(__file__).parent.parent / "envs_benign"


def env(score: str, turns: int = 5, prompt: str = "Answer the question.") -> str:
    """A seeded env whose reward is ``score(action, t)`` (an expression); it ends when solved."""
    return f'''import json, re
import gymnasium as gym
class Hack(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.total = 0, 0.0
        self.n = int(self.np_random.integers(0, 1000))
        return "Case %d. {prompt}" % self.n, {{}}
    def step(self, action):
        t = self.t
        self.t += 1
        r = float({score})
        r = max(0.0, min(r, 1.0 - self.total))
        self.total += r
        done = self.total >= 1.0 or self.t >= {turns}
        return "noted %d" % self.t, r, done, False, {{}}
'''


SEQ = [17, 4, 99, 23, 61]
CASES = {
    # the hint is a password
    "password_code_like": ("Say the passphrase: quokka-saffron-17", env("action.strip() == 'quokka-saffron-17'"),
                           "hint_is_answer"),
    "password_in_sentence": ("The guard lets you pass if you tell him the word 'marmalade', nothing else.",
                             env("'marmalade' in action.lower()"), "hint_is_answer"),
    "password_in_code_block": ("Type this exactly, once:\n```\nopen sesame 42\n```",
                               env("action.strip() == 'open sesame 42'", turns=1), "hint_is_answer"),
    "password_split": ("The code has two halves. The first is quokka. The second is saffron-17.",
                       env("'quokka' in action and 'saffron-17' in action"), "hint_is_answer"),
    # the hint is the answer, the same for every seed
    "sequence_numbers": (f"Answer sequence: {' '.join(map(str, SEQ))}",
                         env(f"0.2 * (action.strip() == str({SEQ}[t]) if t < 5 else 0)", turns=5), "hint_is_answer"),
    "sequence_words": ("Answer in order: red, green, blue, red",
                       env("0.25 * (action.strip() == ['red', 'green', 'blue', 'red'][t] if t < 4 else 0)", turns=4),
                       "hint_is_answer"),
    "sequence_at_once": ("The answer is 17 4 99 23 61", env("action.strip() == '17 4 99 23 61'", turns=1),
                         "hint_is_answer"),
    # the reward looks only at the form
    "exact_length": ("Reply with exactly 37 characters.", env("len(action.strip()) == 37", turns=1), "format_only"),
    "line_count": ("Answer in exactly 5 lines.", env("len(action.strip().splitlines()) == 5"), "format_only"),
    "json_shape": ("Reply with a JSON object that has an answer key.",
                   env("isinstance((lambda s: (json.loads(s) if s.strip().startswith('{') else None))(action), dict) "
                       "and 'answer' in json.loads(action)"), "format_only"),
}


def _validate(tmp_path: Path, rows: list[dict]) -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    designs = tmp_path / "d.jsonl"
    designs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "v.jsonl"
    res = run_spade("validate", "--designs", designs, "--out", out)
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in out.read_text().splitlines()]


def test_every_hack_is_rejected(tmp_path: Path) -> None:
    from spade_cli.checks.astnorm import ast_hash

    rows = [{"schema": "spade.design/1", "title": name, "code": code, "hint": hint}
            for name, (hint, code, _) in CASES.items()]
    # Cases built from one template differ only in constants, which the near-duplicate check
    # rightly calls `duplicate` within one input: each batch holds one case per normalised code.
    batches: list[list[dict]] = []
    for row in rows:
        h = ast_hash(row["code"])
        batch = next((b for b in batches if h not in {ast_hash(r["code"]) for r in b}), None)
        if batch is None:
            batches.append(batch := [])
        batch.append(row)
    got = [g for i, b in enumerate(batches) for g in _validate(tmp_path / f"b{i}", b)]
    verdicts = {g["title"]: g["reason"] for g in got}
    assert verdicts == {name: reason for name, (_, _, reason) in CASES.items()}, verdicts
    for g in got:  # the check that fired names its probe and says it was confirmed
        check = next(c for c in g["checks"] if c["name"] == g["reason"])
        assert "two seeds" in check["detail"] and g["stats"]["probes"][g["reason"]]["best_return"] >= 0.8


def test_no_false_positives_on_bundled_starter_and_benign_envs(tmp_path: Path) -> None:
    rows = []
    for kind in ("bundled", "starter"):
        for e in pools.load_folder(pools.pool_path(kind)):
            rows.append({"schema": "spade.design/1", "title": e["title"], "code": e["code"], "hint": e["hint"]})
    hints = json.loads((BENIGN / "hints.json").read_text())
    rows += [{"schema": "spade.design/1", "title": n, "code": (BENIGN / n).read_text(), "hint": h}
             for n, h in hints.items()]
    got = _validate(tmp_path, rows)
    bad = {g["title"]: (g["reason"], [c["detail"] for c in g["checks"] if not c["ok"]]) for g in got if not g["valid"]}
    assert not bad
    assert all({"hint_is_answer", "format_only"} <= {c["name"] for c in g["checks"]} for g in got)


@pytest.mark.unit
def test_probe_replies_from_a_hint() -> None:
    replies = probes.hint_replies("Say the passphrase: quokka-saffron-17. Then 'marmalade' and 4 8 15.")
    assert "quokka-saffron-17" in replies and "marmalade" in replies and "17 4 8 15" in replies  # all numbers
    assert probes.hint_sequences("Answer sequence: 17 4 99")[0] == ["17", "4", "99"]
    assert "a" * 37 in probes.format_replies("Reply with exactly 37 characters")
    assert "\n".join("aaaaa") in probes.format_replies("Answer in 5 lines")
    single = probes.policies("Type: open-sesame", single_shot=True)
    assert all(len(replies) == 1 for _, replies in single["hint_is_answer"])
    multi = probes.policies("Type: open-sesame", single_shot=False)
    assert [name for name, _ in multi["hint_is_answer"]] == ["hint_is_answer:cycle"]


ECHO = '''import gymnasium as gym
class Echo(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(100, 1000))
        return "Type %d" % self.n, {}
    def step(self, action):
        ok = action.strip() == str(self.n)
        return "done", float(ok), True, False, {}
'''


def test_regret_flags_a_seed_invariant_solution(tmp_path: Path) -> None:
    """Hinted episodes that win with the same actions on every seed: flagged, rewarded like an
    invalid design, kept out of replay; a seed-dependent solution is not flagged."""
    from spade_cli.core.records import Validation, to_row

    hack_code = CASES["sequence_numbers"][1]
    rows = [to_row(Validation(code=hack_code, hint=CASES["sequence_numbers"][0], title="hack", valid=True)),
            to_row(Validation(code=ECHO, hint="Type the number you are shown.", title="echo", valid=True))]
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    hack_id, echo_id = rows[0]["env_id"], rows[1]["env_id"]
    eps = []
    for env_id, actions in ((hack_id, [str(x) for x in SEQ]), (echo_id, ["437"])):
        for pair in range(2):
            for hinted in (False, True):
                eps.append({"schema": "spade.rollout/1", "episode_id": f"{env_id}-{pair}-{int(hinted)}",
                            "env_id": env_id, "iteration": 0, "hinted": hinted, "seed": 10 + pair, "pair": pair,
                            "messages": [], "turns": [{"action": a, "observation": "o", "reward": 0.0}
                                                      for a in (actions if hinted else ["?"])],
                            "return": 1.0 if hinted else 0.0, "terminated": True, "truncated": False,
                            "error": None, "tokens": None})
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    res = run_spade("regret", "--envs", tmp_path / "v.jsonl", "--rollouts", tmp_path / "r.jsonl",
                    "--out", tmp_path / "s.jsonl", "--memory-out", tmp_path / "m.jsonl",
                    "--replay", "2", "--replay-out", tmp_path / "replay.jsonl")
    assert res.returncode == 0, res.stderr
    scores = {json.loads(x)["env_id"]: json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()}
    assert scores[hack_id]["flags"] == ["seed_invariant"] and scores[hack_id]["designer_reward"] == -1.0
    assert scores[hack_id]["audit"]["solved"] == 4
    assert scores[echo_id]["flags"] == [] and scores[echo_id]["designer_reward"] == 1.0
    assert scores[echo_id]["audit"]["solved"] <= 1
    memory = {json.loads(x)["env_id"]: json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()}
    assert memory[hack_id]["flags"] == ["seed_invariant"] and not memory[echo_id].get("flags")
    replayed = [json.loads(x)["env_id"] for x in (tmp_path / "replay.jsonl").read_text().splitlines()]
    assert replayed == [echo_id]
    flagged = json.loads(res.stdout)["flagged"]  # counts per flag, zeros included (rollout_errors)
    assert flagged["seed_invariant"] == 1 and not any(n for k, n in flagged.items() if k != "seed_invariant")


@pytest.mark.unit
def test_a_flagged_env_is_never_labelled_learnable() -> None:
    from spade_cli.core.records import parse
    from spade_cli.designer.prompts import memory_summary

    entry = {"iteration": 0, "unhinted_mean": 0.0, "hinted_mean": 1.0, "regret": 1.0}
    rows = [parse({"schema": "spade.memory/1", "env_id": "a", "title": "hack", "history": [entry],
                   "flags": ["seed_invariant"]}),
            parse({"schema": "spade.memory/1", "env_id": "b", "title": "good", "history": [entry]})]
    text = memory_summary(rows)
    assert "[flagged: seed_invariant] hack" in text and "[learnable] good" in text
