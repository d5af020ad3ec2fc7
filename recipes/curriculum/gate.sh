#!/usr/bin/env bash
# gate.sh — before any curriculum experiment: can hint-regret carry signal in the design space?
#
#   ROOT=runs/curriculum SEED=0 bash recipes/curriculum/gate.sh
#   python recipes/curriculum/summarize.py gate runs/curriculum     # the table (docs/curriculum.md)
#
# 1. The warm start of this seed (warm.sh), then its probe (probe.sh): every cell, hinted and
#    unhinted. The gate: on how many cells does the starting Agent gain >= 0.2 from the hint?
# 2. Can the Agent learn cells it fails? LEARN_ITERS iterations of recipes/loop.sh on the uniform
#    static pool of the trainable cells (POOL=space: no Designer), the Agent trained on both sides
#    of its episodes, then the probe again on the probe's own seeds. The held-out cells are never
#    played by the loop: what they gain is transfer, within a rule, to an unseen level.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="${ROOT:-runs/curriculum}" SEED="${SEED:-0}" LEARN_ITERS="${LEARN_ITERS:-4}"
K="${K:-8}" PROBE_K="${PROBE_K:-16}" MAX_TURNS="${MAX_TURNS:-6}" LR="${LR:-3e-4}"
export ROOT SEED MAX_TURNS
base="$ROOT/seed$SEED"
bash recipes/curriculum/warm.sh
MODEL="$base/model/warm" OUT="$base/probe_warm" K="$PROBE_K" bash recipes/curriculum/probe.sh
MODEL="$base/model/warm" RUN="$base/gate_learn" ITERS="$LEARN_ITERS" SEED="$SEED" POOL=space N_ENVS=24 \
K="$K" MAX_TURNS="$MAX_TURNS" BACKEND=hf EVAL_EVERY=0 BUDGET_PAIRS="" GROUNDING=0 REPLAY=0 DESIGN_ARGS="" \
ROLLOUT_ARGS="--max-tokens 16" \
UPDATE_ARGS="--learning-rate $LR --agent-credit turn --turn-gamma 0 --agent-episodes both" \
  bash recipes/loop.sh
last="$(spade paths "$base/gate_learn" -i "$((LEARN_ITERS - 1))" --key next_ckpt)"
MODEL="$last" OUT="$base/probe_learned" K="$PROBE_K" bash recipes/curriculum/probe.sh
