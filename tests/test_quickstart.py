"""The CPU quickstart as a user runs it: `SMOKE=1 bash recipes/quickstart.sh`, every stage for real.

The script is run in a subprocess with this interpreter's venv as its VENV (whose `spade` is
already installed, so setup.sh's pip steps are skipped) and this tree first on PYTHONPATH, so the
code under test is the checkout's, whichever tree the venv was installed from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, WIDE


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_smoke_quickstart_runs_every_stage_and_compares_the_held_out_suite(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "spade").exists():
        pytest.skip("needs a venv with spade installed (quickstart would pip-install one)")
    run = tmp_path / "qs"
    env = {**os.environ, **WIDE, "SMOKE": "1", "RUN": str(run), "VENV": str(venv), "SEED": "3",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    res = subprocess.run(["bash", str(REPO / "recipes" / "quickstart.sh")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=2300)
    assert res.returncode == 0, res.stderr[-4000:]
    err = res.stderr
    assert "== setup skipped" in err and "Successfully installed" not in err
    assert "== quickstart finished in" in err
    for step in ("init-model + warmstart", "held-out suite + eval of iteration 0", "loop.sh (2 iterations"):
        assert f"== {step}" in err, step

    # The compare line: iteration 0 against the last checkpoint on the same held-out suite.
    compare = json.loads((run / "heldout" / "compare.json").read_text())
    assert compare["a"].endswith("iter_0000.jsonl") and compare["b"].endswith("iter_0002.jsonl")
    rows = {r["metric"]: r for r in compare["rows"] if r["task"].startswith("envs:")}
    assert set(rows) == {"unhinted_return", "hinted_return"}
    for r in rows.values():
        assert 0.0 <= r["a"] <= 1.0 and 0.0 <= r["b"] <= 1.0 and r["diff"] == pytest.approx(r["b"] - r["a"])
        assert r["a_n"] == r["b_n"] == 2 * 6  # SMOKE: EVAL_K=2 seeds of each of the 6 held-out cells
        assert r["paired_n"] == 12  # both evals played the same seeds: every episode is paired
    assert "unhinted_return" in err  # the table a user reads

    # held out means unseen: no design, pool or warm-start env of the run is a held-out cell
    from spade_cli.designer import space

    suite = [json.loads(line) for line in (run / "heldout" / "validated.jsonl").read_text().splitlines()]
    assert {(r["spec"]["rule"], r["spec"]["level"]) for r in suite} == space.HELD_OUT
    for path in run.glob("iter_*/validated.jsonl"):
        cells = {(r["spec"]["rule"], r["spec"]["level"]) for r in map(json.loads, path.read_text().splitlines())
                 if r.get("spec")}
        assert not cells & space.HELD_OUT, path
    warm = json.loads((run / "model" / "warm.manifest.json").read_text())["summary"]
    assert not any(e.removeprefix("warmstart-practice_").rsplit("_", 1)[0] + "/" + e.rsplit("_", 1)[1]
                   in {f"{r}/{lv}" for r, lv in space.HELD_OUT} for e in warm["agent_envs"])

    report = run / "report"
    assert (report / "iterations.csv").read_text().count("\n") >= 3  # header and iterations 0, 1, 2
    assert list(report.glob("*.png"))
    for i in (1, 2):  # both updates published a checkpoint, trained or passed through
        assert (run / "ckpt" / f"iter_{i:04d}.manifest.json").exists(), i
