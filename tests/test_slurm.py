"""The Slurm tier: the sbatch recipes on a real one-node cluster (tests/slurm_cluster.py), with CPU
settings from the environment as a user would set them (hf backend, the tiny model, the starter
pool) and the GPU resources overridden on the sbatch command line.

- ``single_node.sbatch`` finishes 2 iterations; a second copy of the job is stopped twice on the
  way, once by SIGTERM to its batch shell (what ``--signal=B:TERM@300`` and preemption send: the job
  requeues itself) and once by ``scontrol requeue``, and ends with the artifacts of the first.
- A stage that fails makes the job fail visibly (state FAILED, the stage's exit code).
- ``multi_node/driver.sh`` finishes 2 iterations as dependency chains of jobs, each with a 2-task
  rollout array played against a ``transformers serve`` fleet on 127.0.0.1 that the driver
  cancels after the array; a rerun submits nothing.
- ``scontrol requeue`` of a running rollout array task of the driver resumes its shard, and the run
  ends with the artifacts of an uninterrupted one beside it.
- A failing stage of the driver (a fleet that cannot load the model) fails the array at once,
  cancels its dependents (none left PENDING) and fails the driver.

Skipped, with the reason, where slurm-wlm and munge are not installed (.ci/run installs them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
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
           "ROLLOUT_ARGS": "--max-tokens 8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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


def _term_and_requeue(cluster, job: str, cwd: Path) -> None:
    """SIGTERM to the job's batch shell, as the time limit sends it: the loop stops at a boundary and
    the job requeues itself once."""
    cluster.run("scancel", "--batch", "--signal=TERM", job)
    deadline = time.time() + 300
    while cluster.job(job).get("Restarts") in (None, "0") and time.time() < deadline:
        time.sleep(0.2)
    assert cluster.job(job).get("Restarts") == "1", _log(cwd)
    assert "stopped on SIGTERM: requeueing" in _log(cwd)


def _when(cluster, job: str, cwd: Path, pattern: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list(cwd.glob(pattern)):
            return
        info = cluster.job(job)
        assert info.get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"), \
            f"job {job} {info.get('JobState')} before {pattern}: {_log(cwd)}"
        cluster.skip_begin_delay(job, info)
        time.sleep(0.05)
    raise TimeoutError(f"{pattern} never appeared: {_log(cwd)}")


def test_single_node_finishes_and_a_preempted_or_requeued_job_resumes_to_the_same_artifacts(
        cluster, tiny_model, tmp_path):
    clean = _submit(cluster, tmp_path / "clean", tiny_model)
    moved = _submit(cluster, tmp_path / "moved", tiny_model)

    # 1. SIGTERM to the batch shell mid-rollout: the loop stops at a boundary, exits 75, the job requeues
    _when(cluster, moved, tmp_path / "moved", "run/iter_0000/rollouts.jsonl.partial-*")
    _term_and_requeue(cluster, moved, tmp_path / "moved")

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


# The multi-node driver with CPU settings, as a user sets them: a `transformers serve` fleet on
# 127.0.0.1 (SERVE_NODES=1: the cluster has one node), every job on one CPU of it, 2 iterations,
# each with a 2-task rollout array; MODEL and the last checkpoint evaluated.
FLEET = {"SERVE": "1", "SERVER": "transformers", "SERVE_NODES": "1", "SERVE_HOST": "127.0.0.1",
         "SERVE_ARGS": "--device cpu --dtype float32", "ROLLOUT_BACKEND": "openai", "SERVE_WAIT_S": "300"}
NO_FLEET = {"SERVE": "0", "ROLLOUT_BACKEND": "hf"}  # the shards load the model themselves
DRIVER_ENV = {"BACKEND": "hf", **FLEET, "UPDATE_CMD": "spade", "UPDATE_ARGS": "--learning-rate 1e-3",
              "UPDATE_NODES": "1", "SHARDS": "2", "POOL": "starter", "ITERS": "2", "N_ENVS": "2", "K": "2",
              "MAX_TURNS": "2", "ROLLOUT_ARGS": "--max-tokens 8", "EVAL_EVERY": "2",
              "EVAL_TASKS": "lm:spade_tiny_qa", "EVAL_LIMIT": "2", "EVAL_ARGS": "--max-tokens 4 --batch-size 2",
              "SBATCH_ARGS": " ".join(CPU_SBATCH), "POLL_S": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _start_driver(cluster, cwd: Path, tiny_model: Path, **env: str) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, **cluster.env, **DRIVER_ENV, "MODEL": str(tiny_model), "RUN": "run",
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    with open(cwd / "driver.err", "w") as err:
        return subprocess.Popen(["bash", str(REPO / "recipes" / "slurm" / "multi_node" / "driver.sh")], cwd=cwd,
                                env=environ, stdout=subprocess.DEVNULL, stderr=err)


def _nudge(cluster) -> None:
    """A requeued job waits out a begin-time delay before it may start again: skip it."""
    for line in cluster.run("squeue", "-h", "-o", "%i %r", check=False).splitlines():
        job, _, reason = line.partition(" ")
        if reason.strip() == "BeginTime":
            cluster.skip_begin_delay(job)


def _finish(cluster, proc: subprocess.Popen, cwd: Path, timeout: float = 1500) -> tuple[int, str]:
    deadline = time.time() + timeout
    while proc.poll() is None:
        if time.time() > deadline:
            proc.kill()
            raise TimeoutError(f"the driver in {cwd} still runs after {timeout}s: {_driver_log(cwd)}")
        _nudge(cluster)
        time.sleep(1)
    return proc.returncode, (cwd / "driver.err").read_text()


def _driver(cluster, cwd: Path, tiny_model: Path, **env: str) -> tuple[int, str]:
    return _finish(cluster, _start_driver(cluster, cwd, tiny_model, **env), cwd)


def _driver_log(cwd: Path) -> str:
    err = (cwd / "driver.err").read_text()[-3000:] if (cwd / "driver.err").exists() else ""
    return err + "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                           for p in sorted((cwd / "logs").glob("*")))


def _queue(cluster) -> str:
    return cluster.run("squeue", "-h", "-o", "%i %j %T %r").strip()


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _shards_partition_the_valid_envs(it: Path) -> None:
    shards = [{r["env_id"] for r in _rows(it / f"rollouts.shard-0{s}-of-02.jsonl")} for s in (0, 1)]
    valid = {r["env_id"] for r in _rows(it / "validated.jsonl") if r.get("valid")}
    assert shards[0] | shards[1] == valid and not shards[0] & shards[1], (it, shards, valid)


@pytest.mark.slow
def test_multi_node_driver_runs_two_iterations_against_a_transformers_serve_fleet(cluster, tiny_model, tmp_path):
    rc, err = _driver(cluster, tmp_path, tiny_model)
    assert rc == 0, _driver_log(tmp_path)
    run, logs = tmp_path / "run", tmp_path / "logs"
    for out in ("iter_0000/designs.jsonl", "iter_0000/validated.jsonl", "iter_0000/scores.jsonl",
                "memory/iter_0001.jsonl", "ckpt/iter_0001", "iter_0001/designs.jsonl", "iter_0001/validated.jsonl",
                "iter_0001/scores.jsonl", "memory/iter_0002.jsonl", "ckpt/iter_0002", "eval/iter_0000.jsonl",
                "eval/iter_0002.jsonl", *(f"iter_000{i}/rollouts.shard-0{s}-of-02.jsonl" for i in (0, 1) for s in (0, 1))):
        assert (run / f"{out}.manifest.json").is_file() or (run / out).is_file(), \
            f"{out} missing: {_driver_log(tmp_path)}"
    names = {p.name.split("-")[1] for p in logs.glob("spade-*.out")}
    assert {"design", "validate", "serve", "rollout", "regret", "update", "eval"} <= names, names
    assert len(list(logs.glob("spade-rollout-*_*.out"))) == 4  # 2 iterations x 2 array tasks
    for i in (0, 1):
        _shards_partition_the_valid_envs(run / f"iter_000{i}")

    # one fleet per iteration, serving that iteration's checkpoint under the name the shards request
    fleets = sorted(logs.glob("spade-serve-*.out"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    assert len(fleets) == 2, [p.name for p in fleets]
    for i, (log, ckpt) in enumerate(zip(fleets, (str(tiny_model), "run/ckpt/iter_0001"), strict=True)):
        job, text = log.stem.rsplit("-", 1)[1], log.read_text()
        served = re.search(rf"transformers answers on (127\.0\.0\.1:\d+) for '{re.escape(ckpt)}'", text)
        assert served, text[-3000:]
        # the list is written only once the server has answered a completion for that name
        assert (run / f"servers-{job}.txt").read_text() == served[1] + "\n"
        assert not (run / f"servers-{job}.d").exists()
        assert text.index(served[0]) < text.index("servers answer:"), text[-3000:]
        for s in (0, 1):
            m = json.loads((run / f"iter_000{i}" / f"rollouts.shard-0{s}-of-02.jsonl.manifest.json").read_text())
            assert m["config"]["backend"] == "openai" and m["config"]["model"] == ckpt, m["config"]
            assert m["argv"][m["argv"].index("--base-url") + 1] == f"http://{served[1]}/v1", m["argv"]
        # the driver cancelled the fleet once the array was done: the job is over, the port closed
        assert cluster.job(job).get("JobState") == "CANCELLED", cluster.job(job)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{served[1]}/health", timeout=5)
    assert all(r["turns"] and r["error"] is None for r in _rows(run / "iter_0001" / "rollouts.shard-00-of-02.jsonl"))
    # a rerun has nothing to submit
    rc, err = _driver(cluster, tmp_path, tiny_model)
    assert rc == 0 and "iteration 0: done" in err and "iteration 1: done" in err, err[-2000:]
    assert len(list(logs.glob("spade-serve-*.out"))) == 2
    assert not _queue(cluster)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # committed (renamed to the shard) since the glob
        return 0


def _array_head_task(cluster, cwd: Path) -> tuple[str, int] | None:
    """(JOB_TASK id, shard) of the running rollout task of the driver in ``cwd`` whose own job id is the
    array's: its SLURM_JOB_ID names the whole array, the case a task must not requeue by."""
    for line in cluster.run("squeue", "-h", "-o", "%j|%T|%Z|%A|%F|%K", check=False).splitlines():
        name, state, workdir, job, array, task = line.split("|")
        if name == "spade-rollout" and state == "RUNNING" and Path(workdir) == cwd and job == array:
            return f"{array}_{task}", int(task)
    return None


