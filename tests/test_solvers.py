"""Scripted solvers: they solve their starter envs, noise makes them fail some of the time, and the
samples are the rollout engine's own tokens, on seeds that rollout and eval never draw."""

from __future__ import annotations

import random

import pytest


def _returns(rows, name):
    return [r.return_ for r in rows if r.env_id == f"warmstart-{name}" and not r.error]


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def starter():
    from stages.warmstart import load_envs

    return load_envs("starter")


@pytest.mark.integration
def test_solvers_solve_their_envs_and_noise_makes_them_fail(tok, starter):
    from spade_cli.envs import solvers

    clean = solvers.play(tok, starter, 6, noise=0.0, seed=0, max_turns=8, enable_thinking=True)
    names = sorted(solvers.SOLVERS)
    assert sorted({r.env_id for r in clean}) == [f"warmstart-{n}" for n in names] == \
        sorted(f"warmstart-{e['name']}" for e in starter)  # every starter env has a solver
    for name in names:
        assert _returns(clean, name) == [1.0] * 12, name
    noisy = solvers.play(tok, starter, 6, noise=0.6, seed=0, max_turns=8, enable_thinking=True)
    for name in names:
        got = _returns(noisy, name)
        assert len(got) == 12 and 0 < sum(got) < 12, (name, got)


@pytest.mark.integration
def test_samples_are_the_rollout_engines_tokens_on_unreachable_seeds(tok, starter):
    from spade_cli.backends import render_chat
    from spade_cli.envs import solvers
    from spade_cli.rollout.episodes import PlayConfig, episode_seed, system_message

    env = next(e for e in starter if e["name"] == "signal_rules")
    rows = solvers.play(tok, [env], 3, noise=0.0, seed=4, max_turns=5, enable_thinking=True)
    assert len(rows) == 6 and {r.hinted for r in rows} == {False, True}
    samples = solvers.agent_samples(rows)
    cfg = PlayConfig(max_turns=5)
    for row, s in zip(rows, samples, strict=True):
        hint = env["hint"] if row.hinted else None
        first = [{"role": "system", "content": system_message(hint, cfg)}, row.messages[1]]
        n_prompt = len(render_chat(tok, first, enable_thinking=True))
        assert s["input_ids"][:n_prompt] == render_chat(tok, first, enable_thinking=True)
        assert s["completion_mask"][:n_prompt] == [0] * n_prompt
        # The loss covers exactly the replies, each closed by the EOS token.
        trained = tok.decode([t for t, m in zip(s["input_ids"], s["completion_mask"], strict=True) if m])
        replies = [m["content"] for m in row.messages if m["role"] == "assistant"]
        assert trained == "".join(r + tok.eos_token for r in replies)
        assert tok.decode(s["input_ids"]) == tok.apply_chat_template(row.messages, tokenize=False)
        assert row.seed >= solvers.SEED_BASE
    rng = random.Random(0)
    drawn = [episode_seed(rng.randrange(10**6), rng.randrange(1000), f"env{i}", rng.randrange(64)) for i in range(2000)]
    assert max(drawn) < solvers.SEED_BASE <= min(r.seed for r in rows)


@pytest.mark.unit
def test_policies_read_the_observations():
    from spade_cli.envs import solvers

    rng = random.Random(0)
    assert solvers.relay_word(["Radio: maple. Relay it.", "Garbled. Radio: tiger. Relay it."], rng, 0.0) == "tiger"
    assert solvers.signal_rules(["Light: red. Your move?", "Right. Light: green. Your move?"], rng, 0.0) == "go"
    assert solvers.next_letter(["Letter: q. Next?"], rng, 0.0) == "r"
    assert solvers.opposites(["Opposite of hot?", "Yes. Opposite of wet?"], rng, 0.0) == "dry"
    # with noise 1 every reply is one the env accepts for some state, drawn at random
    assert {solvers.signal_rules(["Light: red. Your move?"], rng, 1.0) for _ in range(60)} == {"stop", "wait", "go"}


@pytest.mark.unit
def test_solver_tables_are_the_starter_envs_own_rules():
    """The solvers know their envs' rules: each table is what the env's module defines."""
    import ast

    from spade_cli.envs import solvers
    from spade_cli.envs.pool import STARTER_POOL

    def constant(name: str, var: str):
        tree = ast.parse((STARTER_POOL / f"{name}.py").read_text())
        return next(ast.literal_eval(n.value) for n in tree.body
                    if isinstance(n, ast.Assign) and n.targets[0].id == var)

    assert constant("relay_word", "WORDS") == solvers.RELAY_WORDS
    assert constant("signal_rules", "RULES") == solvers.SIGNALS
    assert constant("next_letter", "LETTERS") == solvers.LETTERS
    assert constant("opposites", "PAIRS") == solvers.OPPOSITES
