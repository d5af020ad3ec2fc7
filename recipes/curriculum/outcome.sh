#!/usr/bin/env bash
# outcome.sh — experiment 2: does the Designer's curriculum help the Agent on held-out cells? (docs/curriculum.md)
#
#   ROOT=runs/curriculum bash recipes/curriculum/outcome.sh                  # 5 arms x seeds 0 1 2, 20 iterations
#   ROOT=runs/curriculum ARMS="spade space_pool" SEEDS=0 ITERS=2 bash recipes/curriculum/outcome.sh
#
# recipes/experiment.sh over the design space, from one warm start (warm.sh, seed WARM_SEED, default
# 0: pick one whose Agent passed the gate, since a deaf Agent gives regret nothing): every arm plays
# BUDGET_PAIRS seed pairs an iteration (equal Agent budgets) and trains the Agent; the held-out
# suite (--pool space-heldout, cells no arm ever plays) is evaluated unhinted and hinted before
# the first iteration and after the last, on eval seeds of its own; `spade compare` writes the
# table with intervals over seeds to EXP/compare/ (default EXP: $ROOT/outcome). Arms:
#   spade            the Designer writes specs, paid the hint-regret, memory in its prompt
#   space_pool       the uniform static pool of the trainable cells (recipes/baselines/space_pool.env)
#   frozen_designer  the Designer's specs from the warm start, never trained
#   shuffled_regret  the Designer paid its iteration's earned rewards permuted (ablations/shuffled_regret.env)
#   no_memory        no memory in the Designer's prompt
set -euo pipefail
# shellcheck source=/dev/null
source "$(dirname "${BASH_SOURCE[0]}")/space.env"   # the Designer's prompt options in the space
cd "$(dirname "$0")/../.."
ROOT="${ROOT:-runs/curriculum}" ITERS="${ITERS:-20}" SEEDS="${SEEDS:-0 1 2}"
ARMS="${ARMS:-spade space_pool frozen_designer shuffled_regret no_memory}"
N_ENVS="${N_ENVS:-16}" K="${K:-4}" MAX_TURNS="${MAX_TURNS:-6}" LR="${LR:-3e-4}" EVAL_K="${EVAL_K:-32}"
WARM_SEED="${WARM_SEED:-0}"
export ROOT MAX_TURNS
SEED="$WARM_SEED" bash recipes/curriculum/warm.sh
suite="$ROOT/heldout/validated.jsonl"
spade design --pool space-heldout --n 6 --out "$ROOT/heldout/designs.jsonl"
spade validate --designs "$ROOT/heldout/designs.jsonl" --out "$suite"
export MODEL="$ROOT/seed$WARM_SEED/model/warm" ITERS N_ENVS K MAX_TURNS GROUP=4 BUDGET_PAIRS=$((N_ENVS * K)) \
  BACKEND=hf REPLAY=0 EVAL_EVERY="$ITERS" EVAL_TASKS="envs:$suite" \
  EVAL_ARGS="--seed 1000 --k $EVAL_K --max-turns $MAX_TURNS --max-tokens 16 --temperature 1.0" \
  DESIGN_ARGS="$SPEC_DESIGN_ARGS" \
  ROLLOUT_ARGS="--max-tokens 16" \
  UPDATE_ARGS="--learning-rate $LR --agent-credit turn --turn-gamma 0 --agent-episodes both"
CONFIG="recipes/curriculum/outcome.toml" EXP="${EXP:-$ROOT/outcome}" ARMS="$ARMS" SEEDS="$SEEDS" bash recipes/experiment.sh
