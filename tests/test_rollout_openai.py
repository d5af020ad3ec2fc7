"""`spade rollout --backend openai` against a real `transformers serve` on 127.0.0.1.

The openai backend sets ``continuous = True``, so ``--batching auto`` plays each episode on its
own (continuous batching): several requests reach the server at once while other episodes step.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_spade
from tests.test_backend_openai import serve  # noqa: F401 - the shared server fixture
from tests.test_rollout_envs import GUESS, HINT, validation_row, write_envs


@pytest.mark.integration
def test_rollout_through_transformers_serve(serve, tiny_model, tmp_path):  # noqa: F811
    from transformers import AutoTokenizer

    envs = tmp_path / "validated.jsonl"
    write_envs(envs, [validation_row(GUESS)])
    out = tmp_path / "rollouts.jsonl"
    res = run_spade("rollout", "--model", tiny_model, "--backend", "openai", "--base-url", serve,
                    "--envs", envs, "--k", "3", "--out", out, "--max-turns", "3", "--max-tokens", "8",
                    "--max-concurrent", "4")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["episodes"] == 6 and summary["errors"] == {} and summary["batching"] == "continuous"
    # continuous batching: one generate call per episode-turn, not one per tick
    assert summary["generate_calls"] == summary["turns"]
    manifest = json.loads((tmp_path / "rollouts.jsonl.manifest.json").read_text())
    assert manifest["config"]["batching"] == "auto" and manifest["batching"] == "continuous"
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({r["episode_id"] for r in rows}) == 6
    pairs = {}
    for r in rows:
        pairs.setdefault(r["pair"], {})[r["hinted"]] = r
    assert sorted(pairs) == [0, 1, 2] and all(set(p) == {False, True} for p in pairs.values())
    for p in pairs.values():  # a pair shares its env seed, hence its first observation
        assert p[False]["seed"] == p[True]["seed"]
        assert p[False]["messages"][1]["content"] == p[True]["messages"][1]["content"]
    for r in rows:
        t = r["tokens"]
        full = tok.decode(t["prompt_ids"] + t["completion_ids"], skip_special_tokens=False)
        assert full == tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=False)
        assert len(t["env_mask"]) == len(t["completion_ids"]) == len(t["logprobs"]) and 1 in t["env_mask"]
        assert 1 <= len(r["turns"]) <= 3 and r["error"] is None
        assert (HINT in full) is r["hinted"] and (HINT in json.dumps(r)) is r["hinted"]


@pytest.mark.integration
def test_lockstep_stays_available_for_openai(serve, tiny_model, tmp_path):  # noqa: F811
    envs = tmp_path / "validated.jsonl"
    write_envs(envs, [validation_row(GUESS)])
    out = tmp_path / "rollouts.jsonl"
    res = run_spade("rollout", "--model", tiny_model, "--backend", "openai", "--base-url", serve,
                    "--envs", envs, "--k", "1", "--out", out, "--max-turns", "2", "--max-tokens", "4",
                    "--batching", "lockstep")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["batching"] == "lockstep" and summary["episodes"] == 2
    assert summary["generate_calls"] == max(len(json.loads(x)["turns"]) for x in out.read_text().splitlines())
