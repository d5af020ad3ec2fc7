"""SIGTERM (Slurm's time-limit and preemption signal) stops a stage at a unit boundary, keeps what is
done as a resumable partial and exits 75; the loop hands the signal to its running stage and exits
75 too, which the sbatch recipes answer with a requeue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spade_cli.core import artifacts, preempt
from tests.conftest import REPO, run_spade


@pytest.fixture
def fresh_preempt(monkeypatch):
    monkeypatch.setattr(preempt, "_state", {"requested": 0, "writers": 0})


@pytest.mark.unit
def test_the_signal_waits_for_the_row_boundary_and_keeps_complete_rows(tmp_path, fresh_preempt):
    with pytest.raises(preempt.Preempted):  # no writer open: nothing to wait for
        preempt._handler(signal.SIGTERM, None)
    preempt._state["requested"] = 0
    part = tmp_path / "out.partial-x"
    with pytest.raises(preempt.Preempted) as err, artifacts.PartialWriter(part) as w:
        w.write({"a": 1})
        preempt._handler(signal.SIGTERM, None)  # mid-row: only a flag
        w.write({"a": 2})  # the boundary: stops before this row
    assert err.value.exit_code == 75
    assert part.read_text() == '{"a":1}\n'
    with pytest.raises(preempt.Preempted):  # a second signal does not wait
        preempt._handler(signal.SIGTERM, None)


def _rows(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for r in rows:
        r.pop("seconds", None)
        if (r.get("tokens") or {}).get("logprobs"):
            r["tokens"]["logprobs"] = [None if x is None else round(x, 3) for x in r["tokens"]["logprobs"]]
    return rows


@pytest.mark.integration
def test_sigterm_mid_rollout_exits_75_and_the_rerun_resumes_to_the_same_output(tiny_model, tmp_path):
    designs, envs = tmp_path / "designs.jsonl", tmp_path / "validated.jsonl"
    assert run_spade("design", "--pool", "starter", "--n", "2", "--out", designs).returncode == 0
    assert run_spade("validate", "--designs", designs, "--out", envs).returncode == 0

    def argv(out: Path) -> list[str]:
        # one episode at a time, 32 of them: the signal lands after the first row with most still to
        # play (with the default concurrency all 12 episodes of k=3 could finish before it)
        return ["rollout", "--model", str(tiny_model), "--envs", str(envs), "--k", "8", "--max-turns", "2",
                "--max-tokens", "8", "--max-concurrent", "1", "--out", str(out)]

    out = tmp_path / "rollouts.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "spade_cli", *argv(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        parts = list(tmp_path.glob("rollouts.jsonl.partial-*"))
        if parts and parts[0].read_text().count("\n") >= 1:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the rollout ended before the signal"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert "SIGTERM" in err and "Traceback" not in err
    assert not out.exists() and not Path(f"{out}.lock").exists()
    (part,) = tmp_path.glob("rollouts.jsonl.partial-*")
    kept = part.read_text().count("\n")
    assert kept >= 1 and part.read_text().endswith("\n")

    res = run_spade(*argv(out))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["resumed"] == kept
    clean = tmp_path / "clean.jsonl"
    assert run_spade(*argv(clean)).returncode == 0
    assert _rows(out) == _rows(clean)


@pytest.mark.integration
def test_the_loop_passes_sigterm_to_its_stage_and_exits_75(tiny_model, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "MODEL": str(tiny_model),
           "RUN": str(tmp_path / "run"), "POOL": "starter", "ITERS": "1", "N_ENVS": "2", "K": "3",
           "MAX_TURNS": "2", "EVAL_EVERY": "0", "ROLLOUT_ARGS": "--max-tokens 8"}
    proc = subprocess.Popen(["bash", str(REPO / "recipes" / "loop.sh")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if list((tmp_path / "run" / "iter_0000").glob("rollouts.jsonl.partial-*")):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the loop ended before the signal"
    proc.send_signal(signal.SIGTERM)  # to the loop's shell only, as `#SBATCH --signal=B:TERM` does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert "SIGTERM: stopped at a unit boundary" in err
    assert list((tmp_path / "run" / "iter_0000").glob("rollouts.jsonl.partial-*"))
    assert not (tmp_path / "run" / "iter_0000" / "rollouts.jsonl").exists()
    # and nothing of the stage is left running
    assert subprocess.run(["pgrep", "-f", "--", f"--out {tmp_path}/run/iter_0000/rollouts.jsonl"]).returncode == 1


def _update_argv(paths: dict, model: Path, out: Path) -> list[str]:
    return ["update", "--model", str(model), "--envs", str(paths["validated"]), "--rollouts",
            str(paths["rollouts"]), "--scores", str(paths["scores"]), "--out", str(out), "--learning-rate", "1e-3",
            "--per-device-train-batch-size", "1", "--num-iterations", "4"]


@pytest.mark.integration
@pytest.mark.slow  # three updates of ~50 optimizer steps: a minute or two on a loaded CPU
def test_sigterm_mid_update_stops_at_an_optimizer_step_and_resumes_bitwise(tiny_model, tmp_path):
    """The preempted update keeps its trainer state as a partial; the rerun takes the remaining
    steps and ends with the same bytes (served weights, fp32 masters, Adam, scheduler, RNG) and the
    same metrics as an uninterrupted run."""
    from tests.test_update import make_artifacts

    (tmp_path / "inputs").mkdir()
    paths = make_artifacts(tmp_path / "inputs", tiny_model)
    out = tmp_path / "iter_0001"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "400"}
    proc = subprocess.Popen([sys.executable, "-m", "spade_cli", *_update_argv(paths, tiny_model, out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("step 2/"):
            break
    assert seen and seen[-1].startswith("step 2/"), "".join(seen)[-3000:] + proc.communicate()[1][-3000:]
    total = int(seen[-1].split("/")[1].split(":")[0])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == 75, err[-3000:]
    assert "SIGTERM: stopped before optimizer step" in err and "Traceback" not in err
    assert not out.exists() and not Path(f"{out}.lock").exists()
    (part,) = tmp_path.glob("iter_0001.partial-*")
    (progress,) = part.glob("progress.*.json")
    done = json.loads(progress.read_text())["step"]
    assert 2 <= done < total  # stopped between steps, and kept what it had done

    res = run_spade(*_update_argv(paths, tiny_model, out), env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["resumed_step"] == done
    assert f"optimizer step {done} done" in res.stderr
    assert not list(tmp_path.glob("iter_0001.partial-*"))  # published: the partial is gone
    clean = tmp_path / "clean"
    res = run_spade(*_update_argv(paths, tiny_model, clean), env=env)
    assert res.returncode == 0 and json.loads(res.stdout)["resumed_step"] is None, res.stderr
    for name in ("model.safetensors", "trainer_state/model.safetensors", "trainer_state/optimizer.bin",
                 "trainer_state/custom_checkpoint_0.pkl", "trainer_state/random_states_0.pkl"):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name
    a, b = (json.loads((d / "update.json").read_text()) for d in (out, clean))
    for r in (a, b):
        for k in ("old_logps_seconds", "train_seconds", "tokens_per_s"):
            r["metrics"].pop(k)
        r["config"].pop("out")
        r.pop("host_memory")  # resident memory, measured like the seconds above: not the update's result
        r["trainer_state"] = {k: v for k, v in r["trainer_state"].items() if not k.endswith("_s")}
    assert a["metrics"]["optimizer_steps"] == total
    assert a == b
