#!/usr/bin/env bash
# gpu_check.sh — the update at GPU scale in a few minutes, on a machine with no network.
#
#   bash recipes/gpu_check.sh                      # the GPUs this machine has; prints one JSON line
#   DRY=1 bash recipes/gpu_check.sh                # the CPU path with a toy shape (what the tests run)
#
# Builds a random Qwen3-shaped model of about 0.3B parameters on the device (spade's offline
# tokenizer, bf16), writes 64 random episodes of 256 + 1024 tokens, then runs two chained
# `spade update`s under `accelerate launch` (the second resumes the first one's trainer state):
# one process on one GPU; ZeRO-2 (recipes/accelerate/zero2.yaml, needs spade[deepspeed]) over all of
# them where there are more. Prints tokens/s, seconds per optimizer step, peak GPU and host memory
# and the state I/O of each update as one JSON line on stdout; the logs go to $WORK.
# DRY=1 (or no CUDA device) runs the same steps on the CPU with a toy shape and fp32: a check that the
# script works, not a measurement; its line says "dry": true.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python}"
WORK="${WORK:-$(mktemp -d)}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
DRY="${DRY:-$((gpus == 0))}"
mkdir -p "$WORK"

launch=("$PYTHON" -m accelerate.commands.launch --num_machines 1 --dynamo_backend no)
if ((DRY)); then
  shape=dry n=16 prompt=32 completion=64 batch=4
  launch+=(--cpu --num_processes 1 --mixed_precision no)
  flags=()
else
  shape=gpu n=64 prompt=256 completion=1024 batch=4
  if ((gpus > 1)); then
    launch+=(--config_file recipes/accelerate/zero2.yaml --num_processes "$gpus")
  else
    launch+=(--num_processes 1 --mixed_precision bf16)
  fi
  flags=(--bf16 --gradient-checkpointing)
fi

t0=$(date +%s)
build=$("$PYTHON" recipes/gpu_check.py build "$WORK" --shape "$shape")
"$PYTHON" recipes/gpu_check.py episodes "$WORK" --n "$n" --prompt "$prompt" --completion "$completion" >/dev/null
prev="$WORK/model"
for k in 1 2; do  # the second update resumes the first one's trainer state
  "${launch[@]}" -m spade_cli update --model "$prev" --rollouts "$WORK/rollouts.jsonl" --out "$WORK/ck$k" \
    --learning-rate 1e-6 --per-device-train-batch-size "$batch" "${flags[@]}" >"$WORK/update$k.json" \
    2>"$WORK/update$k.log" || { tail -n 40 "$WORK/update$k.log" >&2; exit 1; }
  prev="$WORK/ck$k"
done

# >>> generation hook: recipes/gpu_check_generation.sh (the vllm backend and `spade serve`) is
# called with the last checkpoint when present, and its last stdout line (JSON) joins this one.
generation=null
if [[ -f recipes/gpu_check_generation.sh ]]; then
  generation=$(WORK="$WORK" DRY="$DRY" PYTHON="$PYTHON" bash recipes/gpu_check_generation.sh "$prev" | tail -n 1)
  # anything but one JSON object (a failed check's last words) is kept as a string
  generation=$("$PYTHON" -c 'import json, sys
try:
    v = json.loads(sys.argv[1]); assert isinstance(v, dict)
except Exception:
    v = sys.argv[1] or None
print(json.dumps(v))' "$generation")
fi
# <<< generation hook

dry=false; ((DRY)) && dry=true
extra="{\"dry\": $dry, \"gpus\": $gpus, \"build\": $build, \"generation\": $generation, \"wall_s\": $(($(date +%s) - t0))}"
"$PYTHON" recipes/gpu_check.py summary "$WORK" ck1 ck2 --extra "$extra"
