#!/usr/bin/env bash
# real_model_cpu.sh — 1-2 iterations of the SPADE loop with a real instruct model on a CPU.
#
#   GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf bash recipes/real_model_cpu.sh   # converts first
#   MODEL=Qwen/Qwen3-0.6B RUN=runs/qwen3_cpu bash recipes/real_model_cpu.sh       # a hub checkpoint
#
# The knobs keep one iteration to minutes on a few cores: 2 designs in one group, k=1 seed pair,
# 2 turns, short token caps, no eval. GGUF=FILE runs `spade init-model --from-gguf` into
# $RUN/model/init first (dequantised, float32). THREADS goes to every stage as SPADE_THREADS
# (auto: free cores minus the sandbox workers each stage runs). Ends with `spade inspect` of each
# iteration's validated designs. Rerunnable: finished stages are "up to date".
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
VENV="${VENV:-.venv}"
export PATH="$PWD/$VENV/bin:$PATH"
export TOKENIZERS_PARALLELISM=false

RUN="${RUN:-runs/real_model_cpu}"
GGUF="${GGUF:-}"
MODEL="${MODEL:-}"
ITERS="${ITERS:-1}"
SEED="${SEED:-0}"
THREADS="${THREADS:-auto}"
DESIGN_TOKENS="${DESIGN_TOKENS:-512}"
REPLY_TOKENS="${REPLY_TOKENS:-32}"
export SPADE_THREADS="$THREADS"

if [[ -n "$GGUF" ]]; then
  MODEL="$RUN/model/init"
  spade init-model --from-gguf "$GGUF" --out "$MODEL"
fi
[[ -n "$MODEL" ]] || { echo "set MODEL (a checkpoint dir or hub id) or GGUF (a .gguf file)" >&2; exit 2; }
echo "== real_model_cpu: RUN=$RUN MODEL=$MODEL ITERS=$ITERS THREADS=$THREADS" \
     "DESIGN_TOKENS=$DESIGN_TOKENS REPLY_TOKENS=$REPLY_TOKENS" >&2

MODEL="$MODEL" RUN="$RUN" ITERS="$ITERS" SEED="$SEED" BACKEND=hf \
N_ENVS="${N_ENVS:-2}" GROUP="${GROUP:-2}" K="${K:-1}" MAX_TURNS="${MAX_TURNS:-2}" EVAL_EVERY=0 \
DESIGN_ARGS="--max-tokens $DESIGN_TOKENS --excerpt-chars 300 ${DESIGN_ARGS:-}" \
ROLLOUT_ARGS="--max-tokens $REPLY_TOKENS --no-thinking --max-concurrent 4 ${ROLLOUT_ARGS:-}" \
UPDATE_ARGS="${UPDATE_ARGS:-}" \
  bash recipes/loop.sh

for ((i = 0; i < ITERS; i++)); do  # valid and invalid designs by reason, per iteration
  spade inspect "$(spade paths "$RUN" -i "$i" --key validated)"
done
echo "== real_model_cpu finished in $((SECONDS - T0)) s; see $RUN/" >&2
