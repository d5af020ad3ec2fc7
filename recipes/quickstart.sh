#!/usr/bin/env bash
# quickstart.sh — the whole SPADE loop on a CPU, offline, in a design space a small model can act on.
#
#   bash recipes/quickstart.sh                 # fresh machine: sets up .venv, then runs
#   RUN=runs/qs2 SEED=1 bash recipes/quickstart.sh
#   SMOKE=1 bash recipes/quickstart.sh         # CI: 2 short iterations, same stages
#
# A 13M model cannot write free-form environments, so here the Designer writes one-line specs of
# a design space (`spade design --contract spec`: a rule, a difficulty level, rounds, feedback)
# that spade compiles into env and hint; every stage after design is the one a real run uses
# (docs/curriculum.md, docs/quickstart.md).
# 1. `spade init-model --size small`: a random 13M-parameter Qwen3 with a locally trained tokenizer.
# 2. recipes/curriculum/warm.sh, one `spade warmstart` of both roles: the Designer on specs of the
#    trainable cells, the Agent on hinted episodes of practice envs whose cue words are random,
#    so it learns to follow a stated rule and leaves what each env's cue asks to the loop.
# 3. The held-out suite: the held-out cells (--pool space-heldout), one per rule, which no warm
#    start, pool or Designer ever plays (a spec naming one is a parse error). Evaluated unhinted and
#    hinted on eval seeds of its own (SEED+1000) before the first iteration and after the last.
# 4. recipes/loop.sh for ITERS iterations: design → validate → rollout → regret → update of both
#    roles, the Agent's replies each credited with its own round's reward.
# The last step compares the held-out returns of iteration 0 and of the last checkpoint
# (`spade eval --compare`: the difference, its z-score and the z of the per-seed differences).
# Rerunnable: every finished step is "up to date".
set -euo pipefail
# shellcheck source=/dev/null
source "$(dirname "${BASH_SOURCE[0]}")/curriculum/space.env"   # the Designer's prompt options in the space
cd "$(dirname "$0")/.."
T0=$SECONDS
VENV="${VENV:-.venv}"
[[ "$VENV" == /* ]] || VENV="$PWD/$VENV"
export VENV EXTRAS="${EXTRAS:-eval,report,sandbox}"   # what the loop needs; the tests use the dev extra
# setup.sh reinstalls spade editable on every call (seconds to minutes of pip): only a venv without
# spade gets it, unless SETUP=1 asks for it again (after a pull that changed the dependencies).
if [[ "${SETUP:-0}" == 1 || ! -x "$VENV/bin/spade" ]]; then
  bash recipes/setup.sh
else
  echo "== setup skipped: $VENV has spade (SETUP=1 reinstalls)" >&2
fi
export PATH="$VENV/bin:$PATH"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

RUN="${RUN:-runs/quickstart}"
SEED="${SEED:-0}"
if [[ "${SMOKE:-0}" == 1 ]]; then   # CI: the same stages at the smallest sizes that still run them all
  : "${ITERS:=2}" "${SIZE:=tiny}" "${WARM_EPOCHS:=1}" "${SOLVER_SEEDS:=2}" "${N_ENVS:=4}" "${K:=2}" "${EVAL_K:=2}"
fi
ITERS="${ITERS:-3}"
N_ENVS="${N_ENVS:-16}" GROUP="${GROUP:-4}" K="${K:-8}" MAX_TURNS="${MAX_TURNS:-6}"
EVAL_K="${EVAL_K:-32}"                   # held-out seeds per cell
AGENT_LR="${AGENT_LR:-3e-4}"
EVAL_SEED=$((SEED + 1000))
export SIZE WARM_EPOCHS SOLVER_SEEDS MAX_TURNS
echo "== quickstart: RUN=$RUN ITERS=$ITERS SEED=$SEED (setup took $((SECONDS - T0)) s)" >&2
t=$SECONDS
took() { echo "== $1 took $((SECONDS - t)) s" >&2; t=$SECONDS; }

DIR="$RUN/model" SEED="$SEED" bash recipes/curriculum/warm.sh
took "init-model + warmstart"

suite="$RUN/heldout/validated.jsonl"
spade design --pool space-heldout --n 6 --out "$RUN/heldout/designs.jsonl"
spade validate --designs "$RUN/heldout/designs.jsonl" --out "$suite"
EVAL_TASKS="${EVAL_TASKS:-envs:$suite}"
EVAL_ARGS="--seed $EVAL_SEED --k $EVAL_K --max-turns $MAX_TURNS --max-tokens 16 --temperature 1.0"
eval0="$(spade paths "$RUN" -i 0 --key eval)"
# shellcheck disable=SC2086
spade eval --model "$RUN/model/warm" --tasks "$EVAL_TASKS" --out "$eval0" $EVAL_ARGS
took "held-out suite + eval of iteration 0"

MODEL="$RUN/model/warm" RUN="$RUN" ITERS="$ITERS" SEED="$SEED" N_ENVS="$N_ENVS" GROUP="$GROUP" K="$K" \
MAX_TURNS="$MAX_TURNS" REPLAY=0 BACKEND=hf BUDGET_PAIRS="" GROUNDING=0 \
EVAL_EVERY="$ITERS" EVAL_TASKS="$EVAL_TASKS" EVAL_ARGS="$EVAL_ARGS" \
DESIGN_ARGS="$SPEC_DESIGN_ARGS" \
ROLLOUT_ARGS="--max-tokens 16" \
UPDATE_ARGS="--learning-rate $AGENT_LR --agent-credit turn --turn-gamma 0 --agent-episodes both" \
  bash recipes/loop.sh
took "loop.sh ($ITERS iterations, the last eval and the report)"

valid0="$(spade inspect "$(spade paths "$RUN" -i 0 --key validated)" --json \
  | python3 -c 'import json, sys; d = json.load(sys.stdin); v = d["validation"]; print(v["valid"], "of", v["rows"])')"
# the table on stderr, its rows (A, B, B - A, z per metric) in compare.json
spade eval --compare "$eval0" "$(spade paths "$RUN" -i "$((ITERS - 1))" --key next_eval)" \
  > "$RUN/heldout/compare.json"
echo "== quickstart finished in $((SECONDS - T0)) s; iteration 0: $valid0 designs valid; see $RUN/report/" >&2
