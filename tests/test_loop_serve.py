"""recipes/loop.sh with ENGINE=serve: one server for the run, each iteration's checkpoint loaded
into it, asleep during the update, stopped at the end; a rerun is up to date without a server.

The server is the stand-in of tests/test_serve.py (vLLM's routes; its completions are one token),
so the designs do not parse and the update passes the model through: this checks the loop's
plumbing of the engine, not learning. The real engine runs in recipes/test_vllm_cpu.sh.

Pipelined (PIPELINE=1, docs/pipeline.md "One engine"): the generation lane's server on its own
devices, never asleep, each checkpoint loaded after the update that wrote it and beside the next
one; exact resumption after kills in both lanes; the refusal of devices the lanes would share."""

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
from tests.test_loop import SMALL, _finish, _killed_at, _log, _stage_running, same_artifacts
from tests.test_loop import _loop as _start
from tests.test_loop_pipelined import _group, _pipelined_env
from tests.test_serve import _free_port, untied
from tests.test_serve import standin as standin  # noqa: F401 (the fixture)

pytestmark = pytest.mark.integration


def _loop(cwd: Path, env: dict) -> str:
    res = subprocess.run(["bash", str(REPO / "recipes" / "loop.sh")], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stderr


def test_loop_on_one_engine(tiny_model, tmp_path, standin):  # noqa: F811
    port = _free_port()
    env = {**os.environ, **standin, **SMALL, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MODEL": str(untied(tiny_model, tmp_path / "untied")), "RUN": "run", "ENGINE": "serve", "SERVE_PORT": str(port),
           "SERVE_ARGS": f"--vllm-python {sys.executable} --sleep-mode", "DESIGN_ARGS": "--max-tokens 6 --no-example"}
    log = _loop(tmp_path, env)
    assert "ENGINE=serve" in log
    run = tmp_path / "run"
    events = [json.loads(x) for x in (run / "serve" / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["iteration"]) for e in events] == [("start", 0), ("sleep", 0), ("load", 1), ("sleep", 1)]
    assert events[2]["checkpoint"] == str((run / "ckpt" / "iter_0001").resolve())
    assert not (run / "serve" / "server.json").exists()  # stopped when the loop ended
    assert not [c for c in _calls_of(standin) if c.get("event") == "start"][1:]  # one engine start
    manifest = json.loads((run / "iter_0001" / "designs.jsonl.manifest.json").read_text())
    assert manifest["server"]["verified"] and manifest["server"]["served_model"] == "spade"
    assert manifest["server"]["checkpoint"] == str((run / "ckpt" / "iter_0001").resolve())
    rows = [json.loads(x) for x in (run / "report" / "iterations.jsonl").read_text().splitlines()]
    engine = {r["iteration"]: (r.get("engine_starts"), r.get("engine_loads")) for r in rows}
    assert engine[0] == (1, 0) and engine[1] == (0, 1)

    again = _loop(tmp_path, env)
    assert again.count("done") >= 2 and "up to date" not in again.split("report")[0].replace("done", "")
    assert len((run / "serve" / "events.jsonl").read_text().splitlines()) == len(events)  # no server needed


def _calls_of(env: dict) -> list[dict]:
    path = Path(env["STANDIN_SERVER_LOG"])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# --- the pipelined loop on one engine (docs/pipeline.md "One engine") ------------------------------

SBATCH = REPO / "recipes" / "slurm" / "single_node.sbatch"


def _piped(tiny_model: Path, cwd: Path, standin: dict) -> dict:
    """3 pipelined iterations on one stand-in server, every checkpoint evaluated, on a node of 3
    "GPUs" (CPU here: only the CUDA_VISIBLE_DEVICES the processes get are checked)."""
    model = tiny_model.parent / "untied"
    if not model.exists():
        untied(tiny_model, model)
    env = _pipelined_env(model, cwd)
    return {**env, **standin, "STANDIN_SERVER_LOG": str(cwd / "server_calls.jsonl"), "STANDIN_RELOAD_S": "2",
            "ENGINE": "serve", "SERVE_PORT": str(_free_port()), "SERVE_ARGS": f"--vllm-python {sys.executable}",
            "DESIGN_ARGS": "--max-tokens 6 --no-example", "EVAL_EVERY": "1", "EVAL_TASKS": "rg:basic_arithmetic:2",
            "EVAL_ARGS": "--max-tokens 4", "CUDA_VISIBLE_DEVICES": "0,1,2"}


def _events(cwd: Path) -> list[dict]:
    return [json.loads(x) for x in (cwd / "run" / "serve" / "events.jsonl").read_text().splitlines()]


def _finished_at(cwd: Path, c: int) -> float:
    """When update(c-1) finished writing checkpoint c: its manifest is the update's last write."""
    return (cwd / "run" / "ckpt" / f"iter_000{c}.manifest.json").stat().st_mtime


def _reloading(cwd: Path, pgid: int) -> bool:
    """The server has been asked to load checkpoint 1 (its reload takes STANDIN_RELOAD_S)."""
    return any(c.get("route") == "/collective_rpc" and c["body"]["kwargs"]["weights_path"].endswith("iter_0001")
               for c in _calls_of({"STANDIN_SERVER_LOG": str(cwd / "server_calls.jsonl")}))


def _canonical(row: object) -> str:
    return json.dumps(row, sort_keys=True)


def _terminated_in_both_lanes(cwd: Path, env: dict) -> None:
    """SIGTERM to the loop's shell while update(1) trains and the generation lane loads or evaluates
    checkpoint 1 (the stand-in's updates pass the model through, so they are short: the lane's load
    and evaluation are what runs beside them)."""
    update_1 = _stage_running("update", "run/ckpt/iter_0002", for_s=0.3)
    lane = [_stage_running("serve", "run/ckpt/iter_0001", for_s=0.3),
            _stage_running("eval", "run/eval/iter_0001.jsonl", for_s=0.3)]
    proc = _start(cwd, env)
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        both = [update_1(cwd, proc.pid), *(p(cwd, proc.pid) for p in lane)]
        if both[0] and any(both[1:]):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the loop ended before update(1) and the lane's stage ran together: " + \
        _log(cwd)[-3000:]
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=600) == 75, _log(cwd)[-3000:]
    assert "stopped at a unit boundary" in _log(cwd)
    assert _group(proc.pid) == [], "a stage outlived the loop"


