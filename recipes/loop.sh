#!/usr/bin/env bash
# loop.sh — the SPADE loop: design → validate → rollout → regret → update (→ eval) for ITERS iterations.
#
#   MODEL=Qwen/Qwen3-4B RUN=runs/main bash recipes/loop.sh
#   CONFIG=recipes/ablations/no_memory.env bash recipes/loop.sh      # knobs from an env file
#   ENGINE=serve MODEL=Qwen/Qwen3-8B RUN=runs/one bash recipes/loop.sh # one vLLM server for the run
#
# Restartable: every stage writes its output atomically with a manifest, and a stage whose manifest
# matches its inputs and config prints "up to date" and does nothing. No file is ever changed in
# place (the memory is a new file per iteration: memory/iter_0007.jsonl is what iteration 7 reads,
# its regret writes memory/iter_0008.jsonl), so every stage of a rerun sees exactly the inputs of
# the first run. Rerunning this script after any failure, kill or Slurm requeue therefore resumes at
# the first incomplete stage and ends with the artifacts of an uninterrupted run; no step number is
# hard-coded. Every knob below can be set in the environment or in the CONFIG env file.
#
# SIGTERM (Slurm's time-limit and preemption signal) is passed to the running stage, which stops at
# a unit boundary and keeps its work as a resumable partial; the loop then exits 75 (EX_TEMPFAIL),
# which the sbatch recipes answer with a requeue. Any other failure exits with the stage's code.
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
MEMORY="${MEMORY:-1}"               # 0: design without --memory (ablation)
SIGNAL="${SIGNAL:-regret}"          # regret | ema_lp | learnability
REPLAY="${REPLAY:-0}"               # K past envs replayed per iteration (0: off, as in the paper)
EXTRA_ENVS="${EXTRA_ENVS:-}"        # validated files played every iteration beside the designs (empty: off, as in the paper)
POOL="${POOL:-}"                    # fixed-pool baseline: a pool DIR, FILE.jsonl or rg:NAMES (no Designer)
FROZEN_DESIGNER="${FROZEN_DESIGNER:-0}"  # 1: the Designer stays the initial MODEL and is not trained
EVAL_EVERY="${EVAL_EVERY:-25}"      # evaluate every E iterations, and MODEL itself first (0: never)
EVAL_TASKS="${EVAL_TASKS:-rg:basic_arithmetic:50}"
EVAL_LIMIT="${EVAL_LIMIT:-}"
UPDATE_CMD="${UPDATE_CMD:-${SPADE:-spade}}"  # multi-GPU: "accelerate launch --config_file recipes/accelerate/zero2.yaml -m spade_cli"
ROLLOUT_SHARDS="${ROLLOUT_SHARDS:-1}"  # >1: rollout shards come from a Slurm array (see recipes/slurm/)
# The Designer samples in Qwen3's thinking mode with the model card's settings (temperature 0.6,
# top-p 0.95, top-k 20; greedy decoding is advised against). Budgets, spade's choice: 4096 reasoning
# tokens, then 4096 for the answer (the --max-tokens default: a complete env module and its hint);
# a block that runs out is closed by spade and masked out of the Designer's update. Setting
# DESIGN_ARGS, even to "", replaces all of these (the quickstart and the tests do); a POOL ignores them.
QWEN3_DESIGN="--thinking --temperature 0.6 --top-p 0.95 --top-k 20 --think-tokens 4096"
QWEN3_DESIGN+=" --answer-tokens 4096 --think-overflow close"
DESIGN_ARGS="${DESIGN_ARGS-$QWEN3_DESIGN}"  # extra flags per stage, passed verbatim
VALIDATE_ARGS="${VALIDATE_ARGS:-}"
# The Agent samples as Qwen3 (4B/8B/30B-A3B) runs in thinking mode: its model cards recommend
# temperature 0.6, top-p 0.95, top-k 20 (min-p 0) and warn against greedy decoding. The budgets are
# spade's choice for multi-turn play inside rollout's episode context (--max-episode-tokens): 1024
# reasoning and 512 answer tokens a turn; a block that runs out is closed by spade (masked out of
# training); earlier reasoning leaves the context as Qwen3's template drops it. Setting ROLLOUT_ARGS,
# even to "", replaces all of these (the quickstart and the tests do).
QWEN3_ROLLOUT="--temperature 0.6 --top-p 0.95 --top-k 20 --think-tokens 1024 --answer-tokens 512"
QWEN3_ROLLOUT+=" --think-overflow close --think-context auto"
ROLLOUT_ARGS="${ROLLOUT_ARGS-$QWEN3_ROLLOUT}"
REGRET_ARGS="${REGRET_ARGS:-}"
UPDATE_ARGS="${UPDATE_ARGS:-}"
# >>> retention (spade prune, docs/update.md "Retention"): PRUNE=0 keeps everything; PRUNE_ARGS e.g.
# "--keep-ckpts 3 --keep-state-every 50" (default: the latest trainer state, 2 checkpoints, eval points)
PRUNE="${PRUNE:-1}" PRUNE_ARGS="${PRUNE_ARGS:-}"  # <<< retention
PIPELINE="${PIPELINE:-0}"           # 1: pipelined iterations (docs/pipeline.md; off: the paper is on-policy)
STALENESS="${STALENESS:-1}"         # with PIPELINE=1: iteration i samples from checkpoint i-STALENESS
# Eval samples as the Qwen3 model card evaluates thinking mode: temperature 0.6, top-p 0.95, top-k
# 20, and 32768 output tokens ("adequate output length"), split here into 30720 reasoning and 2048
# answer tokens, a block that runs out closed by spade. lm: and evalscope: tasks generate in their
# own harness in one phase and refuse the budgets, so a task list with them gets the sampling only.
QWEN3_EVAL="--temperature 0.6 --top-p 0.95 --top-k 20"
case ",${EVAL_TASKS// /}" in
  *,lm:* | *,evalscope:*) ;;
  *) QWEN3_EVAL+=" --think-tokens 30720 --answer-tokens 2048 --think-overflow close" ;;
