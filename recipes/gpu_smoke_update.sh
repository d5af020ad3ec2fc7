#!/usr/bin/env bash
# GPU smoke test of `spade update`: one bf16 update with gradient checkpointing (and one with LoRA)
# of the tiny model on CUDA, from hand-built fixture artifacts; then the checkpoint is loaded back.
# Exits 0 with "skipped" where no CUDA device is visible, so CI can call it everywhere.
#
#   bash recipes/gpu_smoke_update.sh                 # from the repository root
#   WORK=/scratch/smoke PYTHON=.venv/bin/python bash recipes/gpu_smoke_update.sh
set -euo pipefail

PYTHON="${PYTHON:-python}"
WORK="${WORK:-$(mktemp -d)}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_smoke_update: skipped (no CUDA device visible)"
  exit 0
fi
echo "gpu_smoke_update: work dir $WORK, $("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))')"

"$PYTHON" -m spade_cli init-model --out "$WORK/tiny" --size tiny >/dev/null
"$PYTHON" - "$WORK" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.test_update import make_artifacts
make_artifacts(Path(sys.argv[1]), Path(sys.argv[1]) / "tiny")
PY

common=(--model "$WORK/tiny" --rollouts "$WORK/rollouts.jsonl" --envs "$WORK/validated.jsonl"
        --scores "$WORK/scores.jsonl" --learning-rate 1e-4 --per-device-train-batch-size 4 --bf16)
"$PYTHON" -m spade_cli update "${common[@]}" --out "$WORK/ckpt_full" --gradient-checkpointing --beta 0.04
"$PYTHON" -m spade_cli update "${common[@]}" --out "$WORK/ckpt_lora" --lora --lora-r 8

"$PYTHON" - "$WORK" <<'PY'
import json, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
work = Path(sys.argv[1])
for name in ("ckpt_full", "ckpt_lora"):
    m = json.loads((work / name / "update.json").read_text())["metrics"]
    model = AutoModelForCausalLM.from_pretrained(work / name, dtype=torch.bfloat16).cuda()
    out = model.generate(torch.tensor([[1, 2, 3]], device="cuda"), max_new_tokens=4, do_sample=False)
    assert m["grad_norm"]["max"] > 0 and out.shape[1] == 7, (name, m)
    print(f"{name}: loss {m['loss']:.4g}, grad norm {m['grad_norm']['max']:.4g}, "
          f"{m['tokens_per_s']} tokens/s, loads and generates on CUDA")
PY
echo "gpu_smoke_update: ok"
