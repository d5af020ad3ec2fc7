"""recipes/loop.sh killed at every stage boundary of iteration 1, and in the middle of stages, resumes
to the artifacts of an uninterrupted run.

Three configurations: the default loop (the tiny model as Designer, evaluation at the end), the
hand-curated fixed-pool baseline (with replay, so the memory and replay side outputs matter) and the
EMA learning-potential ablation. For each one, an uninterrupted reference run and a run that is
killed with SIGKILL (the whole process group, as a scheduler or the OOM killer would) at each kill
point in turn, then rerun, go side by side: two processes on two cores. Both use the relative run
directory ``run`` in their own working directory, so rows that name paths (``gen.model``) agree.

What a kill point must survive is write-once artifacts: before the memory was versioned, a kill
after `spade regret` of an iteration made the rerun refuse its own designs ("config changed: memory
None -> memory.jsonl").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO

SMALL = {"ITERS": "2", "N_ENVS": "2", "GROUP": "2", "K": "2", "MAX_TURNS": "2", "EVAL_EVERY": "0",
         "DESIGN_ARGS": "--max-tokens 6 --no-example --excerpt-chars 60 --memory-k 2",
         "ROLLOUT_ARGS": "--max-tokens 8", "UPDATE_ARGS": "--learning-rate 1e-3"}
CONFIGS = {
    "default": {"EVAL_EVERY": "2", "EVAL_TASKS": "lm:spade_tiny_qa", "EVAL_LIMIT": "2",
                "EVAL_ARGS": "--max-tokens 4 --batch-size 2"},
    "pool_baseline": {"CONFIG": str(REPO / "recipes" / "baselines" / "hand_curated.env"), "REPLAY": "1"},
    "ablation_ema_lp": {"CONFIG": str(REPO / "recipes" / "ablations" / "ema_lp.env")},
}
I1 = "run/iter_0001"


def _exists(rel: str) -> Callable[[Path, int], bool]:
    def probe(cwd: Path, pgid: int) -> bool:
        return bool(list(cwd.glob(rel)))
    probe.__name__ = rel
    return probe


def _stage_running(name: str, out: str, for_s: float = 1.5) -> Callable[[Path, int], bool]:
    """True once the loop's `spade NAME ... OUT ...` has run for ``for_s`` seconds: mid-stage."""
    seen: dict[str, float] = {}

    def probe(cwd: Path, pgid: int) -> bool:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat[2]) == pgid and name.encode() in argv and out.encode() in argv:
                if time.time() - seen.setdefault(pid, time.time()) >= for_s:
                    return True
        return False
    probe.__name__ = f"mid-{name}"
    return probe


# Stage boundaries of iteration 1 (a manifest is the last write of its stage), and mid-stage kills.
DESIGNS, VALIDATED, ROLLOUTS, SCORES = (_exists(f"{I1}/{n}.jsonl.manifest.json")
                                        for n in ("designs", "validated", "rollouts", "scores"))
MID_DESIGN = _stage_running("design", f"{I1}/designs.jsonl")
MID_UPDATE = _stage_running("update", "run/ckpt/iter_0002")
KILLS = {  # in the order the loop reaches them
    "default": [MID_DESIGN, DESIGNS, VALIDATED, ROLLOUTS, SCORES, MID_UPDATE,
                _exists("run/ckpt/iter_0002.manifest.json")],  # the last one kills the evaluation
    "pool_baseline": [DESIGNS, VALIDATED, _exists(f"{I1}/rollouts.jsonl.partial-*"), ROLLOUTS, SCORES],
    "ablation_ema_lp": [DESIGNS, VALIDATED, ROLLOUTS, SCORES, MID_UPDATE],
}


def _env(tiny_model: Path, config: dict) -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "MODEL": str(tiny_model),
            "RUN": "run", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **SMALL, **config}


def _loop(cwd: Path, env: dict) -> subprocess.Popen:
    """The loop in its own session (so that killpg takes every stage with it); stderr to a file,
    because a pipe nobody reads while the other run is being killed would fill and block it."""
    cwd.mkdir(parents=True, exist_ok=True)
    with open(cwd / "loop.log", "w") as log:
        return subprocess.Popen(["bash", str(REPO / "recipes" / "loop.sh")], cwd=cwd, env=env,
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)


def _log(cwd: Path) -> str:
    return (cwd / "loop.log").read_text(errors="replace")


