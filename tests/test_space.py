"""The design space (`spade design --contract spec`): specs, compiled envs, held-out cells, the
validate path, the probe's per-cell figures (docs/curriculum.md)."""

from __future__ import annotations

import json
import types

import pytest

from spade_cli.core.records import Design
from spade_cli.designer import prompts, space
from spade_cli.envs import pool, solvers
from spade_cli.evaluation import cells
from stages.validate import duplicates
from tests.conftest import run_spade


def _env(code: str):
    module = types.ModuleType("space_env")
    exec(compile(code, "space_env", "exec"), module.__dict__)  # trusted: the space's own compiler
    [cls] = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == "space_env"]
    return cls()


def _play(env: dict, seed: int, reply) -> float:
    e = _env(env["code"])
    obs, _ = e.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, done, truncated, _ = e.step(reply(obs))
        assert isinstance(obs, str) and not truncated
        total += reward
    return total


@pytest.mark.unit
@pytest.mark.parametrize("text, want", [
    ("rule=second level=2", space.Spec("second", 2, 3, "corrected")),
    ("feedback: marked, rounds: 5, level: 1, rule: double", space.Spec("double", 1, 5, "marked")),
    ("Rule=TWICE level=4 rounds=1", space.Spec("twice", 4, 1, "corrected")),
])
def test_specs_parse_in_any_order_and_form(text, want):
    assert space.parse_spec(text) == want


@pytest.mark.unit
@pytest.mark.parametrize("text, says", [
    ("level=2", "no rule="), ("rule=second", "no level="), ("rule=juggle level=2", "unknown rule"),
    ("rule=double level=6", "level=6 is not an integer from 1 to 5"), ("rule=double level=0", "from 1 to 5"),
    ("rule=double level=2 rounds=9", "rounds=9"), ("rule=double level=2 colour=red", "unknown key 'colour'"),
    ("rule=double level=2 level=3", "level given twice"), ("rule=double level=2 feedback=loud", "feedback"),
    ("rule=second level=3", "held out"),
])
def test_bad_specs_say_what_is_wrong(text, says):
    with pytest.raises(space.SpecError, match=says):
        space.parse_spec(text)


@pytest.mark.unit
def test_held_out_cells_are_one_per_rule_and_never_trained():
    assert sorted(r for r, _ in space.HELD_OUT) == sorted(space.RULES)
    trainable = set(space.cells(False))
    assert not trainable & space.HELD_OUT and len(trainable) + len(space.HELD_OUT) == len(space.cells(None))
    for name in ("space", "space-practice"):  # what the loop's pool and the warm start play
        assert not {(e["spec"]["rule"], e["spec"]["level"]) for e in pool.load_envs(name)} & space.HELD_OUT
    assert {(e["spec"]["rule"], e["spec"]["level"]) for e in pool.load_envs("space-heldout")} == space.HELD_OUT


@pytest.mark.unit
@pytest.mark.parametrize("cell", space.cells(None))
def test_every_cell_is_solved_by_its_rule_and_not_by_a_fixed_reply(cell):
    spec = space.Spec(*cell, rounds=4, feedback="marked")
    env = space.compile_spec(spec, practice=False)
    for seed in range(3):
        assert _play(env, seed, lambda obs: space.solve(obs, cell[0])) == pytest.approx(1.0)
        assert _play(env, seed, lambda obs: "a") < 0.5
    practice = space.compile_spec(spec, practice=True)
    assert _play(practice, 0, lambda obs: space.solve(obs, cell[0])) == pytest.approx(1.0)


@pytest.mark.unit
def test_the_level_sizes_the_material_and_the_cue_hides_the_rule():
    for rule in space.RULES:
        obs = [_env(space.compile_spec(space.Spec(rule, lv), practice=False)["code"]).reset(seed=1)[0]
               for lv in space.LEVELS]
        material = [o.split(": ", 1)[1] for o in obs]
        assert [len(m.split()) if space.RULES[rule].kind == "list" else len(m) for m in material] == [
            lv + 1 if space.RULES[rule].kind == "list" else lv for lv in space.LEVELS]
        hint = space.RULES[rule].hint.lower()
        assert all(rule.replace("_", " ") not in o.lower() and hint not in o.lower() for o in obs)


@pytest.mark.unit
def test_a_spec_completion_compiles_and_a_bad_one_is_a_failed_design():
    ok = prompts.parse_completion("<think>hmm</think>Spec: rule=double level=1 rounds=2", "spec")
    assert ok.error is None and ok.spec == {"rule": "double", "level": 1, "rounds": 2, "feedback": "corrected"}
    assert ok.hint == space.RULES["double"].hint and "class Toma" in ok.code
    assert prompts.parse_completion("Spec: rule=second level=3", "spec").error.endswith("held out for evaluation")
    assert prompts.parse_completion("nothing here", "spec").error == "no spec line"
    # whatever a sampled Designer writes is a parse or a failed design, never a crash of the stage
    assert prompts.parse_completion("spec rule=double level=1", "spec").spec["rule"] == "double"
    for text in ("spec", "Spec:", "spec rule", "SPEC level=9 rule=first", "spec:: rule=", "rule"):
        assert prompts.parse_completion(text, "spec").error, text
    # the free-form parser is untouched by the spec contract
    assert prompts.parse_completion("Spec: rule=double level=1").error is not None


