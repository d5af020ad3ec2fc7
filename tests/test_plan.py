"""The loop's schedule (spade_cli/core/schedule.py) and its settings (spade_cli/core/run_settings.py), on
hand-computed expectations: which checkpoint samples each iteration, the evaluation points, ema_lp's
checkpoint before, replay and the fixed set, pools, shards, the server's loads, the run directory's
mode; and the settings' order (defaults < files < environment). The loops that run these plans are
tests/test_loop*.py and tests/test_pipeline.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spade_cli.core import run_settings as settings
from spade_cli.core import schedule
from spade_cli.core.errors import UsageError
from spade_cli.core.layout import RunLayout

RUN = RunLayout(Path("run"))


def _s(**env: str) -> dict:
    return settings.resolve({"MODEL": "base", "RUN": "run", **env}, files=[])


def _plan(i: int, done: set[str] = frozenset(), exists: set[str] = frozenset(), shard=None, **env: str) -> dict:
    return schedule.iteration(_s(**env), RUN, i, shard=shard, done=lambda p: p in done, exists=lambda p: p in exists)


def _opt(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_the_sampler_is_the_iterations_checkpoint_or_staleness_behind_it():
    assert [_opt(_plan(i)["rollout"], "--model") for i in range(3)] == ["base", "run/ckpt/iter_0001", "run/ckpt/iter_0002"]
    one = [_opt(_plan(i, PIPELINE="1")["rollout"], "--model") for i in range(4)]
    assert one == ["base", "base", "run/ckpt/iter_0001", "run/ckpt/iter_0002"]
    two = [_opt(_plan(i, PIPELINE="1", STALENESS="2")["rollout"], "--model") for i in range(4)]
    assert two == ["base", "base", "base", "run/ckpt/iter_0001"]
    # the update always trains the iteration's own checkpoint; pipelined, under the staleness bound
    upd = _plan(3, PIPELINE="1", STALENESS="2")["update"]
    assert _opt(upd, "--model") == "run/ckpt/iter_0003" and _opt(upd, "--out") == "run/ckpt/iter_0004"
    assert _opt(upd, "--max-staleness") == "2" and "--max-staleness" not in _plan(3)["update"]
    # a frozen Designer designs with MODEL while the Agent samples the checkpoint; it trains the Agent only
    frozen = _plan(2, FROZEN_DESIGNER="1")
    assert _opt(frozen["design"], "--model") == "base" and _opt(frozen["rollout"], "--model") == "run/ckpt/iter_0002"
    assert _opt(frozen["update"], "--designer-share") == "0" and "--designer-share" not in _plan(2)["update"]


def test_evaluation_points_are_the_model_every_eval_every_th_checkpoint_and_the_last():
    env = {"ITERS": "5", "EVAL_EVERY": "2"}
    seq = {i: _opt(_plan(i, **env)["eval"], "--model") for i in range(5)}
    assert seq == {0: None, 1: "run/ckpt/iter_0002", 2: None, 3: "run/ckpt/iter_0004", 4: "run/ckpt/iter_0005"}
    assert _opt(_plan(0, **env)["eval_model"], "--model") == "base" and _plan(1, **env)["eval_model"] == []
    assert _opt(_plan(3, **env)["eval"], "--out") == "run/eval/iter_0004.jsonl"
    # pipelined: checkpoint i beside update(i), as soon as update(i-1) wrote it; ITERS holds the last
    piped = {i: _opt(_plan(i, PIPELINE="1", **env)["eval"], "--model") for i in range(6)}
    assert piped == {0: "base", 1: None, 2: "run/ckpt/iter_0002", 3: None, 4: "run/ckpt/iter_0004",
                     5: "run/ckpt/iter_0005"}
    assert _plan(2, done={"run/eval/iter_0002.jsonl"}, PIPELINE="1", **env)["eval"] == []
    assert all(_plan(i, EVAL_EVERY="0")["eval"] == [] for i in range(3)) and _plan(0, EVAL_EVERY="0")["eval_model"] == []
    # the eval flags: lm: tasks get the Qwen3 sampling without the budgets
    assert "--think-tokens" in _plan(0)["eval_model"] and "--think-tokens" not in _plan(0, EVAL_TASKS="lm:x")["eval_model"]


def test_a_finished_iteration_runs_nothing_and_a_due_evaluation_keeps_it_open():
    ckpt1, eval1 = "run/ckpt/iter_0001", "run/eval/iter_0001.jsonl"
    done = _plan(0, done={ckpt1}, EVAL_EVERY="0")
    assert done["done"] == "1" and done["log"] == "iteration 0: done"
    assert all(done[n] == [] for n in schedule.NAMES)
    open_ = _plan(0, done={ckpt1}, ITERS="1", EVAL_EVERY="5")
    assert open_["done"] == "0" and open_["eval"] and open_["log"] == "iteration 0 (model: base)"
    assert _plan(0, done={ckpt1, eval1}, ITERS="1", EVAL_EVERY="5")["done"] == "1"
    # pipelined: generated (scores) and updated (checkpoint) separately
    piped = _plan(1, done={"run/iter_0001/scores.jsonl"}, PIPELINE="1")
    assert piped["design"] == [] and piped["log"] == "iteration 1: generated"
    assert piped["updated"] == "0" and piped["log_update"] == "update of iteration 1 (from run/ckpt/iter_0001)"
    updated = _plan(1, done={"run/ckpt/iter_0002"}, PIPELINE="1")
    assert updated["update"] == [] and updated["log_update"] == "update of iteration 1: done"
    assert updated["log"] == "iteration 1: generating with base" and updated["design"]


def test_ema_lp_plays_the_checkpoint_before_the_sampler_from_its_first_update_on():
    seq = [_opt(_plan(i, SIGNAL="ema_lp")["lp_rollout"], "--model") for i in range(3)]
    assert seq == [None, "base", "run/ckpt/iter_0001"]
    piped = [_opt(_plan(i, SIGNAL="ema_lp", PIPELINE="1")["lp_rollout"], "--model") for i in range(4)]
    assert piped == [None, None, "base", "run/ckpt/iter_0001"]
    p = _plan(2, SIGNAL="ema_lp")
    assert _opt(p["lp_rollout"], "--out") == "run/iter_0002/lp_before.jsonl"
    assert _opt(p["regret"], "--before-rollouts") == "run/iter_0002/lp_before.jsonl"
    assert _opt(p["lp_rollout"], "--seed") == _opt(p["rollout"], "--seed")  # the same seeds


def test_replays_and_the_fixed_set_are_played_beside_the_designs_and_never_scored():
    replay0, memory1 = "run/iter_0000/replay.jsonl", "run/memory/iter_0001.jsonl"
    p = _plan(1, exists={replay0, memory1}, REPLAY="3", EXTRA_ENVS="a.jsonl b.jsonl")
    assert p["rollout"][p["rollout"].index("--envs"):p["rollout"].index("--k")] == [
        "--envs", "run/iter_0001/validated.jsonl", "--envs", replay0, "--envs", "a.jsonl", "--envs", "b.jsonl"]
    regret = p["regret"]
    assert [regret[k + 1] for k, a in enumerate(regret) if a == "--played"] == [replay0, "a.jsonl", "b.jsonl"]
    assert _opt(regret, "--envs") == "run/iter_0001/validated.jsonl" and _opt(regret, "--memory") == memory1
    assert _opt(regret, "--replay") == "3" and _opt(regret, "--replay-out") == "run/iter_0001/replay.jsonl"
    assert _opt(regret, "--memory-out") == "run/memory/iter_0002.jsonl"
    # the memory reaches design and validate once it exists, and never a pool
    assert _opt(p["design"], "--memory") == memory1 and _opt(p["validate"], "--memory") == memory1
    pool = _plan(1, exists={memory1}, POOL="bundled")
    assert pool["design"][:4] == ["spade", "design", "--pool", "bundled"] and "--memory" not in pool["validate"]
    assert "--memory" not in _plan(1, exists={memory1}, MEMORY="0")["design"]
    assert "--no-grounding" in _plan(0, GROUNDING="0")["design"] and _opt(_plan(0, CORPUS="c")["design"], "--corpus") == "c"


def test_the_budget_is_n_envs_times_k_unless_blank():
    assert _opt(_plan(0, N_ENVS="6", K="3")["rollout"], "--budget-pairs") == "18"
    assert "--budget-pairs" not in _plan(0, BUDGET_PAIRS="")["rollout"]


def test_a_shard_plays_its_part_and_regret_and_update_read_every_shard():
    p = _plan(1, shard=(2, 4))
    assert _opt(p["rollout"], "--shard") == "2/4"
    assert _opt(p["rollout"], "--out") == "run/iter_0001/rollouts.shard-02-of-04.jsonl"
    glob = "run/iter_0001/rollouts.shard-*-of-04.jsonl"
    assert _opt(p["regret"], "--rollouts") == glob and _opt(p["update"], "--rollouts") == glob
    waiting = _plan(1, done={"run/iter_0001/rollouts.shard-00-of-02.jsonl"}, ROLLOUT_SHARDS="2")
    assert waiting["rollout"] == [] and "(1 done)" in waiting["wait_shards"]
    assert _plan(1, done={f"run/iter_0001/rollouts.shard-0{k}-of-02.jsonl" for k in (0, 1)},
                 ROLLOUT_SHARDS="2")["wait_shards"] == ""


def test_one_engine_loads_what_a_stage_samples_while_it_has_work_and_sleeps_for_the_update():
    p = _plan(1, ENGINE="serve", SERVE_PORT="8100")
    assert _opt(p["before_rollout"], "--model") == "run/ckpt/iter_0001" and _opt(p["before_rollout"], "--port") == "8100"
    assert _opt(p["rollout"], "--backend") == "openai" and _opt(p["rollout"], "--base-url") == "http://127.0.0.1:8100/v1"
    assert _opt(p["before_update"], "--do") == "sleep" and _opt(p["before_update"], "--level") == "2"
    assert _plan(1, done={"run/iter_0001/rollouts.jsonl"}, ENGINE="serve")["before_rollout"] == []
    assert _plan(1)["before_rollout"] == []  # no server: each stage loads its own backend
    piped = _plan(1, ENGINE="serve", PIPELINE="1", GEN_DEVICES="0,1", TRAIN_DEVICES="2")
    assert "--no-sleep-mode" in piped["before_rollout"] and piped["before_update"] == []
    assert piped["rollout"][:2] == ["env", "CUDA_VISIBLE_DEVICES=0,1"]
    assert piped["update"][:3] == ["env", "CUDA_VISIBLE_DEVICES=2", "spade"]


def test_retention_follows_each_update():
    assert _plan(3, EVAL_EVERY="5", PRUNE_ARGS="--keep-ckpts 3")["prune"] == [
        "spade", "prune", "run", "-i", "3", "--eval-every", "5", "--keep-ckpts", "3"]
    assert _plan(3, PRUNE="0")["prune"] == []


def test_settings_are_the_defaults_then_the_files_then_the_environment(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text('n_envs = 6\nk = 3\ndesign_args = ["--max-tokens", "6"]\n')
    arm = tmp_path / "arm.env"
    arm.write_text('base = "base.toml"\nsignal = "ema_lp"\ngrounding = false\nk = 5\n')
    s = settings.resolve({"MODEL": "m", "CONFIG": str(arm), "N_ENVS": "7"})
    assert (s["n_envs"], s["k"], s["signal"], s["grounding"]) == (7, 5, "ema_lp", False)
    assert s["design_args"] == "--max-tokens 6" and s["budget_pairs"] == "35"
    assert s["iters"] == 400 and "--thinking" in settings.resolve({})["design_args"]
    assert settings.resolve({"DESIGN_ARGS": ""})["design_args"] == ""  # blank counts where it means "none"
    assert settings.resolve({"BACKEND": ""})["backend"] == "hf"        # elsewhere it is the default
    assert settings.resolve({"UPDATE_CMD": ""})["update_cmd"] == "spade"
    rec = settings.recorded(s)
    assert rec["GROUNDING"] == "0" and rec["N_ENVS"] == "7" and "RUN" not in rec and "SERVE_PORT" not in rec
    for env, says in [({"PIPELINE": "2"}, "PIPELINE must be 0 or 1, got '2'"), ({"K": "x"}, "K must be a whole number"),
                      ({"STALENESS": "0"}, "STALENESS must be a whole number >= 1"),
                      ({"BACKEND": "tgi"}, "BACKEND must be hf or vllm or openai")]:
        with pytest.raises(UsageError, match=says):
            settings.resolve(env)
    (tmp_path / "bad.toml").write_text("nenvs = 3\n")
    with pytest.raises(UsageError, match="unknown key 'nenvs'"):
        settings.resolve({}, files=[tmp_path / "bad.toml"])


def test_a_run_directory_holds_one_loop_mode(tmp_path):
    layout = RunLayout(tmp_path / "run")
    assert schedule.check_mode(_s(PIPELINE="1", STALENESS="2"), layout) == "pipelined 2"
    assert layout.loop_mode.read_text() == "pipelined 2\n"
    with pytest.raises(UsageError, match="made by the pipelined 2 loop and this is the sequential one"):
        schedule.check_mode(_s(), layout)
    old = RunLayout(tmp_path / "old")
    (old.root / "iter_0000").mkdir(parents=True)
    with pytest.raises(UsageError, match="made by the sequential loop"):
        schedule.check_mode(_s(PIPELINE="1"), old)
    assert not old.loop_mode.exists()


def test_the_pipelined_lanes_on_one_machine_never_share_the_servers_devices():
    serve = {"ENGINE": "serve", "PIPELINE": "1"}
    schedule.check_lanes(_s(**serve), [])  # the CPU
    schedule.check_lanes(_s(**serve, GEN_DEVICES="0,1", TRAIN_DEVICES="2,3"), ["0", "1", "2", "3"])
    for env, gpus, says in [({}, ["0", "1", "2", "3"], "GEN_DEVICES=0,1 TRAIN_DEVICES=2,3"),
                            ({"GEN_DEVICES": "0,1,2", "TRAIN_DEVICES": "2,3"}, ["0", "1", "2", "3"], "both have 2"),
                            ({}, ["0"], "run ENGINE=serve sequentially")]:
        with pytest.raises(UsageError, match=says):
            schedule.check_lanes(_s(**serve, **env), gpus)
    with pytest.raises(UsageError, match="a rollout array is"):
        schedule.check_lanes(_s(PIPELINE="1", ROLLOUT_SHARDS="2"), [])


def test_the_command_renders_bash_arrays_that_eval_back_to_the_same_argv(tmp_path):
    env = {**os.environ, "MODEL": "my model", "RUN": str(tmp_path / "run"), "DESIGN_ARGS": "--x 'a b'"}
    script = (f'eval "$({sys.executable} -m spade_cli plan -i 0 --shell)"; '
              'printf "%s\\n" "${design[@]}"; echo "done=$done"')
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    as_json = json.loads(subprocess.run([sys.executable, "-m", "spade_cli", "plan", "-i", "0", "--json"], env=env,
                                        capture_output=True, text=True, timeout=120).stdout)
    assert lines[:-1] == as_json["design"] and lines[-1] == "done=0"
    assert _opt(as_json["design"], "--model") == "my model" and as_json["design"][-2:] == ["--x", "a b"]
