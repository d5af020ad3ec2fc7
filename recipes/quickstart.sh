#!/usr/bin/env bash
# quickstart.sh — the whole SPADE loop on a CPU, offline (what it shows and does not yet: docs/results.md, "The CPU quickstart").
#
#   bash recipes/quickstart.sh                 # fresh machine: sets up .venv, then runs
#   RUN=runs/qs2 ITERS=3 bash recipes/quickstart.sh
#   SMOKE=1 bash recipes/quickstart.sh         # CI: 2 short iterations, same stages
#
# 1. `spade init-model --size small`: a random 13M-parameter Qwen3 with a locally trained tokenizer.
# 2. `spade warmstart --pool family --agent-pool starter`: a short SFT of both roles in one run.
#    The Designer: WARM_EPOCHS passes over 52 generated short envs of one skeleton (spade_cli/envs/family.py)
#    as targets of the prompts `spade design` builds (the five-line contract, no document, a
#    practice memory every other pass). The Agent: the episodes of scripted solvers of the four
#    starter envs (spade_cli/envs/solvers.py), AGENT_EPISODES seeds each (a share AGENT_NOISE of their
#    replies random, none by default). 16 seeds teach the answer words and few of the rules (a
#    held-out return near 0.07), which leaves RL room; 48 beside 10 Designer passes taught most of
#    them (0.74), as 192 did alone (docs/results.md). (A real run starts from a Qwen3 checkpoint and skips this.)
# 3. A held-out suite: the starter envs, validated, played by `spade eval --tasks envs:...` on seeds
#    of their own: eval seeds come from the run seed SEED+1000, which the loop never uses, and the
#    warm start plays seeds >= 2**31, which no rollout draws. It is evaluated, sampling as rollout
#    samples (temperature 1), before the first iteration and after the last.
# 4. recipes/loop.sh for ITERS iterations: design → validate → rollout → regret → update. The
#    starter envs are played every iteration beside the designs (EXTRA_ENVS; on rollout seeds,
#    K each: BUDGET_PAIRS="", no arm here shares a budget),
#    so the Agent trains on them whatever the Designer writes (REPLAY past envs too: none by
#    default). Each Agent reply is credited with its own round's reward (AGENT_CREDIT=turn,
#    TURN_GAMMA=0). The Designer's group of 4 trains when its rewards differ: an invalid design
#    against a valid one, or two regrets.
#    Small knobs keep it to minutes on 2 cores; the defaults of loop.sh are the paper's setting.
# The last step compares the held-out returns of iteration 0 and of the last checkpoint
# (`spade eval --compare`: the difference, its z-score and the z of the per-seed differences).
# Rerunnable: every finished step is "up to date".
set -euo pipefail
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
  : "${ITERS:=2}" "${WARM_EPOCHS:=2}" "${WARM_EXAMPLES:=4}" "${AGENT_EPISODES:=4}" "${N_ENVS:=4}" "${K:=2}"
  : "${EVAL_K:=2}"
fi
ITERS="${ITERS:-3}"
WARM_EPOCHS="${WARM_EPOCHS:-10}"        # passes over the family envs as Designer targets (docs/results.md)
WARM_EXAMPLES="${WARM_EXAMPLES:-}"      # the shortest N family envs only (empty: all 52)
AGENT_EPISODES="${AGENT_EPISODES:-16}"   # solver seeds per starter env (hinted + unhinted); more left
                                         # RL no room to show on held-out seeds (docs/results.md)
