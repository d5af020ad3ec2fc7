"""`spade warmstart`: the SFT samples are real Designer prompts, and the fine-tune learns."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_spade


@pytest.mark.unit
def test_samples_are_design_prompts_with_answer_only_loss(tiny_model):
    from transformers import AutoTokenizer

    from spade_cli.backends import render_chat
    from spade_cli.designer import prompts
    from stages.design import plan_prompts
    from stages.warmstart import build_samples, pick_envs

    tok = AutoTokenizer.from_pretrained(tiny_model)
    envs = pick_envs("bundled", 2)
    assert len(envs) == 2 and len(envs[0]["code"]) <= len(envs[1]["code"])  # shortest first
    samples = build_samples(tok, envs, epochs=2, seed=0, corpus=None, grounding=True, excerpt_chars=300,
                            example=False, enable_thinking=False)
    assert len(samples) == 4
    plan = plan_prompts(n=2, group=1, seed=0, iteration=1, corpus=None, grounding=True, memory=None,
                        excerpt_chars=300, example=False)
    s = samples[2]  # epoch 1, first env: the prompt `spade design` builds for iteration 1, group 0
    prompt_ids = render_chat(tok, plan[0]["messages"], enable_thinking=False)
    n_prompt = s["completion_mask"].index(1)
    assert s["input_ids"][:n_prompt] == prompt_ids
    answer = tok.decode(s["input_ids"][n_prompt:])
    assert answer == prompts.format_answer(envs[0]["title"], envs[0]["code"], envs[0]["hint"]) + tok.eos_token
    assert prompts.parse_completion(answer.removesuffix(tok.eos_token)).code.rstrip() == envs[0]["code"].rstrip()
    assert samples[0]["input_ids"][:n_prompt] != s["input_ids"][:n_prompt]  # another epoch, another doc
    # Within an epoch every environment gets the same prompt, so no prompt favours one environment.
    assert samples[3]["input_ids"][:n_prompt] == prompt_ids and samples[3]["input_ids"] != s["input_ids"]

    # With a memory pool, odd epochs carry a memory summary naming pool environments.
    with_memory = build_samples(tok, envs, epochs=2, seed=0, corpus=None, grounding=True, excerpt_chars=300,
                                example=False, enable_thinking=False, memory_pool=pick_envs("bundled", None))
    first, second = (tok.decode(x["input_ids"]) for x in (with_memory[0], with_memory[2]))
    assert "Environment memory:" not in first and "Environment memory:" in second


@pytest.mark.integration
def test_warmstart_lowers_the_loss_and_writes_a_checkpoint(tiny_model, tmp_path):
    out = tmp_path / "warm"
    args = ("warmstart", "--model", tiny_model, "--out", out, "--epochs", "6", "--max-examples", "1",
            "--batch-size", "1", "--learning-rate", "1e-2", "--excerpt-chars", "60")
    res = run_spade(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(res.stdout.strip().splitlines()) == 1  # trainer logs go to stderr, not stdout
    summary = json.loads(res.stdout)
    assert summary["steps"] == 6 and summary["final_loss"] < summary["first_loss"] - 0.5
    assert (out / "model.safetensors").exists() and (out / "chat_template.jinja").exists()
    config = json.loads((tmp_path / "warm.manifest.json").read_text())["config"]
    assert not {"contract", "agent_pool", "memory_k"} & set(config)  # later options at their defaults
    again = run_spade(*args)
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "up to date"

    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)