esac
EVAL_ARGS="${EVAL_ARGS-$QWEN3_EVAL}"  # setting it, even to "", replaces these
SPADE="${SPADE:-spade}"
# --- one engine (ENGINE=serve; docs/backends.md) ------------------------------------------------
# One `spade serve` server lives for the run: each stage first has it load the checkpoint the stage
# samples from (a no-op when it already serves it), design, rollout and eval sample through it, and
# it sleeps (releases its GPU memory) while the update trains. A rerun finds the server in
# RUN/serve/server.json, or starts a new one, and loads the right checkpoint. With PIPELINE=1 the
# generation lane owns it on GEN_DEVICES and it never sleeps (recipes/loop_pipelined.sh).
ENGINE="${ENGINE:-}"                # serve | empty (each stage loads its own backend)
SERVE_PORT="${SERVE_PORT:-8000}"
SERVE_ARGS="${SERVE_ARGS:-}"        # engine flags of the server, e.g. --tensor-parallel-size 2; --vllm-python PY
[[ -z "$ENGINE" || "$ENGINE" == serve ]] || { echo "ENGINE must be serve or empty, got '$ENGINE'" >&2; exit 2; }
if [[ "$ENGINE" == serve ]]; then
  BACKEND=openai BASE_URL="http://127.0.0.1:$SERVE_PORT/v1"
fi
serve_flags=()                      # the pipelined loop's server never sleeps: --no-sleep-mode
serve_load() {  # CKPT ITERATION: make the run's server serve CKPT
  [[ "$ENGINE" == serve ]] || return 0
  # shellcheck disable=SC2086
  stage "$SPADE" serve --run-dir "$RUN" --model "$1" --port "$SERVE_PORT" --iteration "$2" "${serve_flags[@]}" \
    $SERVE_ARGS >/dev/null
}
serve_sleep() {
  [[ "$ENGINE" == serve ]] || return 0
  # level 2 drops the weights rather than parking them in host memory (the data-parallel engines'
  # copies add up, beside the update's own host peak): the next load reads a new checkpoint anyway
  stage "$SPADE" serve --run-dir "$RUN" --do sleep --level 2 --iteration "$1" >/dev/null
}
# --- end one engine ------------------------------------------------------------------------------