def _check_the_clean_run(cwd: Path, model: Path) -> None:
    run = cwd / "run"
    ckpt = {c: str((run / "ckpt" / f"iter_000{c}").resolve()) for c in (1, 2, 3)}
    events = _events(cwd)
    assert [(e["event"], e["checkpoint"], e["iteration"]) for e in events] == \
        [("start", str(model), 0), ("load", ckpt[1], 1), ("load", ckpt[2], 2), ("load", ckpt[3], 3)]
    for e, c in zip(events[1:], (1, 2, 3), strict=True):
        begun = e["time"] - e["seconds"]
        assert begun >= _finished_at(cwd, c), f"checkpoint {c} loaded while its update wrote it"
        if c < 3:  # and at once, beside update(c) that trains the next one
            assert begun < _finished_at(cwd, c + 1), f"checkpoint {c} loaded only after update({c})"
    calls = _calls_of({"STANDIN_SERVER_LOG": str(cwd / "server_calls.jsonl")})
    starts = [c for c in calls if c.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["devices"] == "0,1", starts  # single_node.sbatch's generation GPUs
    argv = starts[0]["argv"]
    assert argv[argv.index("--data-parallel-size") + 1] == "2" and "--enable-sleep-mode" not in argv
    assert not [c for c in calls if c.get("route") in ("/sleep", "/wake_up")]  # never asleep
    assert not (run / "serve" / "server.json").exists()  # stopped when the loop ended

    # what each stage sampled from: iteration i from checkpoint i-1, verified on the server
    for i, sampler in ((0, model), (1, model), (2, run / "ckpt" / "iter_0001")):
        for name in ("designs", "rollouts"):
            m = json.loads((run / f"iter_000{i}" / f"{name}.jsonl.manifest.json").read_text())
            assert Path(cwd, m["config"]["model"]).resolve() == sampler.resolve(), (i, name)
            assert m["server"]["verified"] and m["server"]["served_model"] == "spade"
            assert m["server"]["checkpoint"] == str(sampler.resolve()), (i, name)
    for c in range(4):
        m = json.loads((run / "eval" / f"iter_000{c}.jsonl.manifest.json").read_text())
        assert m["server"]["verified"] and m["server"]["checkpoint"] == ckpt.get(c, str(model))
    assert [json.loads((run / "ckpt" / f"iter_000{c}" / "update.json").read_text())["staleness"]["behind"]
            for c in (1, 2, 3)] == [0, 1, 1]
    rows = [json.loads(x) for x in (run / "report" / "iterations.jsonl").read_text().splitlines()]
    assert {r["iteration"]: (r["engine_starts"], r["engine_loads"]) for r in rows} == \
        {0: (1, 0), 1: (0, 1), 2: (0, 1), 3: (0, 1)}


@pytest.mark.slow  # the 3-iteration pipelined loop four times: CI's second tier (.ci/run)
@pytest.mark.timeout(3000)
def test_the_pipelined_loop_on_one_engine_loads_each_checkpoint_after_its_update_and_resumes_exactly(
        tiny_model, tmp_path, standin):  # noqa: F811
    clean_dir, killed = tmp_path / "clean", tmp_path / "killed"
    env = _piped(tiny_model, clean_dir, standin)
    env_killed = {**_piped(tiny_model, killed, standin), "GEN_DEVICES": "0,1", "TRAIN_DEVICES": "2"}
    model = Path(env["MODEL"])
    with open(clean_dir / "loop.log", "w") as log:  # the sbatch recipe as a plain script: no requeue
        clean = subprocess.Popen(["bash", str(SBATCH)], cwd=clean_dir, stdout=log, stderr=log, start_new_session=True,
                                 env={**env, "NGPU": "3", "TRAIN_GPUS": "1", "SPADE_REPO": str(REPO),
                                      "UPDATE_CMD": "spade", "BACKEND": "hf"})
    try:
        # killed (whole process group) while the server loads checkpoint 1 beside update(1)
        _killed_at(killed, env_killed, _reloading)
        state = json.loads((killed / "run" / "serve" / "server.json").read_text())
        assert state["loading"].endswith("iter_0001") and state["checkpoint"] == str(model)
        # SIGTERM while update(1) trains and the lane works with checkpoint 1: both stop, exit 75
        _terminated_in_both_lanes(killed, env_killed)
        # a requeue elsewhere: the server is gone; the rerun starts one on the right checkpoint
        os.killpg(json.loads((killed / "run" / "serve" / "server.json").read_text())["pid"], signal.SIGKILL)
        err = _finish(_start(killed, env_killed), killed)
        assert "iteration 0: generated" in err and "update of iteration 0: done" in err
        _finish(clean, clean_dir)
    finally:
        for cwd, e in ((clean_dir, env), (killed, env_killed)):
            if (cwd / "run" / "serve" / "server.json").exists():
                subprocess.run(["spade", "serve", "--run-dir", "run", "--do", "stop"], cwd=cwd, env=e, timeout=120)
    _check_the_clean_run(clean_dir, model)

    # the killed run: one start, one restart after its server was gone, each checkpoint served in
    # order (a load cut short is done again) and only after the update that wrote it
    events = _events(killed)
    assert [e["event"] for e in events].count("start") == 1 and events[0]["event"] == "start", events
    restart = [e for e in events if e["event"] == "restart"]
    assert len(restart) == 1 and "gone" in restart[0]["reason"], events
    served = [int(Path(e["checkpoint"]).name[5:]) if Path(e["checkpoint"]).parent.name == "ckpt" else 0
              for e in events]
    assert served == sorted(served) and served[-1] == 3 and {1, 2} <= set(served), events
    for e, c in zip(events, served, strict=True):
        assert c == 0 or e["time"] - e["seconds"] >= _finished_at(killed, c), e
    # the artifacts: the server's own log (checked above) aside
    # the openai backend plays episodes concurrently and writes them as they end: same rows, any order
    same_artifacts(clean_dir, killed, leave_out=("serve/",), row_key=_canonical)

    # a rerun of the finished run is up to date and needs no server
    n_events, n_calls = len(events), len(_calls_of(env_killed))
    err = _finish(_start(killed, env_killed), killed)
    assert "generating with" not in err and "(from " not in err, err
    assert len(_events(killed)) == n_events and len(_calls_of(env_killed)) == n_calls
    assert not (killed / "run" / "serve" / "server.json").exists()


def test_the_pipelined_loop_refuses_one_engine_on_shared_devices(tmp_path):
    """The server holds its GPUs for the run and never sleeps beside the update: with GPUs, each lane
    needs its own (the check runs before any stage; CUDA_VISIBLE_DEVICES stands for the GPUs)."""
    base = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "MODEL": "m", "RUN": "run",
            "ENGINE": "serve", "PIPELINE": "1", "GEN_DEVICES": "", "TRAIN_DEVICES": ""}
    cases = [({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "GEN_DEVICES=0,1 TRAIN_DEVICES=2,3"),
             ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "GEN_DEVICES": "0,1,2", "TRAIN_DEVICES": "2,3"}, "both have 2"),
             ({"CUDA_VISIBLE_DEVICES": "0,1", "GEN_DEVICES": "0"}, "TRAIN_DEVICES=all"),
             ({"CUDA_VISIBLE_DEVICES": "0"}, "run ENGINE=serve sequentially")]
    for extra, says in cases:
        res = subprocess.run(["bash", str(REPO / "recipes" / "loop.sh")], cwd=tmp_path, env={**base, **extra},
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and says in res.stderr, (extra, res.stderr[-2000:])
        assert not (tmp_path / "run" / "serve").exists()
