"""The Slurm tier of the pipelined loop (docs/pipeline.md), on the one-node cluster of tests/slurm_cluster.py
with the CPU settings of tests/test_slurm.py and 3 iterations:

- ``single_node.sbatch`` with ``PIPELINE=1`` finishes; a second copy gets SIGTERM on its batch shell
  while update(1) trains beside the generation of iteration 2 (both lanes stop, the loop exits 75,
  the job requeues itself) and ends with the artifacts of the first. Iteration i+1 was played by
  checkpoint i, and each update recorded how far behind its samples were.
- ``single_node.sbatch`` with ``ENGINE=serve PIPELINE=1``: the server on the generation GPUs, across
  a requeue.
- ``multi_node/driver.sh`` with ``PIPELINE=1`` (rollout arrays without a fleet): the rollout array of
  iteration i+1 plays checkpoint i while update(i) runs, the updates record 0, 1, 1 updates behind,
  and a rerun submits nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import slurm_cluster
from tests.test_loop import _artifacts
from tests.test_serve import standin as standin  # noqa: F401 (the fixture)
from tests.test_slurm import NO_FLEET, _driver, _driver_log, _log, _queue, _submit, _term_and_requeue, _when
from tests.test_slurm import pytestmark as slurm_marks

pytestmark = slurm_marks
PIPELINED = {"PIPELINE": "1", "ITERS": "3"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield c
    c.stop()


def _samplers(run: Path, pattern: str) -> dict[int, set[str]]:
    return {i: {json.loads(p.read_text())["config"]["model"] for p in (run / f"iter_000{i}").glob(pattern)}
            for i in range(3)}


def _behind(run: Path) -> list:
    return [json.loads((run / "ckpt" / f"iter_000{c}" / "update.json").read_text())["staleness"]["behind"]
            for c in (1, 2, 3)]


@pytest.mark.slow
def test_single_node_pipelined_finishes_and_a_job_stopped_in_both_lanes_resumes_to_the_same_artifacts(
        cluster, tiny_model, tmp_path):
    clean = _submit(cluster, tmp_path / "clean", tiny_model, **PIPELINED)
    moved = _submit(cluster, tmp_path / "moved", tiny_model, **PIPELINED)
    # iteration 2 generates only while update(1) runs or after it: stop the job there
    _when(cluster, moved, tmp_path / "moved", "run/iter_0002/designs.jsonl.manifest.json")
    _term_and_requeue(cluster, moved, tmp_path / "moved")

    for job, cwd in ((clean, tmp_path / "clean"), (moved, tmp_path / "moved")):
        info = cluster.wait(job)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", _log(cwd)
    run = tmp_path / "clean" / "run"
    assert (run / "loop_mode").read_text() == "pipelined 1\n"
    assert _samplers(run, "rollouts.jsonl.manifest.json") == \
        {0: {str(tiny_model)}, 1: {str(tiny_model)}, 2: {"run/ckpt/iter_0001"}}
    assert _behind(run) == [0, 1, 1]
    a, b = _artifacts(tmp_path / "clean"), _artifacts(tmp_path / "moved")
    assert a.keys() == b.keys() and "iter_0002/scores.jsonl" in a and "memory/iter_0003.jsonl" in a
    for key in a:
        if key.endswith("/weights"):
            assert all((a[key][t] - b[key][t]).abs().max().item() < 1e-5 for t in a[key]), key
        else:
            assert a[key] == b[key], f"{key} differs after the requeue"


@pytest.mark.slow
def test_the_pipelined_driver_plays_iteration_i_plus_1_with_checkpoint_i(cluster, tiny_model, tmp_path):
    env = {**NO_FLEET, **PIPELINED, "EVAL_EVERY": "0"}
    rc, err = _driver(cluster, tmp_path, tiny_model, **env)
    assert rc == 0, _driver_log(tmp_path)
    run = tmp_path / "run"
    assert _samplers(run, "rollouts.shard-*-of-02.jsonl.manifest.json") == \
        {0: {str(tiny_model)}, 1: {str(tiny_model)}, 2: {"run/ckpt/iter_0001"}}
    assert _behind(run) == [0, 1, 1]
    # the update of iteration i was left running while iteration i+1 generated
    for i in (0, 1):
        assert err.index(f"iteration {i} generated; its update runs beside") < err.index(f"iteration {i + 1} (model:")
    rc, err = _driver(cluster, tmp_path, tiny_model, **env)
    assert rc == 0 and all(f"iteration {i}: done" in err for i in range(3)), err[-2000:]
    assert not _queue(cluster)
    # the sequential driver refuses the run directory
    rc, err = _driver(cluster, tmp_path, tiny_model, **{**env, "PIPELINE": "0"})
    assert rc == 2 and "never mix" in err


@pytest.mark.slow
def test_single_node_pipelined_on_one_engine_serves_from_the_generation_gpus_across_a_requeue(
        cluster, tiny_model, tmp_path, standin):
    """ENGINE=serve PIPELINE=1 TRAIN_GPUS=1 on a node of 3 "GPUs" (CPU: only the CUDA_VISIBLE_DEVICES
    the server gets is checked): the server starts on the 2 generation GPUs, the job stopped with
    SIGTERM requeues itself and finishes on a server it found or restarted, and stops it at the end."""
    from tests.test_serve import _free_port, untied

    cwd = tmp_path / "one"
    cwd.mkdir()
    model = untied(tiny_model, tmp_path / "untied")
    calls = cwd / "server_calls.jsonl"
    env = {**PIPELINED, **standin, "STANDIN_SERVER_LOG": str(calls), "ENGINE": "serve", "SERVE_PORT": str(_free_port()),
           "SERVE_ARGS": f"--vllm-python {sys.executable}", "NGPU": "3", "TRAIN_GPUS": "1"}
    job = _submit(cluster, cwd, model, **env)
    _when(cluster, job, cwd, "run/ckpt/iter_0001.manifest.json")
    _term_and_requeue(cluster, job, cwd)
    info = cluster.wait(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", _log(cwd)
    run = cwd / "run"
    starts = [c for c in map(json.loads, calls.read_text().splitlines()) if c.get("event") == "start"]
    assert starts and all(c["devices"] == "0,1" for c in starts), starts  # the generation GPUs, every time
    assert all(c["argv"][c["argv"].index("--data-parallel-size") + 1] == "2" for c in starts)
    events = [json.loads(x) for x in (run / "serve" / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "start" and events[-1]["checkpoint"] == str((run / "ckpt" / "iter_0001").resolve())
    assert not (run / "serve" / "server.json").exists()  # stopped at the end
    manifest = json.loads((run / "iter_0002" / "rollouts.jsonl.manifest.json").read_text())
    assert manifest["server"]["verified"] and manifest["server"]["checkpoint"] == events[-1]["checkpoint"]
    assert _behind(run) == [0, 1, 1]
