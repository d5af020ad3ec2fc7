"""Equal Agent budgets by design: `spade rollout --budget-pairs P` plays P seed pairs however many
of the iteration's designs are valid (docs/report.md, "The budget rule")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.core.records import Validation, to_row
from spade_cli.rollout.episodes import budget_pairs, episode_specs
from tests.conftest import run_spade

CODE = '''import gymnasium as gym


class Echo{n}(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Say something.", {{}}

    def step(self, action):
        return "done", float(len(action) > {n}), True, False, {{}}
'''


def _rows(valid: list[bool]) -> list[dict]:
    return [to_row(Validation(code=CODE.format(n=i), hint=f"longer than {i}", title=f"Echo{i}", valid=v,
                              reason=None if v else "trivial", iteration=3)) for i, v in enumerate(valid)]


@pytest.mark.unit
def test_the_budget_is_split_evenly_and_the_remainder_goes_first() -> None:
    assert budget_pairs(["a", "b", "c"], 8) == {"a": 3, "b": 3, "c": 2}
    assert budget_pairs(["a"], 8) == {"a": 8} and budget_pairs([], 8) == {}
    assert budget_pairs(["a", "b", "c"], 2) == {"a": 1, "b": 1, "c": 0}  # more envs than pairs: some wait
    specs = episode_specs(["a", "b"], {"a": 3, "b": 1}, 0, 0)
    assert len(specs) == 8 and sum(s.env_id == "a" for s in specs) == 6
    # the pairs an env plays under a budget are the first pairs it plays under --k: same seeds
    plain = {s.episode_id: s.seed for s in episode_specs(["a", "b"], 3, 0, 0, "key")}
    assert all(plain[s.episode_id] == s.seed for s in episode_specs(["a", "b"], {"a": 3, "b": 1}, 0, 0, "key"))


@pytest.mark.unit
def test_shards_split_the_budget_over_every_shards_envs(tmp_path: Path) -> None:
    from stages.rollout import load_envs

    path = tmp_path / "validated.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows([True] * 5)))
    whole, counts = load_envs([path], (0, 1))
    pairs = budget_pairs(list(counts["all_valid"]), 12)
    sharded = []
    for s in range(2):
        envs, c = load_envs([path], (s, 2))
        assert list(c["all_valid"]) == list(whole)  # every shard sees every valid env for the split
        sharded += episode_specs(list(envs), budget_pairs(list(c["all_valid"]), 12), 0, 3)
    assert sorted(x.episode_id for x in sharded) == sorted(x.episode_id for x in episode_specs(list(whole), pairs, 0, 3))
    assert len(sharded) == 24


@pytest.mark.integration
def test_rollout_plays_the_budget_whatever_the_number_of_valid_designs(tiny_model: Path, tmp_path: Path) -> None:
    common = ("--model", tiny_model, "--k", "2", "--max-turns", "1", "--max-tokens", "4", "--iteration", "3")
    counts = {}
    for name, valid in (("all", [True, True, True]), ("one_invalid", [True, False, True])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _rows(valid)))
        res = run_spade("rollout", "--envs", path, *common, "--budget-pairs", "6", "--out", tmp_path / f"r-{name}.jsonl")
        assert res.returncode == 0, res.stderr[-3000:]
        rows = [json.loads(x) for x in (tmp_path / f"r-{name}.jsonl").read_text().splitlines()]
        counts[name] = len(rows)
        per_env = {r["env_id"]: sum(1 for x in rows if x["env_id"] == r["env_id"]) for r in rows}
        assert set(per_env.values()) == ({4} if name == "all" else {6})  # 6 pairs over 3 or 2 envs
    assert counts == {"all": 12, "one_invalid": 12}  # the same budget: a short iteration plays more seeds
    manifest = json.loads((tmp_path / "r-all.jsonl.manifest.json").read_text())
    assert manifest["config"]["budget_pairs"] == 6
    res = run_spade("rollout", "--envs", tmp_path / "all.jsonl", *common, "--budget-pairs", "0", "--out", tmp_path / "x.jsonl")
    assert res.returncode == 2  # at least one pair
