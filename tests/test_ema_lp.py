"""The ema_lp arm's signal: with the previous checkpoint's rollouts of the same envs on the same
seeds (``--before-rollouts``), an env new this iteration has learning progress; without them every
valid design scores 0 (docs/regret.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spade_cli.core.records import Validation, to_row
from tests.conftest import run_spade

pytestmark = pytest.mark.integration


def _env(name: str, code: str | None = None, iteration: int = 1) -> dict:
    code = code or f"class {name}(gym.Env):\n    pass\n"
    return to_row(Validation(code=code, hint=f"hint for {name}", title=name, group_id="g0", valid=True,
                             iteration=iteration))


def _episode(env_id: str, hinted: bool, pair: int, ret: float) -> dict:
    return {"schema": "spade.rollout/1", "episode_id": f"{env_id}-{int(hinted)}-{pair}", "env_id": env_id,
            "iteration": 1, "hinted": hinted, "seed": 100 + pair, "pair": pair,
            "messages": [{"role": "user", "content": "play"}], "turns": [], "return": ret,
            "terminated": True, "truncated": False, "error": None}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rewards(path: Path) -> dict[str, float]:
    return {r["env_id"]: r["designer_reward"] for r in map(json.loads, path.read_text().splitlines())}


def test_before_rollouts_give_new_envs_learning_progress(tmp_path: Path) -> None:
    envs = [_env(n) for n in ("Learned", "Forgotten", "Solved", "Unsolved")]
    ids = [e["env_id"] for e in envs]
    now = {ids[0]: 1.0, ids[1]: 0.0, ids[2]: 1.0, ids[3]: 0.0}     # unhinted success this iteration
    before = {ids[0]: 0.0, ids[1]: 1.0, ids[2]: 1.0, ids[3]: 0.0}  # the previous checkpoint's
    v = _write(tmp_path / "validated.jsonl", envs)
    r = _write(tmp_path / "rollouts.jsonl", [_episode(e, h, p, now[e]) for e in ids for h in (False, True) for p in range(4)])
    b = _write(tmp_path / "lp_before.jsonl", [_episode(e, h, p, before[e]) for e in ids for h in (False, True) for p in range(4)])
    base = ("regret", "--envs", v, "--rollouts", r, "--signal", "ema_lp", "--embedding", "tfidf", "--no-seed-audit")
    res = run_spade(*base, "--out", tmp_path / "flat.jsonl")
    assert res.returncode == 0, res.stderr
    assert set(_rewards(tmp_path / "flat.jsonl").values()) == {0.0}  # one observation: no progress, every design alike
    res = run_spade(*base, "--before-rollouts", b, "--out", tmp_path / "lp.jsonl")
    assert res.returncode == 0, res.stderr
    got = _rewards(tmp_path / "lp.jsonl")
    # [0, 1] and [1, 0]: the Agent's last update changed them; [1, 1] and [0, 0]: it did not
    assert got[ids[0]] > 0.4 and got[ids[1]] > 0.01 and got[ids[2]] == got[ids[3]] == 0.0
    rows = [json.loads(x) for x in (tmp_path / "lp.jsonl").read_text().splitlines()]
    assert [x["before_success"] for x in rows] == [0.0, 1.0, 1.0, 0.0]
    manifest = json.loads((tmp_path / "lp.jsonl.manifest.json").read_text())
    assert manifest["inputs"]["before_rollouts"][0]["path"].endswith("lp_before.jsonl")
    # the before rollouts feed ema_lp only
    res = run_spade("regret", "--envs", v, "--rollouts", r, "--before-rollouts", b, "--out", tmp_path / "x.jsonl",
                    "--embedding", "tfidf", "--no-seed-audit")
    assert res.returncode != 0 and "--signal ema_lp" in res.stderr


def test_an_env_with_its_own_history_keeps_it(tmp_path: Path) -> None:
    env = _env("Old")
    eid = env["env_id"]
    memory = _write(tmp_path / "memory.jsonl", [{"schema": "spade.memory/1", "env_id": eid, "title": "Old",
                                                 "hint": "h", "history": [{"iteration": 0, "unhinted_success": 1.0}]}])
    v = _write(tmp_path / "validated.jsonl", [env])
    r = _write(tmp_path / "rollouts.jsonl", [_episode(eid, h, p, 1.0) for h in (False, True) for p in range(2)])
    b = _write(tmp_path / "before.jsonl", [_episode(eid, h, p, 0.0) for h in (False, True) for p in range(2)])
    res = run_spade("regret", "--envs", v, "--rollouts", r, "--before-rollouts", b, "--memory", memory,
                    "--signal", "ema_lp", "--out", tmp_path / "s.jsonl", "--embedding", "tfidf", "--no-seed-audit")
    assert res.returncode == 0, res.stderr
    assert _rewards(tmp_path / "s.jsonl")[eid] == 0.0  # history [1, 1]: the "before" figure does not jump in


# Envs whose success depends on the reply only, in different ways: two random checkpoints succeed on
# them at different rates, as an Agent before and after an update would.
PARITY = '''import gymnasium as gym


class Parity{m}{r}(gym.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Reply with anything.", {{}}

    def step(self, action):
        return "done", float(len(action) % {m} == {r}), True, False, {{}}
'''


@pytest.mark.slow  # two rollouts of the tiny model, a second tiny model built
def test_a_small_cpu_run_gives_valid_designs_a_spread_of_rewards(tiny_model: Path, tmp_path: Path) -> None:
    from spade_cli.models import tinymodel

    other = tmp_path / "before_model"
    tinymodel.build(other, size="tiny", seed=1)
    envs = [_env(f"Parity{m}{r}", PARITY.format(m=m, r=r)) for m, r in ((2, 0), (2, 1), (3, 0), (3, 1), (4, 2))]
    v = _write(tmp_path / "validated.jsonl", envs)
    common = ("--envs", v, "--k", "4", "--max-turns", "1", "--iteration", "1", "--seed", "0",
              "--max-tokens", "8", "--temperature", "1.0")
    for model, out in ((tiny_model, "rollouts.jsonl"), (other, "lp_before.jsonl")):
        res = run_spade("rollout", "--model", model, *common, "--out", tmp_path / out, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
    seeds = [{(r["env_id"], r["pair"]): r["seed"] for r in map(json.loads, (tmp_path / f).read_text().splitlines())}
             for f in ("rollouts.jsonl", "lp_before.jsonl")]
    assert seeds[0] == seeds[1]  # the same envs on the same seeds
    base = ("regret", "--envs", v, "--rollouts", tmp_path / "rollouts.jsonl", "--signal", "ema_lp",
            "--embedding", "tfidf", "--no-seed-audit")
    assert run_spade(*base, "--out", tmp_path / "flat.jsonl").returncode == 0
    assert set(_rewards(tmp_path / "flat.jsonl").values()) == {0.0}
    res = run_spade(*base, "--before-rollouts", tmp_path / "lp_before.jsonl", "--out", tmp_path / "lp.jsonl")
    assert res.returncode == 0, res.stderr
    rewards = list(_rewards(tmp_path / "lp.jsonl").values())
    assert len(set(rewards)) >= 2 and max(rewards) > 0.0, rewards
