#!/usr/bin/env bash
# loop.sh — the SPADE loop: design → validate → rollout → regret → update (→ eval) for ITERS iterations.
#
#   MODEL=Qwen/Qwen3-4B RUN=runs/main bash recipes/loop.sh
#   CONFIG=recipes/ablations/no_memory.env bash recipes/loop.sh      # knobs from an env file
#
# Restartable: every stage writes its output atomically with a manifest, and a stage whose manifest
# matches its inputs and config prints "up to date" and does nothing. Rerunning this script after
# any failure (or a Slurm requeue) therefore resumes at the first incomplete stage; no step number
# is hard-coded. Every knob below can be set in the environment or in the CONFIG env file.
set -euo pipefail

if [[ -n "${CONFIG:-}" ]]; then
  # shellcheck disable=SC1090
  source "$CONFIG"
fi
if [[ -n "${SITE_ENV:-}" ]]; then
  # shellcheck disable=SC1090
  source "$SITE_ENV"   # cluster specifics (modules, caches, scratch) — see recipes/slurm/site.env.example
fi

MODEL="${MODEL:?set MODEL to the initial checkpoint (a local directory or a hub id)}"
RUN="${RUN:-runs/spade}"
ITERS="${ITERS:-400}"               # iterations to reach (the loop stops at iteration ITERS-1)
N_ENVS="${N_ENVS:-24}"              # designs per iteration
GROUP="${GROUP:-4}"                 # designs per Designer prompt (the Designer's GRPO group)
K="${K:-8}"                         # seeds per env; each played hinted and unhinted
MAX_TURNS="${MAX_TURNS:-16}"
SEED="${SEED:-0}"
BACKEND="${BACKEND:-hf}"            # hf | vllm | openai
BASE_URL="${BASE_URL:-}"            # for BACKEND=openai (a `vllm serve` fleet behind a router)
CORPUS="${CORPUS:-}"                # empty: the bundled sample corpus
GROUNDING="${GROUNDING:-1}"         # 0: --no-grounding (ablation)
MEMORY="${MEMORY:-1}"               # 0: --no-memory (ablation)
SIGNAL="${SIGNAL:-regret}"          # regret | ema_lp | learnability
REPLAY="${REPLAY:-0}"               # K past envs replayed per iteration (0: off, as in the paper)
POOL="${POOL:-}"                    # fixed-pool baseline: a pool DIR, FILE.jsonl or rg:NAMES (no Designer)
FROZEN_DESIGNER="${FROZEN_DESIGNER:-0}"  # 1: the Designer stays the initial MODEL and is not trained
EVAL_EVERY="${EVAL_EVERY:-25}"      # evaluate every E iterations (0: never)
EVAL_TASKS="${EVAL_TASKS:-rg:basic_arithmetic:50}"
EVAL_LIMIT="${EVAL_LIMIT:-}"
UPDATE_CMD="${UPDATE_CMD:-${SPADE:-spade}}"  # multi-GPU: "accelerate launch --config_file recipes/accelerate/zero2.yaml -m spade_cli"
ROLLOUT_SHARDS="${ROLLOUT_SHARDS:-1}"  # >1: rollout shards come from a Slurm array (see recipes/slurm/)
DESIGN_ARGS="${DESIGN_ARGS:-}"      # extra flags per stage, passed verbatim
VALIDATE_ARGS="${VALIDATE_ARGS:-}"
ROLLOUT_ARGS="${ROLLOUT_ARGS:-}"
REGRET_ARGS="${REGRET_ARGS:-}"
UPDATE_ARGS="${UPDATE_ARGS:-}"
EVAL_ARGS="${EVAL_ARGS:-}"
SPADE="${SPADE:-spade}"

echo "== spade loop: RUN=$RUN MODEL=$MODEL ITERS=$ITERS N_ENVS=$N_ENVS GROUP=$GROUP K=$K BACKEND=$BACKEND" \
     "SIGNAL=$SIGNAL GROUNDING=$GROUNDING MEMORY=$MEMORY REPLAY=$REPLAY POOL=${POOL:-none}" \
     "FROZEN_DESIGNER=$FROZEN_DESIGNER EVAL_EVERY=$EVAL_EVERY SEED=$SEED" >&2
mkdir -p "$RUN"

path() { "$SPADE" paths "$RUN" --iteration "$1" --key "$2"; }
backend_flags=(--backend "$BACKEND")
[[ -n "$BASE_URL" ]] && backend_flags+=(--base-url "$BASE_URL")