AGENT_NOISE="${AGENT_NOISE:-0}"       # random replies of the solvers (0.2 made a far weaker Agent: docs/results.md)
N_ENVS="${N_ENVS:-8}" GROUP="${GROUP:-4}" K="${K:-32}" MAX_TURNS="${MAX_TURNS:-6}" REPLAY="${REPLAY:-0}"
EVAL_K="${EVAL_K:-32}"                   # held-out seeds per env
AGENT_LR="${AGENT_LR:-3e-4}"            # 1e-4 gained half as much; 1e-3 made a stronger Agent worse (docs/results.md)
# Each reply is credited with its own round's reward (the starter envs' four rounds are
# independent); AGENT_CREDIT=episode is the paper's GRPO, every reply sharing the episode's advantage.
AGENT_CREDIT="${AGENT_CREDIT:-turn}" TURN_GAMMA="${TURN_GAMMA:-0}"
AGENT_TRAIN="${AGENT_TRAIN:-both}"       # the Agent trains on its hinted episodes too (already played for regret)
DESIGN_TEMP="${DESIGN_TEMP:-0.7}"
EVAL_SEED=$((SEED + 1000))
echo "== quickstart: RUN=$RUN ITERS=$ITERS SEED=$SEED (setup took $((SECONDS - T0)) s)" >&2
t=$SECONDS
took() { echo "== $1 took $((SECONDS - t)) s" >&2; t=$SECONDS; }

spade init-model --out "$RUN/model/init" --size small --seed "$SEED"
# The Designer's prompts: the five-line contract, no document, two envs of memory (the warm start
# and the loop must build the same prompts)
PROMPT_ARGS="--contract short --no-example --memory-k 2"
# shellcheck disable=SC2086
spade warmstart --model "$RUN/model/init" --out "$RUN/model/warm" --pool family --agent-pool starter \
  --epochs "$WARM_EPOCHS" --batch-size 1 --learning-rate 2e-3 $PROMPT_ARGS --no-grounding --seed "$SEED" \
  --solver-seeds "$AGENT_EPISODES" --agent-noise "$AGENT_NOISE" --agent-max-turns "$MAX_TURNS" \
  ${WARM_EXAMPLES:+--max-examples "$WARM_EXAMPLES"}
took "init-model + warmstart"

suite="$RUN/heldout/validated.jsonl"
spade design --pool starter --n 4 --out "$RUN/heldout/designs.jsonl"
spade validate --designs "$RUN/heldout/designs.jsonl" --out "$suite"
EVAL_TASKS="${EVAL_TASKS:-envs:$suite}"
EVAL_ARGS="--seed $EVAL_SEED --k $EVAL_K --max-turns $MAX_TURNS --max-tokens 16 --temperature 1.0"
eval0="$(spade paths "$RUN" -i 0 --key eval)"
# shellcheck disable=SC2086
spade eval --model "$RUN/model/warm" --tasks "$EVAL_TASKS" --out "$eval0" $EVAL_ARGS
took "held-out suite + eval of iteration 0"

MODEL="$RUN/model/warm" RUN="$RUN" ITERS="$ITERS" SEED="$SEED" EXTRA_ENVS="$suite" \
N_ENVS="$N_ENVS" GROUP="$GROUP" K="$K" MAX_TURNS="$MAX_TURNS" REPLAY="$REPLAY" BACKEND=hf \
EVAL_EVERY="$ITERS" EVAL_TASKS="$EVAL_TASKS" EVAL_ARGS="$EVAL_ARGS" \
GROUNDING=0 DESIGN_ARGS="--temperature $DESIGN_TEMP --max-tokens 400 $PROMPT_ARGS" \
ROLLOUT_ARGS="--max-tokens 16" BUDGET_PAIRS="" \
UPDATE_ARGS="--learning-rate $AGENT_LR --agent-credit $AGENT_CREDIT --turn-gamma $TURN_GAMMA --agent-episodes $AGENT_TRAIN" \
  bash recipes/loop.sh
took "loop.sh ($ITERS iterations, the last eval and the report)"

valid0="$(spade inspect "$(spade paths "$RUN" -i 0 --key validated)" --json \
  | python3 -c 'import json, sys; d = json.load(sys.stdin); v = d["validation"]; print(v["valid"], "of", v["rows"])')"
# the table on stderr, its rows (A, B, B - A, z per metric) in compare.json
spade eval --compare "$eval0" "$(spade paths "$RUN" -i "$((ITERS - 1))" --key next_eval)" \
  > "$RUN/heldout/compare.json"
echo "== quickstart finished in $((SECONDS - T0)) s; iteration 0: $valid0 designs valid; see $RUN/report/" >&2