@pytest.mark.slow
def test_a_requeued_rollout_task_of_the_driver_resumes_to_the_same_artifacts(cluster, tiny_model, tmp_path):
    # one episode at a time, so that the shard's partial holds some episodes and misses others
    env = {**NO_FLEET, "EVAL_EVERY": "0", "K": "4", "ROLLOUT_ARGS": "--max-tokens 8 --max-concurrent 1"}
    clean = _start_driver(cluster, tmp_path / "clean", tiny_model, **env)
    moved_dir = tmp_path / "moved"
    moved = _start_driver(cluster, moved_dir, tiny_model, **env)
    # `scontrol requeue` of an array task of iteration 0 once its shard's partial has an episode
    deadline, head = time.time() + 600, None
    while True:
        assert moved.poll() is None and time.time() < deadline, _driver_log(moved_dir)
        head = head or _array_head_task(cluster, moved_dir)
        if head and any(_size(p) > 0 for p in moved_dir.glob(
                f"run/iter_0000/rollouts.shard-0{head[1]}-of-02.jsonl.partial-*")):
            break
        time.sleep(0.05)
    task, shard = head
    cluster.run("scontrol", "requeue", task)
    for proc, cwd in ((clean, tmp_path / "clean"), (moved, moved_dir)):
        rc, _ = _finish(cluster, proc, cwd)
        assert rc == 0, _driver_log(cwd)
    assert int(cluster.job(task)["Restarts"]) >= 1, cluster.job(task)
    # it requeued itself by its JOB_TASK id: by its SLURM_JOB_ID, the array's, its sibling would restart too
    sibling = f"{task.split('_')[0]}_{1 - shard}"
    assert cluster.job(sibling)["Restarts"] == "0", cluster.job(sibling)
    summary = json.loads((moved_dir / "run" / "iter_0000" / f"rollouts.shard-0{shard}-of-02.jsonl.manifest.json")
                         .read_text())
    assert summary["summary"]["resumed"] > 0, summary  # the requeued task kept what was done and played the rest
    a, b = _artifacts(tmp_path / "clean"), _artifacts(moved_dir)
    assert a.keys() == b.keys() and "iter_0001/scores.jsonl" in a and "memory/iter_0002.jsonl" in a, a.keys()
    for key in a:
        if key.endswith("/weights"):
            assert all((a[key][t] - b[key][t]).abs().max().item() < 1e-5 for t in a[key]), key
        else:
            assert a[key] == b[key], f"{key} differs after the requeue"
    assert not _queue(cluster)


@pytest.mark.slow
def test_a_failing_stage_of_the_driver_cancels_its_dependents_and_fails_the_driver(cluster, tiny_model, tmp_path):
    # the fleet cannot load a missing model: the rollout tasks see it end and fail at once
    rc, err = _driver(cluster, tmp_path, tiny_model, MODEL=str(tmp_path / "no-such-model"), EVAL_EVERY="0")
    assert rc == 1, _driver_log(tmp_path)
    assert "was not written (a job failed" in err
    assert (tmp_path / "run" / "iter_0000" / "validated.jsonl.manifest.json").is_file()  # before the failure
    assert not (tmp_path / "run" / "iter_0000" / "scores.jsonl").exists()
    rollout_logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("spade-rollout-*.out"))
    assert "ended without a healthy server" in rollout_logs, _driver_log(tmp_path)
    assert not _queue(cluster)  # the dependents were cancelled, not left PENDING