def _finish(proc: subprocess.Popen, cwd: Path, timeout: float = 900) -> str:
    proc.wait(timeout=timeout)
    assert proc.returncode == 0, _log(cwd)[-4000:]
    return _log(cwd)


def _killed_at(cwd: Path, env: dict, probe: Callable[[Path, int], bool]) -> None:
    """Start the loop, SIGKILL its process group as soon as ``probe`` fires; fail if it never does."""
    proc = _loop(cwd, env)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None and not probe(cwd, proc.pid):
        time.sleep(0.02)
    assert proc.poll() is None, f"the loop ended before {probe.__name__}: " + _log(cwd)[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _rows(path: Path) -> list:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for r in rows:  # fields that measure time
        for key in ("checks", "stats", "seconds", "timings", "wall_s"):
            r.pop(key, None)
        tokens = r.get("tokens") or {}
        if tokens.get("logprobs"):
            tokens["logprobs"] = [None if x is None else round(x, 3) for x in tokens["logprobs"]]
    return rows


def _artifacts(cwd: Path) -> dict:
    """Every JSONL artifact of the run and every checkpoint's weights, keyed by relative path."""
    from safetensors.torch import load_file

    run = cwd / "run"
    out: dict = {str(p.relative_to(run)): _rows(p) for p in sorted(run.rglob("*.jsonl"))
                 if "report" not in p.parts}
    for ckpt in sorted(p for p in (run / "ckpt").iterdir() if p.is_dir()):
        if (ckpt / "pruned.json").exists():  # retention removed its weights: the same ones in both runs
            out[f"{ckpt.name}/pruned"] = json.loads((ckpt / "pruned.json").read_text())["pruned"]
        else:
            out[f"{ckpt.name}/weights"] = load_file(str(ckpt / "model.safetensors"))
    return out


def same_artifacts(clean: Path, killed: Path, leave_out: tuple[str, ...] = (),
                   row_key: Callable[[object], str] | None = None) -> dict:
    """Assert that two runs wrote the same artifacts (weights within float noise); return the clean
    run's. ``leave_out``: path prefixes not compared; ``row_key``: compare each file's rows in any
    order, by this key (a backend that writes episodes as they end)."""
    a, b = ({k: v for k, v in _artifacts(d).items() if not k.startswith(leave_out)} for d in (clean, killed))
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for key in a:
        if key.endswith("/weights"):
            assert all((a[key][t] - b[key][t]).abs().max().item() < 1e-5 for t in a[key]), key
        elif row_key is not None:
            assert sorted(map(row_key, a[key])) == sorted(map(row_key, b[key])), f"{key} differs after the kills"
        else:
            assert a[key] == b[key], f"{key} differs after the kills"
    return a


# "quick" kills the default loop where the original failures were (after regret moved the memory,
# and in the middle of an update); "all" is every stage boundary and mid-stage point of three configs.
QUICK = {"default": [SCORES, MID_UPDATE]}


@pytest.mark.integration
@pytest.mark.slow  # the whole loop twice or more: CI's second tier (.ci/run); tests/test_preempt.py is quick
@pytest.mark.parametrize("config,kills", [("default", "quick"), *[(c, "all") for c in CONFIGS]])
def test_a_loop_killed_anywhere_resumes_to_the_artifacts_of_an_uninterrupted_run(tiny_model, tmp_path, config,
                                                                                   kills):
    env = _env(tiny_model, CONFIGS[config])
    clean = _loop(tmp_path / "clean", env)  # the reference runs beside the kills: two cores
    killed = tmp_path / "killed"
    for probe in (QUICK if kills == "quick" else KILLS)[config]:
        _killed_at(killed, env, probe)
    err = _finish(_loop(killed, env), killed)
    assert "iteration 0: done" in err  # finished iterations are not redone
    _finish(clean, tmp_path / "clean")

    a = same_artifacts(tmp_path / "clean", killed)
    assert {"memory/iter_0001.jsonl", "memory/iter_0002.jsonl", "iter_0001/scores.jsonl"} <= a.keys()
    assert not list(killed.rglob("*.partial-*")), "a finished run leaves no partial output"
    assert (killed / "run" / "report" / "iterations.csv").exists()
    if config == "default":
        assert "eval/iter_0002.jsonl" in a
    if config == "pool_baseline":
        assert a["memory/iter_0002.jsonl"] and "iter_0001/replay.jsonl" in a
    if config == "ablation_ema_lp":  # the previous checkpoint's episodes, from iteration 1 on
        assert "iter_0001/lp_before.jsonl" in a and "iter_0000/lp_before.jsonl" not in a
