"""The pipelined loop (``PIPELINE=1 bash recipes/loop.sh``, docs/pipeline.md) on CPU with the tiny model,
3 iterations: what it samples with, what its updates record, and exact restart.

The Designer (the tiny model) writes nothing valid, so its samples carry no signal; the Agent also
plays a hand-written env whose return is the vowel count of its reply (EXTRA_ENVS), so random text
gets spread returns and the updates train. Checked on an uninterrupted run:

- iteration i's rollout manifest names the checkpoint that played it: the model for iterations 0
  and 1, ``ckpt/iter_0001`` for iteration 2 (iteration i+1 samples from checkpoint i);
- each update.json says which checkpoint drew its samples and how far behind: 0 for update(0),
  1 after; the sampler correction of a stale update sees real log-prob differences (on-policy, the
  trainer and the sampler agree to rounding); `spade report` has the column;
- a rerun of the finished run starts no stage and changes no file; the sequential loop refuses it.

And beside it, a run killed with SIGKILL at stage boundaries of both lanes (and once stopped with
SIGTERM while the update and the generation both run: exit 75, both stopped), then rerun, ends with
the same artifacts.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.test_loop import (
    _env,
    _exists,
    _finish,
    _killed_at,
    _log,
    _loop,
    _stage_running,
    same_artifacts,
)

VOWELS = '''
import gymnasium as gym

class Vowels(gym.Env):
    """Say something; the more vowels, the better."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Say a word with many vowels.", {}

    def step(self, action):
        n = sum(c in "aeiouAEIOU" for c in action)
        return "thanks", min(1.0, n / 4), True, False, {}