for ((i = 0; i < ITERS; i++)); do
  if ((i == 0)); then ckpt="$MODEL"; else ckpt="$(path "$i" ckpt)"; fi
  designer="$ckpt"
  [[ "$FROZEN_DESIGNER" == 1 ]] && designer="$MODEL"
  designs="$(path "$i" designs)"; validated="$(path "$i" validated)"; rollouts="$(path "$i" rollouts)"
  scores="$(path "$i" scores)"; memory="$(path "$i" memory)"; next="$(path "$i" next_ckpt)"
  replay_prev="$(path $((i > 0 ? i - 1 : 0)) replay)"
  eval_due=0
  ((EVAL_EVERY > 0)) && (((i + 1) % EVAL_EVERY == 0 || i + 1 == ITERS)) && eval_due=1
  eval_out="$(path $((i + 1)) eval)"
  # A finished iteration is skipped as a whole: its stages are final, and the memory has moved on
  # since (regret would rightly refuse to re-merge an old iteration into a newer memory).
  if [[ -f "$next.manifest.json" ]] && { ((eval_due == 0)) || [[ -f "$eval_out.manifest.json" ]]; }; then
    echo "== iteration $i: done" >&2
    continue
  fi
  echo "== iteration $i (model: $ckpt)" >&2

  # design: a fixed pool (baselines) or the Designer, grounded and memory-conditioned by default
  if [[ -n "$POOL" ]]; then
    design_flags=(--pool "$POOL")
  else
    design_flags=(--model "$designer" --group "$GROUP" "${backend_flags[@]}")
    if [[ "$GROUNDING" == 1 ]]; then
      [[ -n "$CORPUS" ]] && design_flags+=(--corpus "$CORPUS")
    else
      design_flags+=(--no-grounding)
    fi
    [[ "$MEMORY" == 1 && -f "$memory" ]] && design_flags+=(--memory "$memory")
  fi
  # shellcheck disable=SC2086
  "$SPADE" design "${design_flags[@]}" --n "$N_ENVS" --iteration "$i" --seed "$SEED" --out "$designs" $DESIGN_ARGS

  validate_flags=()
  [[ -f "$memory" && -z "$POOL" ]] && validate_flags+=(--memory "$memory")
  # shellcheck disable=SC2086
  "$SPADE" validate --designs "$designs" --out "$validated" "${validate_flags[@]}" $VALIDATE_ARGS

  envs=("$validated")
  ((i > 0)) && [[ -f "$replay_prev" ]] && envs+=("$replay_prev")
  if ((ROLLOUT_SHARDS > 1)); then
    # Shards are written by the Slurm array (recipes/slurm/multi_node/); wait for all of them.
    rollouts="$(path "$i" rollouts_glob)"
    n_done=$(ls "$RUN"/iter_"$(printf %04d "$i")"/rollouts.shard-*.jsonl.manifest.json 2>/dev/null | wc -l)
    if ((n_done < ROLLOUT_SHARDS)); then
      echo "waiting for $ROLLOUT_SHARDS rollout shards of iteration $i ($n_done done); submit the array" >&2
      exit 3
    fi
  else
    # shellcheck disable=SC2086
    "$SPADE" rollout --model "$ckpt" --envs "${envs[@]}" --k "$K" --max-turns "$MAX_TURNS" \
      --iteration "$i" --seed "$SEED" --out "$rollouts" "${backend_flags[@]}" $ROLLOUT_ARGS
  fi

  regret_flags=(--signal "$SIGNAL" --iteration "$i" --memory "$memory")
  ((REPLAY > 0)) && regret_flags+=(--replay "$REPLAY" --replay-out "$(path "$i" replay)")
  # shellcheck disable=SC2086
  "$SPADE" regret --envs "${envs[@]}" --rollouts "$rollouts" --out "$scores" "${regret_flags[@]}" $REGRET_ARGS

  update_flags=()
  [[ -n "$POOL" || "$FROZEN_DESIGNER" == 1 ]] && update_flags+=(--designer-weight 0)
  # shellcheck disable=SC2086
  $UPDATE_CMD update --model "$ckpt" --designs "$validated" --rollouts "$rollouts" \
    --scores "$scores" --out "$next" "${update_flags[@]}" $UPDATE_ARGS

  if ((eval_due)); then
    eval_flags=(--tasks "$EVAL_TASKS" "${backend_flags[@]}")
    [[ -n "$EVAL_LIMIT" ]] && eval_flags+=(--limit "$EVAL_LIMIT")
    # shellcheck disable=SC2086
    "$SPADE" eval --model "$next" "${eval_flags[@]}" --out "$eval_out" $EVAL_ARGS
  fi
done

"$SPADE" report "$RUN"
