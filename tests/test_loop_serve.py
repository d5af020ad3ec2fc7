"""recipes/loop.sh with ENGINE=serve: one server for the run, each iteration's checkpoint loaded
into it, asleep during the update, stopped at the end; a rerun is up to date without a server.

The server is the stand-in of tests/test_serve.py (vLLM's routes; its completions are one token),
so the designs do not parse and the update passes the model through: this checks the loop's
plumbing of the engine, not learning. The real engine runs in recipes/test_vllm_cpu.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_loop import SMALL
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
