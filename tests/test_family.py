"""The generated env family (Designer warm-start targets for a small model) and the short contract.

Every member passing `spade validate` is checked with the other named pools in test_pool.py.
"""

from __future__ import annotations

import json
import random
import types

import pytest

from spade_cli.checks.astnorm import ast_hash
from spade_cli.designer import prompts
from spade_cli.envs import family, pool
from tests.conftest import run_spade


def _load(code: str):
    module = types.ModuleType("family_env")
    exec(compile(code, "family_env", "exec"), module.__dict__)  # trusted: our own generator's code
    [cls] = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == "family_env"]
    return module, cls()


def _play(env, module, rule: family.Rule, seed: int, right: bool) -> float:
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        want = eval(rule.want, vars(module), {"self": env})  # noqa: S307 - the rule's own expression
        obs, reward, done, truncated, _ = env.step(f"  {want} " if right else "nope")
        assert isinstance(obs, str) and isinstance(reward, float) and not truncated
        total += reward
    return total


@pytest.mark.unit
def test_every_member_has_its_own_structure_and_none_is_a_starter_env():
    members = family.members(0)
    assert len(members) == len(family.RULES) * 4 == 52
    hashes = [ast_hash(m["code"]) for m in members]
    assert None not in hashes and len(set(hashes)) == len(members)  # no two are duplicates
    starter = {ast_hash(e["code"]) for e in pool.load_envs("starter")}
    assert not starter & set(hashes)  # the held-out suite stays held out
    assert members == family.members(0) and members != family.members(1)  # seeded material
    assert {ast_hash(m["code"]) for m in family.members(1)} == set(hashes)  # ...same structures
    assert len({m["name"] for m in members}) == len(members)


@pytest.mark.unit
@pytest.mark.parametrize("index", range(52))
def test_the_rule_solves_every_member_and_a_wrong_reply_earns_nothing(index):
    member = family.members(0)[index]
    rules = {r.name: r for r in family._rules(random.Random("family|0"))}  # as members(0) draws them
    rule = rules[member["title"].split(":")[0]]
    module, env = _load(member["code"])
    for seed in (0, 1, 2):
        assert _play(env, module, rule, seed, right=True) == pytest.approx(1.0)
        assert _play(env, module, rule, seed, right=False) == 0.0
    assert member["hint"] and member["hint"].lower() not in member["code"].lower()


@pytest.mark.unit
def test_short_contract_prompts_and_warm_start_samples(tiny_model):
    from transformers import AutoTokenizer

    from stages.design import plan_prompts
    from stages.warmstart import build_samples, load_envs

    full = prompts.build_messages(None, None, None)
    short = prompts.build_messages(None, None, None, contract="short")
    assert full[0]["content"] == prompts.SYSTEM and short[0]["content"] == prompts.SHORT_SYSTEM
    assert full[1] == short[1] and len(prompts.SHORT_SYSTEM) < len(prompts.SYSTEM) / 3
    with pytest.raises(ValueError):
        prompts.build_messages(None, None, None, contract="tiny")

    tok = AutoTokenizer.from_pretrained(tiny_model)
    envs = load_envs("family")
    samples = build_samples(tok, envs, epochs=1, seed=0, corpus=None, grounding=False, excerpt_chars=150,
                            example=False, enable_thinking=False, contract="short")
    assert len(samples) == 52
    [plan] = plan_prompts(n=1, group=1, seed=0, iteration=0, corpus=None, grounding=False, memory=None,
                          excerpt_chars=150, example=False, contract="short")
    text = tok.decode(samples[0]["input_ids"])
    assert prompts.SHORT_SYSTEM.strip() in text and "The environment contract" not in text
    n_prompt = samples[0]["completion_mask"].index(1)
    answer = tok.decode(samples[0]["input_ids"][n_prompt:]).removesuffix(tok.eos_token)
    assert prompts.parse_completion(answer).code.rstrip() == envs[0]["code"].rstrip()
    assert plan["messages"][0]["content"] == prompts.SHORT_SYSTEM


@pytest.mark.integration
def test_design_contract_flag_and_its_manifest(tmp_path, tiny_model):
    bad = run_spade("design", "--model", tiny_model, "--n", "1", "--group", "1", "--contract", "tiny",
                    "--out", tmp_path / "x.jsonl")
    assert bad.returncode == 2 and "--contract" in bad.stderr
    configs = {}
    for contract in ("full", "short"):
        out = tmp_path / f"{contract}.jsonl"
        res = run_spade("design", "--model", tiny_model, "--n", "1", "--group", "1", "--max-tokens", "8",
                        "--contract", contract, "--no-grounding", "--out", out)
        assert res.returncode == 0, res.stderr[-2000:]
        row = json.loads(out.read_text().splitlines()[0])
        assert row["messages"][0]["content"] == prompts.CONTRACTS[contract]
        configs[contract] = json.loads((tmp_path / f"{contract}.jsonl.manifest.json").read_text())["config"]
    # the default is left out of the manifest, so a design written before the flag stays up to date
    assert "contract" not in configs["full"] and configs["short"]["contract"] == "short"


@pytest.mark.integration
def test_warmstart_from_two_pools_or_one_role(tmp_path, tiny_model):
    """--agent-pool takes the solver episodes from another pool than the Designer's targets;
    --epochs 0 trains the Agent alone; nothing to train at all is a usage error."""
    nothing = run_spade("warmstart", "--model", tiny_model, "--out", tmp_path / "n", "--epochs", "0")
    assert nothing.returncode == 2 and "nothing to train" in nothing.stderr
    common = ("--batch-size", "2", "--learning-rate", "1e-3", "--agent-max-turns", "2", "--no-grounding",
              "--contract", "short", "--memory-k", "2")
    both = run_spade("warmstart", "--model", tiny_model, "--out", tmp_path / "both", "--pool", "family",
                     "--max-examples", "3", "--epochs", "1", "--agent-pool", "starter", "--solver-seeds", "1",
                     *common)
    assert both.returncode == 0, both.stderr[-2000:]
    s = json.loads(both.stdout)
    assert s["designer_samples"] == 3 and s["agent_samples"] > 0 and len(s["agent_envs"]) == 4
    config = json.loads((tmp_path / "both.manifest.json").read_text())["config"]
    assert config["agent_pool"] == "starter" and config["contract"] == "short" and config["memory_k"] == 2
    agent = run_spade("warmstart", "--model", tiny_model, "--out", tmp_path / "agent", "--pool", "starter",
                      "--epochs", "0", "--solver-seeds", "1", *common)
    assert agent.returncode == 0, agent.stderr[-2000:]
    s = json.loads(agent.stdout)
    assert s["designer_samples"] == 0 and s["agent_samples"] == s["samples"] > 0
    # with no solver among its envs, the family alone cannot warm-start an Agent
    none = run_spade("warmstart", "--model", tiny_model, "--out", tmp_path / "f", "--pool", "family",
                     "--epochs", "0", "--solver-seeds", "1", *common)
    assert none.returncode == 1 and "scripted solver" in none.stderr and "Traceback" not in none.stderr
