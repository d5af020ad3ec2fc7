"""Retention: `spade prune` on a synthetic run (which checkpoint and state goes, which stays and why),
and recipes/loop.sh with its defaults over 5 iterations of the tiny model, killed and rerun."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import run_spade


def _ckpt(run: Path, j: int, updates: int | None = None, published: bool = True) -> Path:
    ck = run / "ckpt" / f"iter_{j:04d}"
    (ck / "trainer_state").mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(b"w" * 100)
    (ck / "config.json").write_text("{}")
    (ck / "update.json").write_text("{}")
    (ck / "trainer_state" / "optimizer.bin").write_bytes(b"s" * 600)
    (ck / "trainer_state" / "spade_state.json").write_text(json.dumps({"format": 1, "updates": updates or j}))
    if published:
        Path(f"{ck}.manifest.json").write_text("{}")
    return ck


def _whole(ck: Path) -> bool:
    return (ck / "model.safetensors").exists()


def _state(ck: Path) -> bool:
    return (ck / "trainer_state" / "optimizer.bin").exists()


@pytest.mark.unit
def test_retention_keeps_the_latest_the_recent_the_eval_points_and_what_pending_stages_read(tmp_path: Path) -> None:
    from stages.prune import prune

    run = tmp_path / "run"
    cks = {j: _ckpt(run, j) for j in range(1, 9)}
    # iteration 7's update wrote ckpt 8; keep 2 back, eval every 3, every 4th state
    dry = prune(run, 7, keep_ckpts=2, keep_state_every=4, eval_every=3, dry_run=True)
    assert dry["status"] == "dry run" and all(_whole(c) and _state(c) for c in cks.values())
    out = prune(run, 7, keep_ckpts=2, keep_state_every=4, eval_every=3)
    assert out == {**dry, "status": "ok", "freed_bytes": out["freed_bytes"]}
    assert [j for j, c in cks.items() if _whole(c)] == [3, 6, 7, 8]  # eval points 3, 6; recent 7, 8
    assert [j for j, c in cks.items() if _state(c)] == [4, 8]  # every 4th, and the latest
    assert out["kept"][str(cks[3])] == "eval point" and out["kept"][str(cks[7])] == "recent"
    assert out["freed_bytes"] == 4 * 100 + 6 * 600
    assert json.loads((cks[1] / "pruned.json").read_text())["pruned"] == ["model.safetensors"]
    assert (cks[1] / "update.json").exists() and Path(f"{cks[1]}.manifest.json").exists()
    meta = json.loads((cks[5] / "trainer_state" / "spade_state.json").read_text())
    assert meta["pruned"] is True and meta["updates"] == 5  # a resume from it names the pruning
    again = prune(run, 7, keep_ckpts=2, keep_state_every=4, eval_every=3)
    assert again["states"] == [] and again["checkpoints"] == [] and again["freed_bytes"] == 0


@pytest.mark.unit
def test_a_checkpoint_an_unfinished_update_reads_is_never_pruned(tmp_path: Path) -> None:
    """Iteration 4's update (ckpt 5) is not published: ckpt 4 (its --model) and ckpt 3 (a pipelined
    loop samples iteration 4 from it) keep weights and state whatever the retention says."""
    from stages.prune import prune

    run = tmp_path / "run"
    cks = {j: _ckpt(run, j) for j in range(1, 5)}
    _ckpt(run, 5, published=False)
    assert prune(run, 4)["status"] == "nothing to do"  # ckpt 5 is not published
    prune(run, 3, keep_ckpts=1)
    assert [j for j, c in cks.items() if _whole(c)] == [3, 4]
    assert [j for j, c in cks.items() if _state(c)] == [4]
    with pytest.raises(Exception, match="keep-ckpts"):
        prune(run, 3, keep_ckpts=0)


@pytest.mark.integration
@pytest.mark.slow  # five loop iterations, then a kill and a rerun: CI's second tier
def test_a_five_iteration_loop_ends_with_one_trainer_state_and_the_kept_checkpoints(tiny_model, tmp_path):
    """The loop with its retention defaults (no PRUNE* set) from a checkpoint that carries a trainer
    state (one real update of the tiny model). The tiny model designs nothing valid and earns no
    return, so each iteration's update publishes its input unchanged, state included (hard links):
    every checkpoint holds a trainer state until retention removes all but the latest."""
    from stages import update
    from tests.test_loop import _env, _finish, _log, _loop
    from tests.test_update import _config, make_artifacts

    start = tmp_path / "start"
    update.run(_config(make_artifacts(tmp_path, tiny_model), tiny_model, start))
    env = {**_env(start, {}), "ITERS": "5"}
    cwd = tmp_path / "w"
    proc = _loop(cwd, env)
    ck = cwd / "run" / "ckpt"
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None and not Path(f"{ck}/iter_0004.manifest.json").exists():
        time.sleep(0.05)
    assert proc.poll() is None, _log(cwd)[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)  # right after iteration 3's update: before or during its prune
    proc.wait()
    err = _finish(_loop(cwd, env), cwd)
    assert "iteration 0: done" in err and "iteration 3: done" in err
    whole = sorted(p.name for p in ck.iterdir() if p.is_dir() and (p / "model.safetensors").exists())
    states = sorted(p.name for p in ck.iterdir() if (p / "trainer_state" / "model.safetensors").exists())
    assert whole == ["iter_0004", "iter_0005"] and states == ["iter_0005"], (whole, states)
    assert sorted(p.parent.name for p in ck.glob("iter_*/pruned.json")) == ["iter_0001", "iter_0002", "iter_0003"]
    assert all(json.loads((ck / f"iter_{j:04d}" / "trainer_state" / "spade_state.json").read_text())["pruned"]
               for j in range(1, 5))
    # the report still reads every update; the latest state is whole and the next update resumes it
    assert all((ck / f"iter_{j:04d}" / "update.json").exists() for j in range(1, 6))
    assert (start / "trainer_state" / "optimizer.bin").exists()  # the run's input is never touched
    res = run_spade("prune", cwd / "run", "-i", "4")
    assert res.returncode == 0 and json.loads(res.stdout)["checkpoints"] == []
    from spade_cli.training import trainer_state

    assert not trainer_state.find(str(ck / "iter_0005")).get("pruned")
