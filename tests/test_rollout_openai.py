"""`spade rollout --backend openai` against a real `transformers serve` on 127.0.0.1."""

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
                    "--envs", envs, "--k", "2", "--out", out, "--max-turns", "2", "--max-new-tokens", "8")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["episodes"] == 4 and summary["errors"] == {}
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for r in rows:
        t = r["tokens"]
        full = tok.decode(t["prompt_ids"] + t["completion_ids"], skip_special_tokens=False)
        assert full == tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=False)
        assert len(t["env_mask"]) == len(t["completion_ids"]) and 1 in t["env_mask"]
        assert (HINT in full) is r["hinted"]