'''

I1, I2 = "run/iter_0001", "run/iter_0002"
MID_UPDATE_1 = _stage_running("update", "run/ckpt/iter_0002")
KILLS = {  # in the order the pipelined loop reaches them: generation of i+1 beside update(i)
    "quick": [_exists(f"{I1}/rollouts.jsonl.manifest.json"), MID_UPDATE_1],
    "all": [_exists(f"{I1}/designs.jsonl.manifest.json"), _exists(f"{I1}/rollouts.jsonl.manifest.json"),
            _exists(f"{I1}/scores.jsonl.manifest.json"), _exists("run/ckpt/iter_0001.manifest.json"), MID_UPDATE_1,
            _exists(f"{I2}/validated.jsonl.manifest.json"), _exists(f"{I2}/scores.jsonl.manifest.json"),
            _stage_running("update", "run/ckpt/iter_0003")],
}


def _pipelined_env(tiny_model: Path, cwd: Path) -> dict:
    cwd.mkdir(parents=True, exist_ok=True)
    row = {"schema": "spade.validation/1", "code": VOWELS, "hint": "Vowels are a, e, i, o and u.", "valid": True,
           "reason": None, "title": "vowels"}
    (cwd / "vowels.jsonl").write_text(json.dumps(row) + "\n")
    return {**_env(tiny_model, {}), "PIPELINE": "1", "ITERS": "3", "EXTRA_ENVS": str(cwd / "vowels.jsonl")}


def _group(pgid: int) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                out.append(int(pid))
        except (OSError, IndexError):
            continue
    return out


def _terminated_mid_update(cwd: Path, env: dict) -> None:
    """SIGTERM to the loop's shell once update(1) and the generation of iteration 2 both run."""
    proc = _loop(cwd, env)
    design_2 = _stage_running("design", f"{I2}/designs.jsonl", for_s=0.5)
    rollout_2 = _stage_running("rollout", f"{I2}/rollouts.jsonl", for_s=0.5)
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if MID_UPDATE_1(cwd, proc.pid) and (design_2(cwd, proc.pid) or rollout_2(cwd, proc.pid)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the loop ended before update(1) and generation(2) ran together: " + _log(cwd)[-3000:]
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=600) == 75, _log(cwd)[-3000:]
    assert "stopped at a unit boundary" in _log(cwd)
    assert _group(proc.pid) == [], "a stage outlived the loop"


def _check_the_run(cwd: Path, tiny_model: Path) -> None:
    run = cwd / "run"
    sampler = {i: json.loads((run / f"iter_000{i}" / "rollouts.jsonl.manifest.json").read_text())["config"]["model"]
               for i in range(3)}
    assert sampler == {0: str(tiny_model), 1: str(tiny_model), 2: "run/ckpt/iter_0001"}
    upd = {c: json.loads((run / "ckpt" / f"iter_000{c}" / "update.json").read_text()) for c in (1, 2, 3)}
    # updates 0 and 1 train (the vowel env spreads the returns; update 2's pair happens to tie)
    assert [upd[c].get("unchanged") for c in (1, 2)] == [None, None]
    assert [u["staleness"]["behind"] for u in upd.values()] == [0, 1, 1]
    assert [u["staleness"]["agent"]["sampled_by"][0]["model"] for u in upd.values()] == \
        [str(tiny_model), str(tiny_model), "run/ckpt/iter_0001"]
    manifest = json.loads((run / "ckpt" / "iter_0003.manifest.json").read_text())
    assert manifest["staleness"]["behind"] == 1
    # on-policy the trainer and the sampler are one fp32 model; one update behind they are not
    on_policy = upd[1]["sampler"]["logp_diff_abs"]["mean"]
    stale = upd[2]["sampler"]
    assert stale["logp_diff_abs"]["mean"] > max(100 * on_policy, 1e-3), (stale, on_policy)
    assert stale["raw_ratio"]["max"] > stale["raw_ratio"]["min"], stale
    with open(run / "report" / "iterations.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["update.staleness.behind"] for r in rows] == ["0", "1", "1"]


@pytest.mark.integration
@pytest.mark.slow  # the 3-iteration loop twice or more: CI's second tier (.ci/run)
@pytest.mark.timeout(3000)  # "all": eight kills and reruns, one after the other
@pytest.mark.parametrize("kills", ["quick", "all"])
def test_the_pipelined_loop_samples_one_behind_and_resumes_to_the_artifacts_of_an_uninterrupted_run(
        tiny_model, tmp_path, kills):
    clean_dir, killed = tmp_path / "clean", tmp_path / "killed"
    env = _pipelined_env(tiny_model, clean_dir)
    _pipelined_env(tiny_model, killed)
    env_killed = {**env, "EXTRA_ENVS": str(killed / "vowels.jsonl")}
    clean = _loop(clean_dir, env)  # the reference runs beside the kills: two cores
    for probe in KILLS[kills]:
        _killed_at(killed, env_killed, probe)
        if probe is MID_UPDATE_1 and kills == "quick":
            _terminated_mid_update(killed, env_killed)
    err = _finish(_loop(killed, env_killed), killed)
    assert "iteration 0: generated" in err and "update of iteration 0: done" in err  # not redone
    _finish(clean, clean_dir)
    _check_the_run(clean_dir, tiny_model)

    same_artifacts(clean_dir, killed)
    assert not list(killed.rglob("*.partial-*")), "a finished run leaves no partial output"

    # a rerun of the finished run is up to date: no stage starts, no artifact changes
    stamps = {p: p.stat().st_mtime_ns for p in (killed / "run").rglob("*") if "report" not in p.parts}
    err = _finish(_loop(killed, env_killed), killed)
    for i in range(3):
        assert f"iteration {i}: generated" in err and f"update of iteration {i}: done" in err, err
    assert "generating with" not in err and "(from " not in err, err
    assert stamps == {p: p.stat().st_mtime_ns for p in (killed / "run").rglob("*") if "report" not in p.parts}
    # and the sequential loop refuses it
    proc = _loop(killed, {**env_killed, "PIPELINE": "0"})
    assert proc.wait(timeout=120) == 2 and "never mix" in _log(killed)

