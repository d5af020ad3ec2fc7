#!/usr/bin/env bash
# steering.sh — experiment 1: can hint-regret steer the Designer? The Agent is frozen (docs/curriculum.md).
#
#   ROOT=runs/curriculum SEED=0 ARM=regret bash recipes/curriculum/steering.sh    # arms: regret shuffled frozen
#   python recipes/curriculum/summarize.py steering runs/curriculum
#
# One seed's warm start (warm.sh) and its probe (probe.sh, the frozen Agent's true gain per cell),
# then ITERS iterations of recipes/loop.sh in which the Designer writes specs (--contract spec)
# and only the Designer trains (--agent-weight 0):
#   regret    the Designer is paid the hint-regret of its designs, as SPADE pays it;
#   shuffled  the same, with each iteration's rewards shuffled among its valid designs
#             (`spade regret --shuffle-rewards`): validity is still paid, the cell choice is not;
#   frozen    the Designer is not trained (FROZEN_DESIGNER=1).
# Every arm of a seed shares the warm start, the loop seed and so its first iteration's prompts.
# The figure: the true (probe) regret of the cells the Designer chooses, and their share in
# learnable cells, in the last iterations. Rerunnable; a stopped run resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="${ROOT:-runs/curriculum}" SEED="${SEED:-0}" ARM="${ARM:?set ARM to regret, shuffled or frozen}"
ITERS="${ITERS:-10}" N_ENVS="${N_ENVS:-16}" K="${K:-4}" PROBE_K="${PROBE_K:-16}" MAX_TURNS="${MAX_TURNS:-6}"
LR="${LR:-1e-3}"
export ROOT SEED MAX_TURNS
base="$ROOT/seed$SEED"
bash recipes/curriculum/warm.sh
[[ -f "$base/probe_warm/scores.jsonl.manifest.json" ]] \
  || MODEL="$base/model/warm" OUT="$base/probe_warm" K="$PROBE_K" bash recipes/curriculum/probe.sh
regret_args="" frozen=0
case "$ARM" in
  regret) ;;
  shuffled) regret_args="--shuffle-rewards" ;;
  frozen) frozen=1 ;;
  *) echo "ARM must be regret, shuffled or frozen (got $ARM)" >&2; exit 2 ;;
esac
MODEL="$base/model/warm" RUN="$base/steering/$ARM" ITERS="$ITERS" SEED="$SEED" N_ENVS="$N_ENVS" GROUP=4 \
K="$K" MAX_TURNS="$MAX_TURNS" BACKEND=hf EVAL_EVERY=0 BUDGET_PAIRS="" GROUNDING=0 REPLAY=0 \
FROZEN_DESIGNER="$frozen" REGRET_ARGS="$regret_args" \
DESIGN_ARGS="--contract spec --no-example --memory-k 4 --temperature 1.0 --max-tokens 40" \
ROLLOUT_ARGS="--max-tokens 16" UPDATE_ARGS="--learning-rate $LR --agent-weight 0" \
  bash recipes/loop.sh
