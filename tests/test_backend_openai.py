"""The openai backend over HTTP on 127.0.0.1.

Text mode runs against a real ``transformers serve`` subprocess with the tiny model (its
``/v1/completions`` takes string prompts only). Token mode, the vLLM wire format, runs against a
small in-process server that answers in vLLM's shape from the real hf backend, so the log-probs
that travel over HTTP can be checked against a float32 recomputation.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spade_cli.backends import Sampling, load_backend, render_chat
from spade_cli.core.artifacts import SpadeError

CHATS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": "Plan a three-step route through a warehouse."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to five."}],
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve(tiny_model, tmp_path_factory):
    """``transformers serve`` on a free 127.0.0.1 port, ready within a bounded time.

    A free port is only free until someone binds it: another test worker can take it between
    ``_free_port`` and the server's bind, so a server that exits before it is ready is started again on
    a new port (three tries)."""
    pytest.importorskip("fastapi", reason="transformers serve needs pip install 'transformers[serving]'")
    pytest.importorskip("uvicorn", reason="transformers serve needs pip install 'transformers[serving]'")
    log_dir = tmp_path_factory.mktemp("serve")
    for attempt in range(3):
        proc, url, log = _start_serve(tiny_model, log_dir / f"serve-{attempt}.log")
        try:
            if _wait_ready(proc, url, log, deadline=time.monotonic() + 120):
                break
        except BaseException:
            _stop(proc)
            raise
    else:
        pytest.fail(f"transformers serve exited before it was ready, three times:\n{log.read_text()[-3000:]}")
    try:
        yield url
    finally:
        _stop(proc)


def _start_serve(tiny_model, log: Path) -> tuple[subprocess.Popen, str, Path]:
    port = _free_port()
    cmd = [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.exit(main())",
           "serve", str(tiny_model), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
           "--dtype", "float32"]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}", log


def _wait_ready(proc: subprocess.Popen, url: str, log: Path, deadline: float) -> bool:
    """True once /health answers 200; False if the server exited first (try another port)."""
    while True:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"transformers serve not ready in 120 s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _prompts(tok) -> list[list[int]]:
    return [render_chat(tok, c) for c in CHATS]


@pytest.mark.integration
def test_transformers_serve_text_mode_retokenizes(serve, tiny_model):
    backend = load_backend("openai", str(tiny_model), base_url=serve, concurrency=4)
    tok = backend.tokenizer
    prompts = _prompts(tok)
    for p in prompts:  # text mode sends decoded prompts: chat renderings must round-trip exactly
        assert tok.encode(tok.decode(p, skip_special_tokens=False), add_special_tokens=False) == p
    out = backend.generate(prompts, n=2, sampling=Sampling(temperature=1.0, max_tokens=24, seed=1))
    assert backend.token_prompts is False, "transformers serve rejects token prompts (422): text mode"
    assert backend.calls == 1 and backend.requests == 1 + 3 * 2  # one rejected probe, then one per sample
    assert [len(g) for g in out] == [2, 2, 2]
    for group in out:
        for s in group:
            assert s.logprobs is None and s.extra["retokenized"] is True
            body = s.token_ids[:-1] if s.finish_reason == "stop" else s.token_ids
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == tok.eos_token_id
            assert body == tok.encode(s.text, add_special_tokens=False)


@pytest.mark.integration
def test_transformers_serve_seeds_and_stop_strings(serve, tiny_model):
    backend = load_backend("openai", str(tiny_model), base_url=serve, concurrency=1, token_prompts=False)
    prompt = _prompts(backend.tokenizer)[2]
    base = Sampling(temperature=1.0, max_tokens=40, seed=21)
    [[a]] = backend.generate([prompt], n=1, sampling=base)
    [[b]] = backend.generate([prompt], n=1, sampling=base)
    [[c]] = backend.generate([prompt], n=1, sampling=Sampling(temperature=1.0, max_tokens=40, seed=22))
    assert a.text == b.text and a.text != c.text
    text = a.text
    start = next(i for i in range(3, len(text) - 1) if text[i:i + 2].isalnum() and text[i:i + 2].isascii())
    stop = text[start:start + 2]
    [[cut]] = backend.generate([prompt], n=1, sampling=Sampling(temperature=1.0, max_tokens=40, seed=21,
                                                                   stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.text == text[:text.find(stop)]
    assert cut.token_ids == backend.tokenizer.encode(cut.text, add_special_tokens=False)  # no EOS appended


class _VLLMShaped(BaseHTTPRequestHandler):
    """/v1/completions in vLLM's token-in/token-out shape, generated by the real hf backend."""

    hf = None
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        sampling = Sampling(temperature=body["temperature"], top_p=body["top_p"], max_tokens=body["max_tokens"],
                            stop=tuple(body.get("stop") or ()), seed=body.get("seed"))
        [group] = self.hf.generate([body["prompt"]], n=body["n"], sampling=sampling)
        choices = [{"index": k, "text": s.text, "token_ids": s.token_ids, "finish_reason": s.finish_reason,
                    "stop_reason": None, "logprobs": {"token_logprobs": s.logprobs}} for k, s in enumerate(group)]
        data = json.dumps({"object": "text_completion", "choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.integration
def test_token_mode_keeps_ids_and_sampler_logprobs(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    _VLLMShaped.hf = load_backend("hf", str(tiny_model))
    _VLLMShaped.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _VLLMShaped)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = load_backend("openai", str(tiny_model), base_url=f"http://127.0.0.1:{server.server_port}/v1",
                               api_key="sk-test")
        prompts = _prompts(backend.tokenizer)
        out = backend.generate(prompts, n=3, sampling=Sampling(temperature=0.7, max_tokens=20, seed=4))
    finally:
        server.shutdown()
    assert backend.token_prompts is True and backend.requests == 3
    # Requests travel concurrently, so they reach the server in any order: match them by content.
    assert sorted(map(tuple, (b["prompt"] for b in _VLLMShaped.seen))) == sorted(map(tuple, prompts))
    assert all(b["return_token_ids"] and b["n"] == 3 and b["seed"] == 4 for b in _VLLMShaped.seen)
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()
    worst = 0.0
    for prompt, group in zip(prompts, out, strict=True):
        assert len(group) == 3
        for s in group:
            assert "retokenized" not in s.extra and len(s.logprobs) == len(s.token_ids)
            with torch.no_grad():
                logits = ref(torch.tensor([prompt + s.token_ids])).logits[0, len(prompt) - 1:-1] / 0.7
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(s.token_ids)[:, None]).squeeze(1)
            worst = max(worst, (lp - torch.tensor(s.logprobs)).abs().max().item())
    assert worst < 1e-3


@pytest.mark.integration
def test_unreachable_server_is_a_user_error(tiny_model):
    backend = load_backend("openai", str(tiny_model), base_url=f"http://127.0.0.1:{_free_port()}", timeout=5)
    with pytest.raises(SpadeError, match="cannot reach http://127.0.0.1"):
        backend.generate([[1, 2, 3]], n=1, sampling=Sampling(max_tokens=2))



class _FlakyOnce(_VLLMShaped):
    """Answers 503 to the first request, as an overloaded server would, then behaves."""

    failed = False

    def do_POST(self) -> None:  # noqa: N802
        if not _FlakyOnce.failed:
            _FlakyOnce.failed = True
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_POST()


@pytest.mark.integration
def test_server_error_is_retried(tiny_model):
    _VLLMShaped.hf = load_backend("hf", str(tiny_model))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyOnce)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        backend = load_backend("openai", str(tiny_model), base_url=url, token_prompts=True)
        [group] = backend.generate([[1, 2, 3]], n=2, sampling=Sampling(max_tokens=3, seed=0))
        assert len(group) == 2 and _FlakyOnce.failed
    finally:
        server.shutdown()
