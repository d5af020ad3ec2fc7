"""The Slurm tier of the multi-node driver on engines that stay up (``ENGINE=serve``, docs/slurm.md),
on the one-node cluster of tests/slurm_cluster.py with the CPU settings of tests/test_slurm.py.

The fleet's engine is the stand-in vLLM server of tests/test_serve.py (vLLM's routes, one-token
completions), which ``spade serve`` starts through ``--vllm-python`` as it would start vLLM; the
starter pool gives the rollout array envs to play through it. 2 iterations, the first checkpoint
and the last evaluated through the fleet too:

- one fleet job for the run, one engine start on its node, and a load into that same engine for
  every later checkpoint (iteration 1's, then the last one for its evaluation), each before the jobs
  that sample it;
- the rollout shards and the evaluations name the server they sampled from, verified to serve
  their checkpoint;
- the driver cancels the fleet at its end (its engine is stopped, its state file gone), and a rerun
  is up to date without a fleet;
- a driver killed outright (SIGKILL: no clean-up) during iteration 0 leaves its fleet running; the
  rerun finds that fleet and loads iteration 1's checkpoint into it, without a new engine;
- pipelined (``PIPELINE=1``, 3 iterations): the fleet loads checkpoint 1 only when iteration 2
  starts generating (iterations 0 and 1 sample MODEL, iteration 2 checkpoint 1, each verified),
  and the last checkpoint is evaluated on its own engine while the fleet serves the one before.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from tests import slurm_cluster
from tests.test_serve import standin as standin  # noqa: F401 (the fixture)
from tests.test_serve import untied
from tests.test_slurm import _driver, _driver_log, _finish, _nudge, _queue, _start_driver
from tests.test_slurm import pytestmark as slurm_marks

pytestmark = slurm_marks
ENGINE = {"ENGINE": "serve", "SERVE_NODES": "1", "SERVE_HOST": "127.0.0.1",
          "SERVE_ARGS": f"--vllm-python {sys.executable}", "EVAL_EVERY": "2",
          "EVAL_TASKS": "rg:basic_arithmetic:2", "EVAL_LIMIT": "", "EVAL_ARGS": "--max-tokens 4"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield c
    c.stop()


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _env(tmp_path: Path, tiny_model: Path, standin: dict) -> dict:  # noqa: F811
    return {**standin, **ENGINE, "MODEL": str(untied(tiny_model, tmp_path / "untied"))}


@pytest.mark.slow
def test_the_driver_on_one_fleet_loads_each_checkpoint_into_the_same_engines(cluster, tiny_model, tmp_path,
                                                                             standin):  # noqa: F811
    env = _env(tmp_path, tiny_model, standin)
    rc, err = _driver(cluster, tmp_path, tiny_model, **env)
    assert rc == 0, _driver_log(tmp_path)
    run, logs = tmp_path / "run", tmp_path / "logs"
    ckpts = [Path(env["MODEL"]).resolve(), (run / "ckpt" / "iter_0001").resolve(), (run / "ckpt" / "iter_0002").resolve()]

    fleets = list(logs.glob("spade-serve-*.out"))
    assert len(fleets) == 1, [p.name for p in fleets]  # one fleet for the run
    job = fleets[0].stem.rsplit("-", 1)[1]
    assert (run / "serve" / "fleet" / "job").read_text() == f"{job}\n"
    # one engine start for the run; each later checkpoint loaded into that same process, in order
    calls = _rows(Path(standin["STANDIN_SERVER_LOG"]))
    starts = [c for c in calls if c.get("event") == "start"]
    assert len(starts) == 1, starts
    loaded = [c for c in calls if c.get("event") == "loaded"]
    assert [c["model"] for c in loaded] == [str(ckpts[1]), str(ckpts[2])]
    assert {c["pid"] for c in loaded} == {starts[0]["pid"]}
    events = _rows(run / "serve" / "node-0" / "events.jsonl")
    assert [(e["event"], e["iteration"], e["checkpoint"]) for e in events] == \
        [("start", 0, str(ckpts[0])), ("load", 1, str(ckpts[1])), ("load", 2, str(ckpts[2]))]

    # every sampling stage checked its server: the fleet's, verified to serve the stage's checkpoint
    server = f"http://{(run / f'servers-{job}.txt').read_text().strip()}/v1"
    # (a shard with no env of its own samples nothing and checks no server)
    sampled = {f"iter_000{i}/{p.name.removesuffix('.manifest.json')}": ckpts[i] for i in (0, 1)
               for p in (run / f"iter_000{i}").glob("rollouts.shard-*.manifest.json")
               if json.loads(p.read_text())["summary"]["episodes"]}
    assert {k.split("/")[0] for k in sampled} == {"iter_0000", "iter_0001"}, sampled
    sampled.update({"eval/iter_0000.jsonl": ckpts[0], "eval/iter_0002.jsonl": ckpts[2]})
    for out, ckpt in sampled.items():
        m = json.loads((run / f"{out}.manifest.json").read_text())
        assert m["config"]["backend"] == "openai", (out, m["config"])
        assert (tmp_path / m["config"]["model"]).resolve() == ckpt, (out, m["config"])
        # data_parallel_size: the engines the requests were pinned across (one per stand-in node)
        assert m["server"] == {"url": server, "served_model": "spade", "checkpoint": str(ckpt), "verified": True,
                               "accepted_foreign": False, "data_parallel_size": 1}, (out, m["server"])
    assert all(r["turns"] for r in _rows(run / "iter_0001" / "rollouts.shard-00-of-02.jsonl"))

    # the driver cancelled the fleet at its end: the job is over and its engine stopped
    assert cluster.job(job).get("JobState") == "CANCELLED", cluster.job(job)
    assert not (run / "serve" / "node-0" / "server.json").exists()
    rows = {r["iteration"]: r for r in _rows(run / "report" / "iterations.jsonl")}
    assert (rows[0]["engine_starts"], rows[1]["engine_loads"], rows[2]["engine_loads"]) == (1, 1, 1), rows

    rc, err = _driver(cluster, tmp_path, tiny_model, **env)
    assert rc == 0 and "iteration 0: done" in err and "iteration 1: done" in err, err[-2000:]
    assert "== fleet" not in err and "still up" not in err, err[-2000:]  # nothing to serve: no fleet
    assert len(list(logs.glob("spade-serve-*.out"))) == 1
    assert len(_rows(run / "serve" / "node-0" / "events.jsonl")) == len(events)
    assert not _queue(cluster)


@pytest.mark.slow
def test_a_rerun_after_the_driver_was_killed_finds_its_fleet_and_loads_the_right_checkpoint(
        cluster, tiny_model, tmp_path, standin):  # noqa: F811
    env = {**_env(tmp_path, tiny_model, standin), "EVAL_EVERY": "0"}
    proc = _start_driver(cluster, tmp_path, tiny_model, **env)
    run = tmp_path / "run"
    deadline = time.time() + 900
    # iteration 0's rollouts written: the driver now only waits for regret(0) and update(0)
    while len(list((run / "iter_0000").glob("rollouts.shard-*.jsonl.manifest.json"))) < 2:
        assert proc.poll() is None and time.time() < deadline, _driver_log(tmp_path)
        _nudge(cluster)
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # no EXIT trap: the fleet stays
    proc.wait()
    job = (run / "serve" / "fleet" / "job").read_text().strip()
    deadline = time.time() + 300
    while any(line.split()[0] != job for line in _queue(cluster).splitlines()):  # the driver's other jobs end
        assert time.time() < deadline, _queue(cluster)
        time.sleep(1)
    assert cluster.job(job).get("JobState") == "RUNNING", cluster.job(job)

    rc, err = _finish(cluster, _start_driver(cluster, tmp_path, tiny_model, **env), tmp_path)
    assert rc == 0, _driver_log(tmp_path)
    assert f"the fleet of this run is still up: job {job}" in err, err[-3000:]
    calls = _rows(Path(standin["STANDIN_SERVER_LOG"]))
    assert len([c for c in calls if c.get("event") == "start"]) == 1  # the same engine, found again
    events = _rows(run / "serve" / "node-0" / "events.jsonl")
    assert [(e["event"], e["iteration"]) for e in events] == [("start", 0), ("load", 1)], events
    for p in (run / "iter_0001").glob("rollouts.shard-*.manifest.json"):
        shard = json.loads(p.read_text())
        if shard["summary"]["episodes"]:
            assert shard["server"]["verified"], shard
            assert shard["server"]["checkpoint"] == str((run / "ckpt" / "iter_0001").resolve()), shard
    assert cluster.job(job).get("JobState") == "CANCELLED" and not _queue(cluster)


@pytest.mark.slow
def test_the_pipelined_driver_loads_checkpoint_i_only_when_iteration_i_plus_1_generates(
        cluster, tiny_model, tmp_path, standin):  # noqa: F811
    # MODEL evaluated through the fleet; the last checkpoint, while the fleet serves the one before
    # it, on its own engine (EVAL_BACKEND)
    env = {**_env(tmp_path, tiny_model, standin), "PIPELINE": "1", "ITERS": "3", "EVAL_EVERY": "3",
           "EVAL_BACKEND": "hf"}
    rc, err = _driver(cluster, tmp_path, tiny_model, **env)
    assert rc == 0, _driver_log(tmp_path)
    run = tmp_path / "run"
    model, ckpt1 = Path(env["MODEL"]).resolve(), (run / "ckpt" / "iter_0001").resolve()
    # iterations 0 and 1 sample MODEL, iteration 2 checkpoint 1: one start, one load, one engine
    events = _rows(run / "serve" / "node-0" / "events.jsonl")
    assert [(e["event"], e["iteration"], e["checkpoint"]) for e in events] == \
        [("start", 0, str(model)), ("load", 2, str(ckpt1))], events
    calls = _rows(Path(standin["STANDIN_SERVER_LOG"]))
    assert len([c for c in calls if c.get("event") == "start"]) == 1
    assert [c["model"] for c in calls if c.get("event") == "loaded"] == [str(ckpt1)]
    for i, ckpt in ((0, model), (1, model), (2, ckpt1)):
        played = [json.loads(p.read_text()) for p in (run / f"iter_000{i}").glob("rollouts.shard-*.manifest.json")]
        played = [m for m in played if m["summary"]["episodes"]]
        assert played and all(m["server"]["verified"] and m["server"]["checkpoint"] == str(ckpt) for m in played)
    # checkpoint 1 was loaded only after iteration 1 had generated (its update then ran beside iteration 2)
    assert err.index("iteration 1 generated; its update runs beside") < \
        err.index("every server loads run/ckpt/iter_0001 (iteration 2)"), err[-3000:]
    behind = [json.loads((run / "ckpt" / f"iter_000{c}" / "update.json").read_text())["staleness"]["behind"]
              for c in (1, 2, 3)]
    assert behind == [0, 1, 1]
    first = json.loads((run / "eval" / "iter_0000.jsonl.manifest.json").read_text())
    last = json.loads((run / "eval" / "iter_0003.jsonl.manifest.json").read_text())
    assert first["config"]["backend"] == "openai" and first["server"]["checkpoint"] == str(model)
    assert last["config"]["backend"] == "hf" and "server" not in last
    assert not _queue(cluster)
