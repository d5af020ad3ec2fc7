#!/usr/bin/env bash
# quickstart.sh — the whole SPADE loop on a CPU, offline, in minutes.
#
#   bash recipes/quickstart.sh                 # fresh machine: sets up .venv, then runs
#   RUN=runs/qs2 ITERS=3 bash recipes/quickstart.sh
#
# 1. `spade init-model --size small`: a random 13M-parameter Qwen3 with a locally trained tokenizer.
# 2. `spade warmstart --pool starter`: a short SFT on four short example environments, so this
#    small random model writes parseable environments (a real run starts from a Qwen3 checkpoint and
#    skips this; the long-horizon bundled pool would take a 13M model ~30 min to learn on 2 cores).
# 3. recipes/loop.sh for ITERS iterations: design → validate → rollout → regret → update → eval on a
#    Reasoning Gym task, then `spade report`. Small knobs (8 designs, k=2, short turns) keep it to
#    minutes on 2 cores; the same script with the defaults of loop.sh is the paper's setting.
# Rerunnable: every finished step is "up to date".
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
VENV="${VENV:-.venv}"
export EXTRAS="${EXTRAS:-eval,report,sandbox}"   # what the loop needs; the tests use the dev extra
bash recipes/setup.sh
export PATH="$PWD/$VENV/bin:$PATH"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

RUN="${RUN:-runs/quickstart}"
ITERS="${ITERS:-2}"
SEED="${SEED:-0}"
WARM_EPOCHS="${WARM_EPOCHS:-80}"
echo "== quickstart: RUN=$RUN ITERS=$ITERS SEED=$SEED (setup took $((SECONDS - T0)) s)" >&2

spade init-model --out "$RUN/model/init" --size small --seed "$SEED"
spade warmstart --model "$RUN/model/init" --out "$RUN/model/warm" --pool starter --epochs "$WARM_EPOCHS" \
  --batch-size 1 --learning-rate 2e-3 --excerpt-chars 300 --no-example --seed "$SEED"

MODEL="$RUN/model/warm" RUN="$RUN" ITERS="$ITERS" SEED="$SEED" \
N_ENVS="${N_ENVS:-8}" GROUP="${GROUP:-4}" K="${K:-2}" MAX_TURNS="${MAX_TURNS:-4}" BACKEND=hf \
EVAL_EVERY=1 EVAL_TASKS="${EVAL_TASKS:-rg:basic_arithmetic:8}" \
DESIGN_ARGS="--temperature 1.0 --top-p 0.9 --max-tokens 700 --excerpt-chars 300 --no-example" \
ROLLOUT_ARGS="--max-new-tokens 48" \
EVAL_ARGS="--max-tokens 32" \
  bash recipes/loop.sh

valid0="$(spade inspect "$(spade paths "$RUN" -i 0 --key validated)" --json \
  | python3 -c 'import json, sys; d = json.load(sys.stdin); v = d["validation"]; print(v["valid"], "of", v["rows"])')"
echo "== quickstart finished in $((SECONDS - T0)) s; iteration 0: $valid0 designs valid; see $RUN/report/" >&2
