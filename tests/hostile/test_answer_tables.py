"""Hints that are answer tables or hidden rules, through the real validate, rollout and regret.

Each hack of ``keyed_cases.HACKS`` buys hint-regret +1 with a scripted agent that uses the hint
(answer tables keyed by what the observation shows, one try or several with feedback that says
nothing; a required reply length that is an arbitrary function of a number the env shows). Each
must end with ``designer_reward <= 0`` or a flag under the default settings. The learnable
controls (a higher/lower game whose hint is binary search, a capitals quiz that corrects misses,
the starter envs played by their solvers) must keep a positive reward and no flag.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spade_cli.checks.keyed import Table
from spade_cli.envs import pool as pools
from tests.conftest import run_spade
from tests.hostile import keyed_cases as kc

pytestmark = pytest.mark.integration


class HintedAgent:
    """A backend whose reply comes from ``keyed_cases.reply`` (or a starter env's solver) over the
    observations and the hint in the rendered prompt."""

    name = "scripted"
    continuous = False

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.model = tokenizer, "scripted"

    def generate(self, prompts, n, sampling, seeds=None):
        import random

        from spade_cli.backends import GenSample
        from spade_cli.envs.solvers import SOLVERS, USER_TURN

        out = []
        for ids in prompts:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            obs = USER_TURN.findall(text)
            hinted = "written by its designer:" in text.split("<|im_end|>", 1)[0]
            starter = next((s for s, pat in STARTERS.items() if re.search(pat, obs[0])), None)
            if starter:
                reply = SOLVERS[starter](obs, random.Random(0), 0.0) if hinted else "7"
            else:
                reply = kc.reply(obs, hinted)
            toks = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append([GenSample(token_ids=toks, text=reply, logprobs=None, finish_reason="stop")] * n)
        return out

    def close(self) -> None:
        pass


STARTERS = {"relay_word": r"^Radio:", "signal_rules": r"^Light:", "next_letter": r"^Letter: \w\. Next\?",
            "opposites": r"^Opposite of"}


def _designs() -> list[dict]:
    rows = [{"title": n, "code": c, "hint": h} for n, (c, h, _) in kc.HACKS.items()]
    rows += [{"title": n, "code": c, "hint": h} for n, (c, h) in kc.CONTROLS.items()]
    rows += [{"title": e["name"], "code": e["code"], "hint": e["hint"]} for e in pools.load_folder(pools.pool_path("starter"))]
    return [{"schema": "spade.design/1", **r} for r in rows]


def _batches(rows: list[dict]) -> list[list[dict]]:
    """One case per normalised code per input: variants of one template are near-duplicates."""
    from spade_cli.checks.astnorm import ast_hash

    batches: list[list[dict]] = []
    for row in rows:
        h = ast_hash(row["code"])
        batch = next((b for b in batches if h not in {ast_hash(r["code"]) for r in b}), None)
        if batch is None:
            batches.append(batch := [])
        batch.append(row)
    return batches


def test_answer_tables_and_hidden_rules_lose_their_reward(tmp_path: Path, tiny_model) -> None:
    rows, scores = _pipeline(tmp_path, _batches(_designs()), tiny_model)
    got = {t: (r["reason"], scores[r["env_id"]]["flags"], scores[r["env_id"]]["designer_reward"],
               scores[r["env_id"]]["regret"]) for t, r in rows.items()}
    for name, (_, _, stopped_by) in kc.HACKS.items():
        reason, flags, reward, _ = got[name]
        assert reward <= 0 and stopped_by in (reason, *flags), (name, got[name])
    for name in [*kc.CONTROLS, *STARTERS]:
        reason, flags, reward, regret = got[name]
        assert reason is None and not flags and reward > 0, (name, got[name])
    # without the new checks every hack would have paid: the hinted agent solves them all
    for name in ("ticket_length_one_try", "ticket_length_tries"):
        assert got[name][3] == 1.0
    for name, (_, _, stopped_by) in kc.HACKS.items():  # the tables fall to the new probe, not an old one
        failed = [c["name"] for c in rows[name]["checks"] if not c["ok"]]
        assert failed == (["answer_table"] if stopped_by == "hint_is_answer" else []), (name, failed)
    vault = rows["vault_tries_wrong"]
    check = next(c for c in vault["checks"] if c["name"] == "answer_table")
    assert "teaches nothing" in check["detail"] and vault["stats"]["probes"]["answer_table"]["seeds_solved"] >= 3
    capitals = next(c for c in rows["capitals_corrected"]["checks"] if c["name"] == "answer_table")
    assert "teaches the answer" in capitals["detail"]


def test_a_winning_reply_made_of_one_filler_letter_is_still_judged(tmp_path: Path, tiny_model) -> None:
    """A length rule whose hinted answer is only `x` (and spaces) or only `q`: the content-free
    replay uses fillers the replies do not hold, so the episode is judged and flagged."""
    from spade_cli.checks.audits import content_free, fillers

    rows = [{"schema": "spade.design/1", "title": n, "code": c, "hint": h} for n, (c, h, _) in kc.FILLER_HACKS.items()]
    got, scores = _pipeline(tmp_path, _batches(rows), tiny_model)
    for name in kc.FILLER_HACKS:
        score = scores[got[name]["env_id"]]
        assert got[name]["reason"] is None and score["regret"] == 1.0, (name, score)  # it would have paid
        assert score["flags"] == ["format_only"] and score["designer_reward"] <= 0, (name, score)
        assert score["audit"]["form_replay"] == {"replays": 2, "solved": 2, "error": None, "format_only": True}
    replies = ["xxxx xxxx", "q"]
    assert fillers(replies) == ["z", "j"] and fillers(["xqzjkvwXQZJKVW0123456789#%&*+=@^~"]) == ["\xa1", "\xa2"]
    assert all(content_free(replies, f) != replies for f in fillers(replies))
    assert content_free([" ", ""], fillers([" ", ""])[0]) == [" ", ""]  # no content: not judged


def _pipeline(tmp_path: Path, batches: list[list[dict]], tiny_model) -> tuple[dict, dict]:
    """validate (CLI) -> rollout (stage core, scripted agent, k = 4) -> regret (CLI): rows by
    title, scores by env id."""
    from transformers import AutoTokenizer

    from stages import rollout

    validated = []
    for i, batch in enumerate(batches):
        designs, out = tmp_path / f"d{i}.jsonl", tmp_path / f"v{i}.jsonl"
        designs.write_text("".join(json.dumps(r) + "\n" for r in batch))
        res = run_spade("validate", "--designs", designs, "--out", out)
        assert res.returncode == 0, res.stderr
        validated.append(out)
    rows = {r["title"]: r for p in validated for r in map(json.loads, p.read_text().splitlines())}
    agent = HintedAgent(AutoTokenizer.from_pretrained(tiny_model))
    rollouts = tmp_path / "r.jsonl"
    rollout.run(str(tiny_model), validated, rollouts, k=4, backend_obj=agent)
    res = run_spade("regret", "--envs", ",".join(map(str, validated)), "--rollouts", rollouts,
                    "--out", tmp_path / "s.jsonl")
    assert res.returncode == 0, res.stderr
    scores = {r["env_id"]: r for r in map(json.loads, (tmp_path / "s.jsonl").read_text().splitlines())}
    return rows, scores


def test_quickstart_family_designs_keep_their_reward(tmp_path: Path, tiny_model) -> None:
    """Every family design (52: thirteen rules, corrected or marked, paid per round or at the
    end), played by an agent that knows each rule when hinted: valid, unflagged, positive reward."""
    from spade_cli.envs import family

    rows = [{"schema": "spade.design/1", "title": e["name"], "code": e["code"], "hint": e["hint"],
             "gen": {"backend": "pool"}} for e in family.members(0)]
    got, scores = _pipeline(tmp_path, [rows], tiny_model)
    bad = {t: (r["reason"], scores[r["env_id"]]["flags"], scores[r["env_id"]]["designer_reward"])
           for t, r in got.items() if not r["valid"] or scores[r["env_id"]]["flags"]
           or scores[r["env_id"]]["designer_reward"] <= 0}
    assert not bad, bad
    assert all(scores[r["env_id"]]["hinted_mean"] == 1.0 for r in got.values())  # the oracle solved them


@pytest.mark.unit
def test_table_reads_keys_wherever_the_hint_puts_them() -> None:
    assert Table("Vault 7: marmalade, Vault 8: quince").candidates("Vault 8 is locked.")[0] == "quince"
    assert Table("amber opens vault 1, basil opens vault 2").candidates("Vault 2 is sealed")[0] == "basil"
    assert "9001" in Table("Codes\nK-17 -> 4412\nB-4 -> 9001").candidates("Item B-4: code?")
    assert Table("red is apple. blue is plum.").candidates("Tag: blue")[0] == "plum"
    assert Table("Words of lockers 1 to 4: otter, walnut, copper, anvil").candidates("Locker 3")[0] == "copper"
    # words every seed shows are the frame, not a key: a strategy hint gives nothing to play
    frame = "Guess my number from 1 to 100. You have 8 guesses."
    assert Table(kc.GUESS_HINT).candidates(frame)[0] == "50"
    assert Table(kc.GUESS_HINT, set(re.findall(r"\w+", frame.lower()))).candidates(frame) == []
    assert not Table("Reply with the first letter of the word alone.").usable
