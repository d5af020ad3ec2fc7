"""The design-space experiments at smoke size: gate, steering (two arms) and outcome (two arms)
through their real recipes on the tiny model, then the summaries (docs/curriculum.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_spade

pytestmark = pytest.mark.slow
TINY = {"SIZE": "tiny", "WARM_EPOCHS": "1", "SOLVER_SEEDS": "1", "MAX_TURNS": "2", "K": "1", "PROBE_K": "1",
        "SPADE_THREADS": "1"}


def _recipe(name: str, root: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("POOL", "SIGNAL", "CONFIG", "MODEL", "RUN")}
    environ.update({"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "ROOT": str(root),
                    **TINY, **env})
    res = subprocess.run(["bash", str(REPO / "recipes" / "curriculum" / name)], env=environ,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _space_env(name: str) -> str:
    """A variable of recipes/curriculum/space.env, as the recipes source it."""
    res = subprocess.run(["bash", "-c", f'source recipes/curriculum/space.env && printf %s "${name}"'],
                         capture_output=True, text=True, cwd=REPO, check=True)
    return res.stdout


def _summarize(mode: str, root: Path) -> str:
    res = subprocess.run([sys.executable, str(REPO / "recipes" / "curriculum" / "summarize.py"), mode, str(root)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_gate_steering_and_outcome_run_and_resume(tmp_path):
    root = tmp_path / "cur"
    _recipe("gate.sh", root, LEARN_ITERS="1")
    for probe in ("probe_warm", "probe_learned"):
        rows = (root / "seed0" / probe / "scores.jsonl").read_text().splitlines()
        assert len(rows) == 30  # one env per cell of the grid
    gate = _summarize("gate", root)
    assert "gate:" in gate and "(held out)" in gate
    assert "failed_trainable" in json.loads((root / "summary_gate.json").read_text())["seed0"]

    # three iterations of the regret arm, so the loop's retention prunes checkpoint 1 (the probe below)
    for arm, iters in (("regret", "3"), ("shuffled", "2"), ("pooled", "1")):
        _recipe("steering.sh", root, ARMS=arm, SEEDS="0", ITERS=iters, N_ENVS="4")
    shuffled = [json.loads(line) for line in
                (root / "seed0" / "steering" / "shuffled" / "iter_0000" / "scores.jsonl").read_text().splitlines()]
    earned = [r for r in shuffled if r.get("note") is None]
    assert all("designer_reward_earned" in r for r in earned)
    pooled = root / "seed0" / "steering" / "pooled" / "iter_0000" / "scores.jsonl"
    assert json.loads(pooled.with_name("scores.jsonl.manifest.json").read_text())["config"]["pool_cells"] == [
        "rule", "level"]
    assert all("cell" in json.loads(r) for r in pooled.read_text().splitlines() if json.loads(r).get("note") is None)
    table = _summarize("steering", root)
    assert "| regret | 1 |" in table and "| shuffled | 1 |" in table and "regret arm minus shuffled" in table
    assert "| pooled | 1 |" in table and "pooled arm minus shuffled, paired by seed" in table
    # the one-seed reading, over the designs: every pair of arms that ran on the seed
    by_design = json.loads((root / "summary_steering.json").read_text())["designs"]["seed0"]
    assert set(by_design) == {"regret_minus_shuffled", "pooled_minus_shuffled", "pooled_minus_regret"}
    assert "seed0: true regret of the last 3 iterations' valid designs, pooled minus regret" in table
    fits = json.loads((root / "summary_steering.json").read_text())["pooled"]["reward_fit"]
    assert "paid reward vs true regret, r" in table and [f["seed"] for f in fits] == ["seed0"]
    again = _recipe("steering.sh", root, ARMS="regret", SEEDS="0", ITERS="3", N_ENVS="4")  # finished: all up to date
    assert "up to date" in again.stderr

    # every Designer checkpoint of the regret arm on one fixed prompt set, played by the frozen Agent
    run = root / "seed0" / "steering" / "regret"
    probe = {"RUN": str(run), "MODEL": str(root / "seed0" / "model" / "warm"), "N": "4", "K": "1",
             "DESIGN_ARGS": _space_env("SPEC_DESIGN_ARGS"), "ROLLOUT_ARGS": "--max-tokens 16"}
    def probed() -> list[str]:
        return sorted(p.name for p in (run / "designer_probe").iterdir())

    _recipe("../designer_probe.sh", root, EVERY="5", **probe)
    assert probed() == ["iter_0000", "iter_0003"]  # the first and the last
    # every checkpoint: 2 is added, 1 is skipped since retention pruned its weights
    assert (run / "ckpt" / "iter_0001" / "pruned.json").exists() and (run / "ckpt" / "iter_0002").is_dir()
    _recipe("../designer_probe.sh", root, **probe)
    assert probed() == ["iter_0000", "iter_0002", "iter_0003"]
    assert "up to date" in _recipe("../designer_probe.sh", root, **probe).stderr
    prompts = [[r["messages"] for r in map(json.loads, (run / "designer_probe" / f"iter_{i:04d}" / "designs.jsonl")
                                           .read_text().splitlines())] for i in (0, 2, 3)]
    assert prompts[0] == prompts[1] == prompts[2]  # the same prompts for the start and each checkpoint
    assert "Environment memory:" not in json.dumps(prompts[0])  # no memory: the prompts of no iteration of the run
    res = run_spade("report", run)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "report" / "iterations.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "probe_valid_rate" in r] == [0, 2, 3]
    assert (run / "report" / "designer_probe.png").exists()

    _recipe("outcome.sh", root, ARMS="spade space_pool", SEEDS="0", ITERS="1", N_ENVS="4", EVAL_K="1")
    compare = root / "outcome" / "compare"
    assert compare.is_dir() and any(compare.iterdir())
    # the held-out suite is exactly the held-out cells, which no arm played
    suite = [json.loads(line) for line in (root / "heldout" / "validated.jsonl").read_text().splitlines()]
    held = {(r["spec"]["rule"], r["spec"]["level"]) for r in suite}
    for arm in ("spade", "space_pool"):
        # the warm start never saw a corpus document: no arm's Designer prompt may hold one (a value
        # for every arm comes from outcome.toml, since experiment.sh takes arm settings from files only)
        cell = root / "outcome" / arm / "seed_0"
        assert json.loads((cell / "settings.json").read_text())["GROUNDING"] == "0", arm
        if arm == "spade":  # the pool arm's designs come from the pool, no prompt involved
            designs = list(cell.glob("iter_*/designs.jsonl.manifest.json"))
            assert designs and all(json.loads(p.read_text())["config"]["grounding"] is False for p in designs)
        for path in cell.glob("iter_*/validated.jsonl"):
            played = {(r["spec"]["rule"], r["spec"]["level"]) for r in map(json.loads, path.read_text().splitlines())
                      if r.get("spec")}
            assert not played & held, (arm, played & held)