# --- experiment settings (recipes/experiment.sh, recipes/baselines/static_pool.sh) ---------------
# The Agent's budget: BUDGET_PAIRS seed pairs an iteration (2 episodes each), split over however many
# envs are valid, so that every arm plays the same number of episodes (docs/report.md); "": K per env.
BUDGET_PAIRS="${BUDGET_PAIRS-$((N_ENVS * K))}"
budget_flags=()
[[ -n "$BUDGET_PAIRS" ]] && budget_flags=(--budget-pairs "$BUDGET_PAIRS")
# PRINT_SETTINGS=1: print the resolved settings as JSON and exit. This file is their one source of
# truth: the baselines read them from here and experiment.sh stores them as each cell's settings.json.
SHARED_SETTINGS=(MODEL ITERS N_ENVS GROUP K BUDGET_PAIRS MAX_TURNS SEED BACKEND BASE_URL CORPUS REPLAY EXTRA_ENVS
  EVAL_EVERY EVAL_TASKS EVAL_LIMIT DESIGN_ARGS VALIDATE_ARGS ROLLOUT_ARGS REGRET_ARGS UPDATE_ARGS EVAL_ARGS
  UPDATE_CMD ROLLOUT_SHARDS PIPELINE STALENESS ENGINE SERVE_ARGS)
ARM_SETTINGS=(POOL FROZEN_DESIGNER SIGNAL GROUNDING MEMORY)
if [[ "${PRINT_SETTINGS:-0}" == 1 ]]; then
  for k in "${SHARED_SETTINGS[@]}" "${ARM_SETTINGS[@]}"; do export "${k?}"; done
  exec python3 -c 'import json, os, sys; print(json.dumps({k: os.environ[k] for k in sys.argv[1:]}, indent=1))' \
    "${SHARED_SETTINGS[@]}" "${ARM_SETTINGS[@]}"
fi
# --- end experiment settings ----------------------------------------------------------------------

# --- the flags both loops give their stages (recipes/loop_pipelined.sh calls these too); each reads
# the paths of its iteration that `eval "$(spade paths ...)"` set ---------------------------------
design_flags_for() {  # DESIGNER: a fixed pool (baselines) or the Designer, grounded and with memory
  if [[ -n "$POOL" ]]; then
    design_flags=(--pool "$POOL")
    return 0
  fi
  design_flags=(--model "$1" --group "$GROUP" --signal "$SIGNAL" "${backend_flags[@]}")
  if [[ "$GROUNDING" == 1 ]]; then
    [[ -z "$CORPUS" ]] || design_flags+=(--corpus "$CORPUS")
  else
    design_flags+=(--no-grounding)
  fi
  # the memory of this iteration: absent in iteration 0, and never changed once written
  [[ "$MEMORY" != 1 || ! -f "$memory" ]] || design_flags+=(--memory "$memory")
}
envs_of() {  # I: what iteration I plays (rollout's --envs; a repeated flag: typer takes one value
  # per --envs) and the --played of its regret: the replays and the fixed set are played and trained
  # on, never scored as designs (docs/regret.md, "Played envs")
  envs=(--envs "$validated") played=()
  if (($1 > 0)) && [[ -f "$prev_replay" ]]; then envs+=(--envs "$prev_replay") played+=(--played "$prev_replay"); fi
  # a fixed set mixed into every iteration (the quickstart's starter envs); an env that is also a
  # design or a replay is played once
  for extra in $EXTRA_ENVS; do envs+=(--envs "$extra") played+=(--played "$extra"); done
}
design_and_validate() {  # I DESIGNER: iteration I's designs (with ENGINE=serve, DESIGNER loaded first) and their verdicts
  design_flags_for "$2"
  [[ -n "$POOL" || -f "$designs.manifest.json" ]] || serve_load "$2" "$1"
  # shellcheck disable=SC2086
  stage "$SPADE" design "${design_flags[@]}" --n "$N_ENVS" --iteration "$1" --seed "$SEED" --out "$designs" $DESIGN_ARGS
  validate_flags=()
  [[ -f "$memory" && -z "$POOL" ]] && validate_flags+=(--memory "$memory")
  # shellcheck disable=SC2086
  stage "$SPADE" validate --designs "$designs" --out "$validated" "${validate_flags[@]}" $VALIDATE_ARGS
}
# --- end shared flags -----------------------------------------------------------------------------