@pytest.mark.unit
def test_a_cell_chosen_again_is_no_duplicate_but_twice_in_one_iteration_is():
    env = space.compile_spec(space.Spec("double", 1))
    row = Design(title=env["title"], code=env["code"], hint=env["hint"], extra={"spec": env["spec"]})
    other = space.compile_spec(space.Spec("double", 4))
    row2 = Design(title=other["title"], code=other["code"], hint=other["hint"], extra={"spec": other["spec"]})
    from spade_cli.core.records import Memory

    memory = [Memory(env_id=row.env_id, title=row.title, hint=row.hint, first_iteration=0, history=[],
                     extra={"code": row.code})]
    found = duplicates([row, row2, row], memory)
    assert [f[0] is None for f in found] == [True, True, False]  # level 4 shares level 1's structure


@pytest.mark.unit
def test_the_space_solver_plays_practice_envs_hinted_only():
    env = pool.load_envs("space-practice")[0]
    policy = solvers.space_policy(env)
    import random

    assert policy(["No. Zorp: apple river"], random.Random(0), 0.0) == space.solve("Zorp: apple river", env["spec"]["rule"])
    assert solvers.space_policy({"name": "x"}) is None


@pytest.mark.unit
def test_cell_table_gate_frontier_and_choices_by_hand():
    val = [{"env_id": "a", "valid": True, "spec": {"rule": "double", "level": 1}},
           {"env_id": "b", "valid": True, "spec": {"rule": "double", "level": 2}},
           {"env_id": "c", "valid": False, "spec": {"rule": "double", "level": 3}},
           {"env_id": "d", "valid": True}]
    scores = [{"env_id": "a", "hinted_mean": 0.9, "unhinted_mean": 0.6, "hinted_n": 4, "unhinted_n": 4,
               "regret_ci95": 0.1},
              {"env_id": "b", "hinted_mean": 0.5, "unhinted_mean": 0.0, "hinted_n": 4, "unhinted_n": 4,
               "regret_ci95": 0.6},
              {"env_id": "d", "hinted_mean": 1.0, "unhinted_mean": 0.0, "hinted_n": 4, "unhinted_n": 4}]
    t = cells.cell_table(val, scores)
    assert set(t) == {("double", 1), ("double", 2)}
    assert t[("double", 1)]["gain"] == pytest.approx(0.3) and t[("double", 2)]["gain"] == pytest.approx(0.5)
    g = cells.gate(t)
    assert (g["passing"], g["significant"]) == (2, 1)  # level 2's interval reaches below 0
    assert cells.frontier(t) == {"double": {"unhinted": 1, "hinted": 2}}
    chosen = cells.choices(val, t)
    assert chosen["valid"] == 3 and chosen["on_probe"] == 2
    assert chosen["true_regret"] == pytest.approx(0.4) and chosen["learnable_share"] == 1.0
    # two probes of one cell pool by episodes
    t2 = cells.cell_table(val[:1] * 2, [scores[0], {**scores[0], "hinted_mean": 0.5, "hinted_n": 12,
                                                     "unhinted_n": 12}])
    assert t2[("double", 1)]["hinted"] == pytest.approx((0.9 * 4 + 0.5 * 12) / 16)


@pytest.mark.integration
def test_the_grid_goes_through_design_and_validate(tmp_path):
    out = run_spade("design", "--pool", "space-grid", "--n", "30", "--out", str(tmp_path / "d.jsonl"))
    assert json.loads(out.stdout.splitlines()[-1])["rows"] == 30
    run_spade("validate", "--designs", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "v.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert all(r["valid"] for r in rows), [(r["title"], r["reason"]) for r in rows if not r["valid"]]
    assert {(r["spec"]["rule"], r["spec"]["level"]) for r in rows} == set(space.cells(None))


@pytest.mark.unit
def test_shuffled_rewards_permute_only_what_the_signal_earned():
    from stages.regret import shuffle_earned

    rows = [{"env_id": f"e{i}", "designer_reward": r, "note": n}
            for i, (r, n) in enumerate([(0.5, None), (-1.0, "invalid: syntax_error"), (0.1, None),
                                        (0.0, None), (-1.0, "flagged: seed_invariant")])]
    shuffle_earned(rows, 3)
    assert [r["designer_reward"] for r in rows if r["note"]] == [-1.0, -1.0]
    earned = [r for r in rows if r["note"] is None]
    assert sorted(r["designer_reward"] for r in earned) == [0.0, 0.1, 0.5]
    assert [r["designer_reward_earned"] for r in earned] == [0.5, 0.1, 0.0]
    again = [{**r, "designer_reward": r["designer_reward_earned"]} for r in earned]
    shuffle_earned(again, 3)  # seeded by iteration and designs: the same permutation again
    assert [r["designer_reward"] for r in again] == [r["designer_reward"] for r in earned]
