"""The Slurm tier: the sbatch recipes on a real one-node cluster (tests/slurm_cluster.py), with CPU
settings from the environment as a user would set them (hf backend, the tiny model, the starter
pool) and the GPU resources overridden on the sbatch command line.

- ``single_node.sbatch`` finishes 2 iterations; a second copy of the job is stopped twice on the
  way, once by SIGTERM to its batch shell (what ``--signal=B:TERM@300`` and preemption send: the job
  requeues itself) and once by ``scontrol requeue``, and ends with the artifacts of the first.
- A stage that fails makes the job fail visibly (state FAILED, the stage's exit code).

Skipped, with the reason, where slurm-wlm and munge are not installed (.ci/run installs them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import slurm_cluster
from tests.conftest import REPO
from tests.test_loop import _artifacts

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(bool(slurm_cluster.missing()) or os.geteuid() != 0,
                                 reason="needs slurm-wlm and munge (apt-get install slurm-wlm munge) "
                                        f"and root; missing: {', '.join(slurm_cluster.missing()) or 'root'}")]

# What a user sets for a CPU run of the GPU recipe (README "Cluster"): resources on the command line,
# settings in the environment that sbatch exports (--export=ALL, the default).
CPU_SBATCH = ["--gpus-per-node=0", "--cpus-per-task=1"]
CPU_ENV = {"BACKEND": "hf", "UPDATE_CMD": "spade", "UPDATE_ARGS": "--learning-rate 1e-3", "POOL": "starter",
           "ITERS": "2", "N_ENVS": "2", "K": "2", "MAX_TURNS": "2", "EVAL_EVERY": "0",
           "ROLLOUT_ARGS": "--max-new-tokens 8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield c
    c.stop()


def _submit(cluster, cwd: Path, tiny_model: Path, **env: str) -> str:
    cwd.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, **cluster.env, **CPU_ENV, "MODEL": str(tiny_model), "RUN": "run",
               "SPADE_REPO": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    res = subprocess.run(["sbatch", "--parsable", *CPU_SBATCH, f"--chdir={cwd}", f"--output={cwd}/job-%j.out",
                          str(REPO / "recipes" / "slurm" / "single_node.sbatch")],
                         capture_output=True, text=True, env=environ, cwd=cwd, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _log(cwd: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(cwd.glob("job-*.out")))


def _when(cluster, job: str, cwd: Path, pattern: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list(cwd.glob(pattern)):
            return
        info = cluster.job(job)
        assert info.get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"), \
            f"job {job} {info.get('JobState')} before {pattern}: {_log(cwd)}"
        if info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime":
            cluster.run("scontrol", "update", f"jobid={job}", "StartTime=now", check=False)
        time.sleep(0.05)
    raise TimeoutError(f"{pattern} never appeared: {_log(cwd)}")


def test_single_node_finishes_and_a_preempted_or_requeued_job_resumes_to_the_same_artifacts(
        cluster, tiny_model, tmp_path):
    clean = _submit(cluster, tmp_path / "clean", tiny_model)
    moved = _submit(cluster, tmp_path / "moved", tiny_model)

    # 1. SIGTERM to the batch shell mid-rollout: the loop stops at a boundary, exits 75, the job requeues
    _when(cluster, moved, tmp_path / "moved", "run/iter_0000/rollouts.jsonl.partial-*")
    cluster.run("scancel", "--batch", "--signal=TERM", moved)
    deadline = time.time() + 300
    while cluster.job(moved).get("Restarts") in (None, "0") and time.time() < deadline:
        time.sleep(0.2)
    assert cluster.job(moved).get("Restarts") == "1", _log(tmp_path / "moved")
    assert "stopped on SIGTERM: requeueing" in _log(tmp_path / "moved")

    # 2. `scontrol requeue` of the running job in iteration 1
    _when(cluster, moved, tmp_path / "moved", "run/iter_0001/validated.jsonl.manifest.json")
    while cluster.job(moved).get("JobState") != "RUNNING":
        time.sleep(0.2)
    cluster.run("scontrol", "requeue", moved)

    for job, cwd in ((clean, tmp_path / "clean"), (moved, tmp_path / "moved")):
        info = cluster.wait(job)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", _log(cwd)
    assert int(cluster.job(moved)["Restarts"]) == 2
    a, b = _artifacts(tmp_path / "clean"), _artifacts(tmp_path / "moved")
    assert a.keys() == b.keys() and "iter_0001/scores.jsonl" in a and "memory/iter_0002.jsonl" in a
    for key in a:
        if key.endswith("/weights"):
            assert all((a[key][t] - b[key][t]).abs().max().item() < 1e-5 for t in a[key]), key
        else:
            assert a[key] == b[key], f"{key} differs after the requeues"


def test_a_failing_stage_fails_the_job_visibly(cluster, tiny_model, tmp_path):
    job = _submit(cluster, tmp_path, tiny_model, MODEL=str(tmp_path / "no-such-model"), ITERS="1")
    info = cluster.wait(job, timeout=300)
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", info
    assert "error" in _log(tmp_path).lower()


# The multi-node driver with CPU settings: no fleet (the shards load the tiny model themselves), every
# job on one CPU of the one node; one iteration with a 2-task rollout array and both evals.
DRIVER_ENV = {"BACKEND": "hf", "ROLLOUT_BACKEND": "hf", "SERVE": "0", "UPDATE_CMD": "spade",
              "UPDATE_ARGS": "--learning-rate 1e-3", "UPDATE_NODES": "1", "SHARDS": "2", "POOL": "starter",
              "ITERS": "1", "N_ENVS": "2", "K": "2", "MAX_TURNS": "2", "ROLLOUT_ARGS": "--max-new-tokens 8",
              "EVAL_EVERY": "1", "EVAL_TASKS": "lm:spade_tiny_qa", "EVAL_LIMIT": "2",
              "EVAL_ARGS": "--max-tokens 4 --batch-size 2", "SBATCH_ARGS": " ".join(CPU_SBATCH), "POLL_S": "1",
              "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _driver(cluster, cwd: Path, tiny_model: Path, **env: str) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, **cluster.env, **DRIVER_ENV, "MODEL": str(tiny_model), "RUN": "run",
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(REPO / "recipes" / "slurm" / "multi_node" / "driver.sh")], cwd=cwd,
                          env=environ, capture_output=True, text=True, timeout=1500)


def _queue(cluster) -> str:
    return cluster.run("squeue", "-h", "-o", "%i %j %T %r").strip()


@pytest.mark.slow
def test_multi_node_driver_runs_an_iteration_as_a_dependency_chain(cluster, tiny_model, tmp_path):
    res = _driver(cluster, tmp_path, tiny_model)
    logs = res.stderr[-3000:] + "\n".join(p.read_text()[-1500:] for p in sorted((tmp_path / "logs").glob("*")))
    assert res.returncode == 0, logs
    run = tmp_path / "run"
    for out in ("iter_0000/designs.jsonl", "iter_0000/validated.jsonl", "iter_0000/rollouts.shard-00-of-02.jsonl",
                "iter_0000/rollouts.shard-01-of-02.jsonl", "iter_0000/scores.jsonl", "memory/iter_0001.jsonl",
                "ckpt/iter_0001", "eval/iter_0000.jsonl", "eval/iter_0001.jsonl"):
        assert (run / f"{out}.manifest.json").is_file() or (run / out).is_file(), f"{out} missing: {logs}"
    assert (run / "ckpt" / "iter_0001.manifest.json").is_file()
    # each stage ran as its own job, the shards as an array
    names = {p.name.split("-")[1] for p in (tmp_path / "logs").glob("spade-*.out")}
    assert {"design", "validate", "rollout", "regret", "update", "eval"} <= names, names
    assert len(list((tmp_path / "logs").glob("spade-rollout-*_*.out"))) == 2
    # the two shards together play every validated env, each in exactly one shard
    shards = [{json.loads(x)["env_id"] for x in (run / "iter_0000" / f"rollouts.shard-0{s}-of-02.jsonl")
               .read_text().splitlines()} for s in (0, 1)]
    valid = {json.loads(x)["env_id"] for x in (run / "iter_0000" / "validated.jsonl").read_text().splitlines()
             if json.loads(x).get("valid")}
    assert shards[0] | shards[1] == valid and not shards[0] & shards[1]
    # a rerun has nothing to submit
    again = _driver(cluster, tmp_path, tiny_model)
    assert again.returncode == 0 and "iteration 0: done" in again.stderr, again.stderr[-2000:]
    assert not _queue(cluster)


@pytest.mark.slow
def test_a_failing_stage_of_the_driver_cancels_its_dependents_and_fails_the_driver(cluster, tiny_model, tmp_path):
    res = _driver(cluster, tmp_path, tiny_model, MODEL=str(tmp_path / "no-such-model"), EVAL_EVERY="0")
    assert res.returncode == 1, res.stderr[-3000:]
    assert "was not written (a job failed" in res.stderr
    assert (tmp_path / "run" / "iter_0000" / "validated.jsonl.manifest.json").is_file()  # before the failure
    assert not (tmp_path / "run" / "iter_0000" / "scores.jsonl").exists()
    assert not _queue(cluster)  # the dependents were cancelled, not left PENDING
