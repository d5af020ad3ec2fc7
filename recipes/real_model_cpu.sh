#!/usr/bin/env bash
# real_model_cpu.sh — the loop with a real instruct model on a CPU (docs/real_models.md).
#
#   GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf bash recipes/real_model_cpu.sh
#   MODEL=Qwen/Qwen3-0.6B RUN=runs/qwen3_cpu bash recipes/real_model_cpu.sh    # with hub access
#
# The settings are recipes/real_model_cpu.toml (any key overridden by its upper-case variable); a
# GGUF file is converted first. Prints, per iteration, the valid designs and why the others failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/${VENV:-.venv}/bin:$PATH" TOKENIZERS_PARALLELISM=false SPADE_THREADS="${THREADS:-auto}"
export CONFIG="recipes/real_model_cpu.toml${CONFIG:+:$CONFIG}"
export RUN="${RUN:-runs/real_model_cpu}"
if [[ -n "${GGUF:-}" ]]; then
  export MODEL="$RUN/model/init"
  spade init-model --from-gguf "$GGUF" --out "$MODEL"
fi
[[ -n "${MODEL:-}" ]] || { echo "set MODEL (a checkpoint dir or hub id) or GGUF (a .gguf file)" >&2; exit 2; }
bash recipes/loop.sh
for it in "$RUN"/iter_[0-9]*/validated.jsonl; do spade inspect "$it"; done
