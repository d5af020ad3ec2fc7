"""recipes/loop.sh end to end: a loop killed mid-stage and restarted ends with the artifacts of an
uninterrupted run (the design stage reads the starter pool so the tiny model has valid envs to play)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

STAGES = ("designs", "validated", "rollouts", "scores")


def _env(tiny_model: Path, run: Path) -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "MODEL": str(tiny_model), "RUN": str(run), "POOL": "starter", "ITERS": "2", "N_ENVS": "2",
            "K": "2", "MAX_TURNS": "2", "EVAL_EVERY": "0", "ROLLOUT_ARGS": "--max-new-tokens 8",
            "UPDATE_ARGS": "--learning-rate 1e-3"}


def _loop(env: dict) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(REPO / "recipes" / "loop.sh")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def _content(run: Path) -> dict:
    """Every row of every stage output and the memory, without fields that measure time."""
    out: dict = {}
    for i in range(2):
        for name in STAGES:
            rows = [json.loads(x) for x in (run / f"iter_{i:04d}" / f"{name}.jsonl").read_text().splitlines()]
            for r in rows:
                r.pop("checks", None), r.pop("stats", None), r.pop("seconds", None)
                if "tokens" in r and r["tokens"] and r["tokens"].get("logprobs"):
                    r["tokens"]["logprobs"] = [None if x is None else round(x, 3) for x in r["tokens"]["logprobs"]]
            out[f"{i}/{name}"] = rows
    out["memory"] = (run / "memory.jsonl").read_text()
    return out


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model.safetensors"))


@pytest.mark.integration
def test_a_killed_loop_resumes_to_the_artifacts_of_an_uninterrupted_run(tiny_model, tmp_path):
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    proc = _loop(_env(tiny_model, clean))
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err.decode()[-3000:]

    # Kill the second run (the whole process group, as a scheduler would) in iteration 1's rollout.
    proc = _loop(_env(tiny_model, killed))
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if list((killed / "iter_0001").glob("rollouts.jsonl.partial-*")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the loop ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "ckpt" / "iter_0002").exists()

    proc = _loop(_env(tiny_model, killed))
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert "iteration 0: done" in err.decode()  # finished iterations are not redone

    a, b = _content(clean), _content(killed)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key], f"{key} differs after the restart"
    assert sum(len(a[f"{i}/rollouts"]) for i in range(2)) > 0
    wa, wb = _weights(clean / "ckpt" / "iter_0002"), _weights(killed / "ckpt" / "iter_0002")
    assert all((wa[k] - wb[k]).abs().max().item() < 1e-5 for k in wa)
    assert (killed / "report" / "iterations.csv").exists()
