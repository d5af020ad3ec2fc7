#!/usr/bin/env bash
# warm.sh — the starting model of the design-space experiments: both roles warm-started (docs/curriculum.md).
#
#   ROOT=runs/curriculum SEED=0 bash recipes/curriculum/warm.sh    # -> $ROOT/seed0/model/warm
#   DIR=runs/quickstart/model SEED=0 bash recipes/curriculum/warm.sh
#
# A random 13M Qwen3 (`spade init-model --size small`), then one `spade warmstart`: the Designer
# learns the spec format over the trainable cells (`--pool space --contract spec`), the Agent
# learns to follow a stated rule from hinted episodes of practice envs whose cues are random
# (`--agent-pool space-practice`), so what it does without the hint is left to the loop to teach.
# Every arm of one seed starts from this checkpoint. Rerunnable: a finished step is "up to date".
set -euo pipefail
# shellcheck source=/dev/null
source "$(dirname "${BASH_SOURCE[0]}")/space.env"   # the Designer's prompt options in the space
ROOT="${ROOT:-runs/curriculum}" SEED="${SEED:-0}"
WARM_EPOCHS="${WARM_EPOCHS:-16}" SOLVER_SEEDS="${SOLVER_SEEDS:-16}" MAX_TURNS="${MAX_TURNS:-6}"
SIZE="${SIZE:-small}"                 # tiny: the smoke tests' size
dir="${DIR:-$ROOT/seed$SEED/model}"     # init/ and warm/ go here (the quickstart: RUN/model)
spade init-model --out "$dir/init" --size "$SIZE" --seed "$SEED"
# shellcheck disable=SC2086
spade warmstart --model "$dir/init" --out "$dir/warm" --pool space --agent-pool space-practice \
  $SPEC_PROMPT_ARGS --no-grounding --epochs "$WARM_EPOCHS" --batch-size 4 \
  --learning-rate 2e-3 --solver-seeds "$SOLVER_SEEDS" --agent-max-turns "$MAX_TURNS" --seed "$SEED"