# >>> loop mode (docs/pipeline.md): a run dir holds one mode; PIPELINE=1 continues in loop_pipelined.sh
source "$(dirname "${BASH_SOURCE[0]}")/loop_mode.sh"
# <<< loop mode

echo "== spade loop: RUN=$RUN MODEL=$MODEL ITERS=$ITERS N_ENVS=$N_ENVS GROUP=$GROUP K=$K BACKEND=$BACKEND" \
     "SIGNAL=$SIGNAL GROUNDING=$GROUNDING MEMORY=$MEMORY REPLAY=$REPLAY POOL=${POOL:-none}" \
     "FROZEN_DESIGNER=$FROZEN_DESIGNER EVAL_EVERY=$EVAL_EVERY SEED=$SEED ENGINE=${ENGINE:-per-stage}" >&2
mkdir -p "$RUN"

backend_flags=(--backend "$BACKEND")
[[ -n "$BASE_URL" ]] && backend_flags+=(--base-url "$BASE_URL")
eval_flags=(--tasks "$EVAL_TASKS" "${backend_flags[@]}")
[[ -n "$EVAL_LIMIT" ]] && eval_flags+=(--limit "$EVAL_LIMIT")

# Each stage runs in the background so that this shell can take SIGTERM while it runs (bash runs a
# trap only between commands) and hand it on; `wait` returns early on a trapped signal, so it is
# repeated until the stage has really exited.
child="" stop=0
trap 'stop=1; [[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true' TERM
stage() {
  local rc=0
  "$@" &
  child=$!
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
  child=""
  if ((stop)); then echo "== SIGTERM: stopped at a unit boundary; rerun to resume" >&2; exit 75; fi
  return "$rc"
}

