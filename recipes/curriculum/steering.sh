#!/usr/bin/env bash
# steering.sh — experiment 1: can hint-regret steer the Designer? The Agent is frozen (docs/curriculum.md).
#
#   ROOT=runs/curriculum bash recipes/curriculum/steering.sh              # arms regret shuffled frozen, seeds 0 1 2
#   ROOT=runs/curriculum SEEDS=1 ARMS=regret bash recipes/curriculum/steering.sh   # one cell (two in parallel: two SEEDS)
#   python recipes/curriculum/summarize.py steering runs/curriculum
#
# One seed's warm start (warm.sh) and its probe (probe.sh, the frozen Agent's true gain per cell),
# then ITERS iterations of recipes/loop.sh in which the Designer writes specs (--contract spec)
# and only the Designer trains (--designer-share 1):
#   regret    the Designer is paid the hint-regret of its designs, as SPADE pays it;
#   shuffled  the same, with each iteration's rewards shuffled among its valid designs
#             (`spade regret --shuffle-rewards`): validity is still paid, the cell choice is not;
#   frozen    the Designer is not trained (FROZEN_DESIGNER=1);
#   pooled    (not in the default ARMS) the regret arm with each design paid its cell's regret,
#             the episodes of the iteration's designs of one rule and level pooled
#             (`spade regret --pool-cells rule,level`): less noise, same signal.
# Every arm of a seed shares the warm start, the loop seed and so its first iteration's prompts.
# The figure: the true (probe) regret of the cells the Designer chooses, and their share in
# learnable cells, in the last iterations. Rerunnable; a stopped run resumes.
set -euo pipefail
# shellcheck source=/dev/null
source "$(dirname "${BASH_SOURCE[0]}")/space.env"   # the Designer's prompt options in the space
cd "$(dirname "$0")/../.."
ROOT="${ROOT:-runs/curriculum}" SEEDS="${SEEDS:-0 1 2}" ARMS="${ARMS:-regret shuffled frozen}"
ITERS="${ITERS:-10}" N_ENVS="${N_ENVS:-16}" K="${K:-4}" PROBE_K="${PROBE_K:-16}" MAX_TURNS="${MAX_TURNS:-6}"
LR="${LR:-1e-3}"
export ROOT MAX_TURNS
for arm in $ARMS; do
  case "$arm" in regret | shuffled | frozen | pooled) ;;
    *) echo "ARMS: regret, shuffled, frozen or pooled (got $arm)" >&2; exit 2 ;; esac
done
for SEED in $SEEDS; do
  base="$ROOT/seed$SEED"
  SEED="$SEED" bash recipes/curriculum/warm.sh
  [[ -f "$base/probe_warm/scores.jsonl.manifest.json" ]] \
    || MODEL="$base/model/warm" OUT="$base/probe_warm" K="$PROBE_K" bash recipes/curriculum/probe.sh
  for arm in $ARMS; do
    regret_args="" frozen=0
    [[ "$arm" == shuffled ]] && regret_args="--shuffle-rewards"
    [[ "$arm" == pooled ]] && regret_args="--pool-cells rule,level"
    [[ "$arm" == frozen ]] && frozen=1
    MODEL="$base/model/warm" RUN="$base/steering/$arm" ITERS="$ITERS" SEED="$SEED" N_ENVS="$N_ENVS" GROUP=4 \
    K="$K" MAX_TURNS="$MAX_TURNS" BACKEND=hf EVAL_EVERY=0 BUDGET_PAIRS="" GROUNDING=0 REPLAY=0 \
    FROZEN_DESIGNER="$frozen" REGRET_ARGS="$regret_args" \
    DESIGN_ARGS="$SPEC_DESIGN_ARGS" \
    ROLLOUT_ARGS="--max-tokens 16" UPDATE_ARGS="--learning-rate $LR --designer-share 1" \
      bash recipes/loop.sh
  done
done
