"""`spade serve` on the real engine (opt-in tier: ``bash recipes/test_vllm_cpu.sh``).

The community ``vllm-cpu`` build serves the tiny model; a second checkpoint with other weights is
loaded into the running server; the served log-probs must then be the new checkpoint's (checked
against a float32 transformers recomputation, and unlike the old one's: a reload that kept stale
weights fails here), and a stage pointed at the old checkpoint is refused.
"""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest

from spade_cli.backends import Sampling, load_backend, preflight, render_chat
from spade_cli.core.artifacts import SpadeError
from tests.conftest import run_spade
from tests.test_serve import untied

pytestmark = [pytest.mark.vllm_cpu,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm is not installed: run bash recipes/test_vllm_cpu.sh")]
TOLERANCE = 1e-3  # the vllm tier's bound for processed log-probs against float32 transformers


def _recompute(model_dir: Path, prompt: list[int], ids: list[int], temperature: float) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()


def test_serve_loads_a_new_checkpoint_without_restart(tiny_model, tmp_path):
    from spade_cli.models import tinymodel

    first = untied(tiny_model, tmp_path / "ckpt" / "iter_0000")  # an LM head of its own, as Qwen3-8B
    tinymodel.build(tmp_path / "tied_0001", size="tiny", seed=1)  # same tokenizer, other weights
    other = untied(tmp_path / "tied_0001", tmp_path / "ckpt" / "iter_0001")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    common = ["serve", "--run-dir", run, "--port", str(port), "--dtype", "float32", "--enforce-eager",
              "--max-model-len", "512", "--gpu-memory-utilization", "0.3", "--wait", "600"]
    res = run_spade(*common, "--model", first, "--iteration", "0")
    assert res.returncode == 0, res.stderr[-3000:] + (run / "serve" / "server.log").read_text()[-3000:]
    started = json.loads(res.stdout)
    try:
        assert started["action"] == "start"
        backend = load_backend("openai", str(first), base_url=started["url"])
        info = preflight(backend, Sampling(temperature=0.7, top_p=0.9))
        assert info["server"]["verified"] and info["logprobs"] == "processed"
        prompt = render_chat(backend.tokenizer, [{"role": "user", "content": "Count to five."}])
        sampling = Sampling(temperature=0.7, max_tokens=16, seed=3)

        res = run_spade(*common, "--model", other, "--iteration", "1")
        assert res.returncode == 0, res.stderr[-3000:] + (run / "serve" / "server.log").read_text()[-3000:]
        loaded = json.loads(res.stdout)
        assert loaded["action"] == "load" and loaded["pid"] == started["pid"], loaded  # no restart

        new = load_backend("openai", str(other), base_url=started["url"])
        assert preflight(new, None)["server"]["verified"]
        [[sample]] = new.generate([prompt], n=1, sampling=sampling)
        want_new = _recompute(other, prompt, sample.token_ids, 0.7)
        want_old = _recompute(first, prompt, sample.token_ids, 0.7)
        worst = max(abs(a - b) for a, b in zip(sample.logprobs, want_new, strict=True))
        assert worst < TOLERANCE, f"served log-probs differ from the new checkpoint's by {worst}"
        assert max(abs(a - b) for a, b in zip(sample.logprobs, want_old, strict=True)) > 10 * TOLERANCE
        with pytest.raises(SpadeError, match="not --model"):
            preflight(load_backend("openai", str(first), base_url=started["url"]), None)
        events = [json.loads(x) for x in (run / "serve" / "events.jsonl").read_text().splitlines()]
        print("serve events:", events)  # start and load seconds, read by the tier's log
    finally:
        run_spade("serve", "--run-dir", run, "--do", "stop")