for ((i = 0; i < ITERS; i++)); do
  ((stop == 0)) || exit 75
  # sets $designs $validated $rollouts $rollouts_glob $scores $replay $prev_replay $memory
  # $next_memory $ckpt $next_ckpt $prev_ckpt $lp_before $eval $next_eval $iter_dir: one `spade paths` per iteration, because
  # each start of `spade` costs about a second
  eval "$("$SPADE" paths "$RUN" --iteration "$i" --shell)"
  ((i == 0)) && ckpt="$MODEL"
  designer="$ckpt"
  [[ "$FROZEN_DESIGNER" == 1 ]] && designer="$MODEL"
  next="$next_ckpt" eval_out="$next_eval"
  if ((i == 0 && EVAL_EVERY > 0)) && [[ ! -f "$eval.manifest.json" ]]; then
    # the starting point of every arm's curve: eval/iter_0000 is MODEL, before any update
    serve_load "$MODEL" "$i"
    # shellcheck disable=SC2086
    stage "$SPADE" eval --model "$MODEL" "${eval_flags[@]}" --out "$eval" $EVAL_ARGS
  fi
  eval_due=0
  ((EVAL_EVERY > 0)) && (((i + 1) % EVAL_EVERY == 0 || i + 1 == ITERS)) && eval_due=1
  # A finished iteration is skipped as a whole, only to save the seconds of "up to date" checks:
  # every artifact is write-once, so running its stages again would change nothing.
  if [[ -f "$next.manifest.json" ]] && { ((eval_due == 0)) || [[ -f "$eval_out.manifest.json" ]]; }; then
    echo "== iteration $i: done" >&2
    continue
  fi
  echo "== iteration $i (model: $ckpt)" >&2

  design_and_validate "$i" "$designer"
  envs_of "$i"
  if ((ROLLOUT_SHARDS > 1)); then
    # Shards are written by the Slurm array (recipes/slurm/multi_node/); wait for all of them.
    # the names of this array's N shards, from the one place that derives paths
    rollouts="$("$SPADE" paths "$RUN" --iteration "$i" --shard "0/$ROLLOUT_SHARDS" --key rollout_shards_glob)"
    n_done=$( { compgen -G "$rollouts.manifest.json" || true; } | wc -l)
    if ((n_done < ROLLOUT_SHARDS)); then
      echo "waiting for $ROLLOUT_SHARDS rollout shards of iteration $i ($n_done done); submit the array" >&2
      exit 3
    fi
  else
    [[ -f "$rollouts.manifest.json" ]] || serve_load "$ckpt" "$i"
    # shellcheck disable=SC2086
    stage "$SPADE" rollout --model "$ckpt" "${envs[@]}" --k "$K" --max-turns "$MAX_TURNS" \
      --iteration "$i" --seed "$SEED" --out "$rollouts" "${backend_flags[@]}" "${budget_flags[@]}" $ROLLOUT_ARGS
  fi

  # --- ema_lp: the previous checkpoint plays the same envs on the same seeds (docs/regret.md) -------
  lp_flags=()
  if [[ "$SIGNAL" == ema_lp ]] && ((i > 0)); then
    before_model="$prev_ckpt"
    ((i == 1)) && before_model="$MODEL"
    [[ -f "$lp_before.manifest.json" ]] || serve_load "$before_model" "$i"
    # shellcheck disable=SC2086
    stage "$SPADE" rollout --model "$before_model" "${envs[@]}" --k "$K" --max-turns "$MAX_TURNS" \
      --iteration "$i" --seed "$SEED" --out "$lp_before" "${backend_flags[@]}" "${budget_flags[@]}" $ROLLOUT_ARGS
    lp_flags=(--before-rollouts "$lp_before")
  fi
  # --- end ema_lp -----------------------------------------------------------------------------------

  # regret reads the memory as of iteration i and writes the memory after it as a new file
  regret_flags=(--signal "$SIGNAL" --iteration "$i" --memory-out "$next_memory" "${lp_flags[@]}")
  [[ -f "$memory" ]] && regret_flags+=(--memory "$memory")
  ((REPLAY > 0)) && regret_flags+=(--replay "$REPLAY" --replay-out "$replay")
  # shellcheck disable=SC2086
  stage "$SPADE" regret --envs "$validated" "${played[@]}" --rollouts "$rollouts" --out "$scores" \
    "${regret_flags[@]}" $REGRET_ARGS

  update_flags=()
  [[ -n "$POOL" || "$FROZEN_DESIGNER" == 1 ]] && update_flags+=(--designer-share 0)
  [[ -f "$next.manifest.json" ]] || serve_sleep "$i"
  # shellcheck disable=SC2086
  stage $UPDATE_CMD update --model "$ckpt" --envs "$validated" --rollouts "$rollouts" \
    --scores "$scores" --out "$next" "${update_flags[@]}" $UPDATE_ARGS

  if ((eval_due)); then
    [[ -f "$eval_out.manifest.json" ]] || serve_load "$next" "$((i + 1))"
    # shellcheck disable=SC2086
    stage "$SPADE" eval --model "$next" "${eval_flags[@]}" --out "$eval_out" $EVAL_ARGS
  fi
  # shellcheck disable=SC2086  # retention, after the update and its evaluation (one line)
  [[ "$PRUNE" == 0 ]] || stage "$SPADE" prune "$RUN" -i "$i" --eval-every "$EVAL_EVERY" $PRUNE_ARGS
done

[[ "$ENGINE" != serve ]] || stage "$SPADE" serve --run-dir "$RUN" --do stop >/dev/null
stage "$SPADE" report "$RUN"
