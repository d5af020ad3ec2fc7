"""recipes/experiment.sh: arms x seeds of the loop in one directory, then `spade compare`.

The quick tests read the plan (DRY_RUN) and the refusals; the slow one runs 2 arms x 2 seeds x 2
iterations of the tiny model through the real recipe and reads the table and plots it wrote.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

RECIPE = REPO / "recipes" / "experiment.sh"
# the knobs of tests/test_loop.py, plus an eval of the starting model and of the final checkpoint
SMALL = {"ITERS": "2", "N_ENVS": "2", "GROUP": "2", "K": "2", "MAX_TURNS": "2", "EVAL_EVERY": "2",
         "EVAL_TASKS": "lm:spade_tiny_qa", "EVAL_LIMIT": "2", "EVAL_ARGS": "--max-tokens 4 --batch-size 2",
         "DESIGN_ARGS": "--max-tokens 6 --no-example --excerpt-chars 60 --memory-k 2",
         "ROLLOUT_ARGS": "--max-tokens 8", "UPDATE_ARGS": "--learning-rate 1e-3"}


def _experiment(cwd: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("POOL", "SIGNAL", "CELL", "CONFIG")}
    environ.update({"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "EXP": "exp", **env})
    return subprocess.run(["bash", str(RECIPE)], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration
def test_the_plan_is_arms_by_seeds_and_a_bad_arm_or_cell_is_refused(tmp_path):
    res = _experiment(tmp_path, DRY_RUN="1", ARMS="spade hand_curated static_pool ema_lp", SEEDS="3 7")
    assert res.returncode == 0, res.stderr
    cells = [line.split() for line in res.stdout.splitlines()]
    assert [c[:4] for c in cells] == [
        ["0", "spade", "3", "exp/spade/seed_3"], ["1", "spade", "7", "exp/spade/seed_7"],
        ["2", "hand_curated", "3", "exp/hand_curated/seed_3"], ["3", "hand_curated", "7", "exp/hand_curated/seed_7"],
        ["4", "static_pool", "3", "exp/static_pool/seed_3"], ["5", "static_pool", "7", "exp/static_pool/seed_7"],
        ["6", "ema_lp", "3", "exp/ema_lp/seed_3"], ["7", "ema_lp", "7", "exp/ema_lp/seed_7"]]
    assert [Path(c[4]).name for c in cells[1::2]] == ["loop.sh", "hand_curated.env", "static_pool.sh", "ema_lp.env"]
    one = _experiment(tmp_path, DRY_RUN="1", ARMS="spade hand_curated", SEEDS="0 1", CELL="2")
    assert one.returncode == 0 and one.stdout.split()[:3] == ["2", "hand_curated", "0"]
    bad = _experiment(tmp_path, DRY_RUN="1", ARMS="spade handcurated")
    assert bad.returncode == 2 and "unknown arm 'handcurated'" in bad.stderr and "hand_curated" in bad.stderr
    out = _experiment(tmp_path, DRY_RUN="1", ARMS="spade", SEEDS="0", CELL="1")
    assert out.returncode == 2 and "CELL=1" in out.stderr
    assert not (tmp_path / "exp").exists()  # a plan or a refusal writes nothing


# what each arm is meant to change, and nothing else (docs/report.md)
INTENDED = {"static_pool": {"POOL": "static:480"}, "hand_curated": {"POOL": "bundled"},
            "frozen_designer": {"FROZEN_DESIGNER": "1"}, "ema_lp": {"SIGNAL": "ema_lp"},
            "no_grounding": {"GROUNDING": "0"}, "no_memory": {"MEMORY": "0"}}


@pytest.mark.integration
def test_every_arm_reads_the_same_settings_and_differs_only_in_its_knob(tmp_path):
    res = _experiment(tmp_path, DRY_RUN="settings", ARMS="spade " + " ".join(INTENDED), SEEDS="0",
                      MODEL="org/model", CORPUS="my/corpus", N_ENVS="6")
    assert res.returncode == 0, res.stderr
    cells = {arm: json.loads((tmp_path / "exp" / arm / "seed_0" / "settings.json").read_text())
             for arm in ["spade", *INTENDED]}
    ref = cells["spade"]
    # the shared settings, the Qwen3 thinking defaults included, reach every arm
    assert ref["MODEL"] == "org/model" and ref["CORPUS"] == "my/corpus" and ref["N_ENVS"] == "6"
    assert "--thinking" in ref["DESIGN_ARGS"] and "--think-tokens" in ref["ROLLOUT_ARGS"]
    assert ref["SIGNAL"] == "regret" and ref["POOL"] == ""
    for arm, knobs in INTENDED.items():
        diff = {k: v for k, v in cells[arm].items() if ref.get(k) != v}
        assert diff == knobs, arm
        assert cells[arm].keys() == ref.keys()
    assert not list((tmp_path / "exp").rglob("*.jsonl"))  # settings only: nothing ran


@pytest.mark.integration
def test_an_arm_setting_for_every_arm_goes_in_the_config_file_not_the_environment(tmp_path):
    # in the environment it would override every arm's file: refused, naming the way that works
    stray = _experiment(tmp_path, DRY_RUN="1", ARMS="spade no_memory", SEEDS="0", GROUNDING="0")
    assert stray.returncode == 2 and "GROUNDING=0" in stray.stderr and "CONFIG" in stray.stderr, stray.stderr
    assert not (tmp_path / "exp").exists()
    (tmp_path / "exp.toml").write_text("grounding = false\n")
    res = _experiment(tmp_path, DRY_RUN="settings", ARMS="spade no_memory", SEEDS="0", MODEL="org/model",
                      CONFIG="exp.toml")
    assert res.returncode == 0, res.stderr
    cells = {arm: json.loads((tmp_path / "exp" / arm / "seed_0" / "settings.json").read_text())
             for arm in ("spade", "no_memory")}
    assert cells["spade"]["GROUNDING"] == cells["no_memory"]["GROUNDING"] == "0"
    assert (cells["spade"]["MEMORY"], cells["no_memory"]["MEMORY"]) == ("1", "0")  # the arm's file still wins


@pytest.mark.integration
def test_the_static_pool_is_designed_with_the_main_arms_settings(tmp_path):
    """static_pool.sh through a stand-in `spade` that records its calls: the pool's design gets the
    loop's corpus, Qwen3 thinking and sampling flags, group and backend."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "spade"
    fake.write_text(f"""#!/usr/bin/env bash
[[ "$1" == plan ]] && exec spade "$@"  # the schedule is the real one's
echo "$*" >> {log}
out=""
while (($#)); do [[ "$1" == --out ]] && out="$2"; shift; done
[[ "$out" == *validated.jsonl ]] && echo '{{"valid": true}}' > "$out"
exit 0
""")
    fake.chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if k not in ("POOL", "SIGNAL", "CONFIG", "DESIGN_ARGS")},
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "SPADE": str(fake), "MODEL": "org/m",
           "CORPUS": "my/corpus", "GROUP": "3", "ITERS": "0", "POOL_SIZE": "6", "BACKEND": "openai",
           "BASE_URL": "http://127.0.0.1:9", "VALIDATE_ARGS": "--max-env-steps 8", "RUN": str(tmp_path / "run")}
    res = subprocess.run(["bash", str(REPO / "recipes" / "baselines" / "static_pool.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = log.read_text().splitlines()
    design = next(c for c in calls if c.startswith("design "))
    for flag in ("--model org/m", "--group 3", "--backend openai", "--base-url http://127.0.0.1:9",
                 "--corpus my/corpus", "--n 6", "--thinking", "--temperature 0.6", "--top-p 0.95",
                 "--think-tokens 4096"):
        assert flag in design, (flag, design)
    assert next(c for c in calls if c.startswith("validate ")).endswith("--max-env-steps 8")
    assert (tmp_path / "run" / "pool" / "valid.jsonl").read_text().strip() == '{"valid": true}'


@pytest.mark.integration
@pytest.mark.slow  # four 2-iteration loops of the tiny model, one after another (15 min under load)
@pytest.mark.timeout(2400)
def test_two_arms_by_two_seeds_end_to_end_give_the_table_and_the_curves(tiny_model, tmp_path):
    env = {**SMALL, "MODEL": str(tiny_model), "ARMS": "spade hand_curated", "SEEDS": "0 1"}
    res = _experiment(tmp_path, timeout=3000, **env)
    assert res.returncode == 0, res.stderr[-4000:]
    exp = tmp_path / "exp"
    for arm in ("spade", "hand_curated"):
        for seed in (0, 1):
            run = exp / arm / f"seed_{seed}"
            assert (run / "experiment.done").exists()
            # the starting model is evaluated before any update, in every arm
            start = json.loads((run / "eval" / "iter_0000.jsonl.manifest.json").read_text())
            assert str(tiny_model) in json.dumps(start)
            assert (run / "eval" / "iter_0002.jsonl").exists() and (run / "ckpt" / "iter_0002").is_dir()
            designs = (run / "iter_0001" / "designs.jsonl").read_text().splitlines()
            assert len(designs) == 2  # N_ENVS designs in every arm
    with open(exp / "compare" / "compare.csv", newline="") as fh:
        rows = {(r["row"], r["arm"]): r for r in csv.DictReader(fh)}
    bench = "lm:spade_tiny_qa/acc" if ("lm:spade_tiny_qa/acc", "spade") in rows else \
        next(k[0] for k in rows if k[0].startswith("lm:spade_tiny_qa/"))
    for arm in ("spade", "hand_curated"):
        assert rows[(bench, arm)]["n"] == "2" and rows[(bench, arm)]["iteration"] == "2"
        assert rows[(bench, arm)]["ci95"] != ""
    # the arms' runs pair by their settings' SEED: the Δ row is the per-seed difference of the columns
    paired = rows[(f"{bench}: Δ vs spade (paired by seed)", "hand_curated")]
    assert (paired["kind"], paired["n"], paired["seeds"]) == ("paired", "2", "SEED=0;SEED=1")
    per_seed = {arm: [float(v) for v in rows[(bench, arm)]["values"].split(";")] for arm in ("spade", "hand_curated")}
    expect = [c - s for c, s in zip(per_seed["hand_curated"], per_seed["spade"], strict=True)]
    assert [float(v) for v in paired["values"].split(";")] == pytest.approx(expect, abs=2e-3)
    # the pool's 2 envs are valid: 2 envs x 2 seeds x 2 sides = 8 episodes an iteration
    episodes = {arm: float(rows[("Agent episodes / iteration", arm)]["mean"]) for arm in ("spade", "hand_curated")}
    assert episodes["hand_curated"] == 8
    marked = rows[("Agent episodes / iteration", "hand_curated")]["budget_differs"] == "True"
    assert marked or episodes["spade"] == 8  # unequal budgets never pass unmarked
    md = (exp / "compare" / "compare.md").read_text()
    assert "Agent tokens / iteration" in md and "Vendi / n" in md
    png = next((exp / "compare").glob("curve-*.png")).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    again = _experiment(tmp_path, timeout=600, **env)  # restart: every cell is done, the table is rewritten
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count(": done") == 4 and not re.search(r"== cell \d+: ", again.stderr)  # none ran
