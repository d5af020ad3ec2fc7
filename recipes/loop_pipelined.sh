#!/usr/bin/env bash
# loop_pipelined.sh — the SPADE loop with pipelined iterations: iteration i+1 generates while update(i) trains.
#
#   PIPELINE=1 MODEL=Qwen/Qwen3-4B RUN=runs/piped bash recipes/loop.sh
#   PIPELINE=1 GEN_DEVICES=0,1,2,3 TRAIN_DEVICES=4,5,6,7 ... bash recipes/loop.sh   # one node, GPUs split
#   ENGINE=serve PIPELINE=1 GEN_DEVICES=0,1,2,3,4,5 TRAIN_DEVICES=6,7 ... bash recipes/loop.sh  # one server
#
# loop.sh sources this file after reading every knob (MODEL, RUN, ITERS, the *_ARGS, ...; see there)
# and checking the run directory's mode (recipes/loop_mode.sh); run directly, it goes through loop.sh.
# What changes (docs/pipeline.md): with STALENESS=1, design, validate, rollout and regret of
# iteration i+1 run with checkpoint i while update(i) trains checkpoint i+1 on other devices;
# update(i+1) then trains checkpoint i+1 on samples that checkpoint i drew, one update behind,
# corrected by the update's truncated importance sampling against the stored sampler log-probs, and
# refused beyond the bound (`spade update --max-staleness`). Iteration i samples from checkpoint
# max(i - STALENESS, 0). Each update records in update.json and its manifest which checkpoint drew
# its samples and how far behind it was; `spade report` shows it.
#
# Two lanes: generation (eval of a new checkpoint, then design → validate → rollout → regret of the
# iterations whose sampler exists) in the foreground, and the update in the background. Every stage
# reads only write-once artifacts fixed by the schedule above, never by timing, so a rerun after any
# kill ends with the artifacts of an uninterrupted pipelined run. SIGTERM goes to both lanes; each
# stops at a unit boundary, and the loop exits 75 once both have.
set -euo pipefail
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  PIPELINE=1 exec bash "$(dirname "$0")/loop.sh" "$@"
fi
GEN_DEVICES="${GEN_DEVICES:-}"      # CUDA_VISIBLE_DEVICES of design, rollout and eval (empty: inherited)
TRAIN_DEVICES="${TRAIN_DEVICES:-}"  # CUDA_VISIBLE_DEVICES of the update (empty: inherited)
# >>> one engine, pipelined (ENGINE=serve; docs/pipeline.md): the generation lane owns the run's server
# on GEN_DEVICES. It holds its weights and KV cache there for the whole run and never sleeps, since
# the update trains beside it, so the two lanes must not share a GPU: with GPUs visible, ENGINE=serve
# needs GEN_DEVICES and TRAIN_DEVICES both set and disjoint (single_node.sbatch sets them from
# TRAIN_GPUS); on CPU, with neither set, both lanes share the host. Anything else is refused.
gpu_ids() {  # the GPUs this shell may use, as CUDA sees them (CUDA_VISIBLE_DEVICES, else nvidia-smi)
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    [[ "$CUDA_VISIBLE_DEVICES" == -* ]] || echo "${CUDA_VISIBLE_DEVICES//,/ }"
  elif command -v nvidia-smi >/dev/null; then
    nvidia-smi -L 2>/dev/null | awk '/^GPU /{printf "%d ", n++}'
  fi
}
if [[ "$ENGINE" == serve ]]; then
  shared=""
  for d in ${GEN_DEVICES//,/ }; do [[ ",$TRAIN_DEVICES," != *",$d,"* ]] || shared+=" $d"; done
  read -ra gpus <<<"$(gpu_ids)"
  if [[ -n "$GEN_DEVICES" && -n "$TRAIN_DEVICES" && -z "$shared" ]]; then
    serve_flags=(--no-sleep-mode)
  elif [[ -z "$GEN_DEVICES$TRAIN_DEVICES" ]] && ((${#gpus[@]} == 0)); then
    serve_flags=(--no-sleep-mode)  # CPU: no device memory to split
  else
    n=${#gpus[@]} half=$(((${#gpus[@]} + 1) / 2))
    if ((n >= 2)); then
      fix="give each lane its own GPUs, e.g. GEN_DEVICES=$(IFS=,; echo "${gpus[*]:0:half}")"
      fix+=" TRAIN_DEVICES=$(IFS=,; echo "${gpus[*]:half}") (and UPDATE_CMD's --num_processes to match;"
      fix+=" recipes/slurm/single_node.sbatch splits the node by TRAIN_GPUS)"
    elif ((n == 1)); then
      fix="one GPU cannot hold both: run ENGINE=serve sequentially (PIPELINE=0; its server sleeps during the update)"
    else
      fix="on CPU set neither, elsewhere both, disjoint"
    fi
    echo "ENGINE=serve with PIPELINE=1: the server holds GEN_DEVICES for the whole run while the update trains" \
         "on TRAIN_DEVICES, and here the two would share devices (GEN_DEVICES=${GEN_DEVICES:-all}" \
         "TRAIN_DEVICES=${TRAIN_DEVICES:-all}${shared:+; both have${shared}}): $fix" >&2
    exit 2
  fi
fi
# <<< one engine, pipelined
if ((ROLLOUT_SHARDS > 1)); then
  echo "PIPELINE=1 plays rollouts in this loop; a rollout array is recipes/slurm/multi_node/driver.sh's" \
       "(PIPELINE=1 there too)" >&2
  exit 2
fi

echo "== spade loop (pipelined, staleness $STALENESS): RUN=$RUN MODEL=$MODEL ITERS=$ITERS N_ENVS=$N_ENVS" \
     "GROUP=$GROUP K=$K BACKEND=$BACKEND SIGNAL=$SIGNAL GROUNDING=$GROUNDING MEMORY=$MEMORY REPLAY=$REPLAY" \
     "POOL=${POOL:-none} FROZEN_DESIGNER=$FROZEN_DESIGNER EVAL_EVERY=$EVAL_EVERY SEED=$SEED" \
     "GEN_DEVICES=${GEN_DEVICES:-all} TRAIN_DEVICES=${TRAIN_DEVICES:-all} ENGINE=${ENGINE:-per-stage}" >&2

backend_flags=(--backend "$BACKEND")
[[ -n "$BASE_URL" ]] && backend_flags+=(--base-url "$BASE_URL")
eval_flags=(--tasks "$EVAL_TASKS" "${backend_flags[@]}")
[[ -n "$EVAL_LIMIT" ]] && eval_flags+=(--limit "$EVAL_LIMIT")

# As in loop.sh, stages run in the background so that this shell takes SIGTERM between commands and
# hands it on, here to both lanes: `child` the generation stage, `upd` the update.
child="" upd="" stop=0
trap 'stop=1; for p in $child $upd; do kill -TERM "$p" 2>/dev/null || true; done' TERM
reap() {  # reap PID: wait until it has really exited (a trapped signal ends `wait` early); sets rc
  rc=0
  wait "$1" || rc=$?
  while kill -0 "$1" 2>/dev/null; do rc=0; wait "$1" || rc=$?; done
}
finish_update() {  # wait for the background update; a failure of it fails the loop
  [[ -n "$upd" ]] || return 0
  reap "$upd"
  upd=""
  if ((stop)); then echo "== SIGTERM: both lanes stopped at a unit boundary; rerun to resume" >&2; exit 75; fi
  ((rc == 0)) || { echo "== the update of iteration $upd_iter failed (exit $rc)" >&2; exit "$rc"; }
}
stage() {  # a generation stage in the foreground, beside the update
  local code
  if ((stop)); then finish_update; exit 75; fi  # a SIGTERM between two stages: start no new one
  if [[ -n "$GEN_DEVICES" ]]; then CUDA_VISIBLE_DEVICES="$GEN_DEVICES" "$@" & else "$@" & fi
  child=$!
  reap "$child"
  child="" code=$rc
  if ((stop || code != 0)); then
    finish_update  # the update's work is kept either way; it exits 75 on a stop
    ((stop)) && { echo "== SIGTERM: stopped at a unit boundary; rerun to resume" >&2; exit 75; }
    exit "$code"
  fi
}

generate() {  # generate J SAMPLER: design, validate, rollout and regret of iteration J with SAMPLER
  local j=$1 sampler=$2 designer
  eval "$("$SPADE" paths "$RUN" --iteration "$j" --shell)"
  if [[ -f "$scores.manifest.json" ]]; then echo "== iteration $j: generated" >&2; return 0; fi
  echo "== iteration $j: generating with $sampler" >&2
  designer="$sampler"
  [[ "$FROZEN_DESIGNER" == 1 ]] && designer="$MODEL"
  # with ENGINE=serve, each sampling stage with work to do first has the server load its checkpoint
  design_and_validate "$j" "$designer"
  envs_of "$j"
  [[ -f "$rollouts.manifest.json" ]] || serve_load "$sampler" "$j"
  # shellcheck disable=SC2086
  stage "$SPADE" rollout --model "$sampler" "${envs[@]}" --k "$K" --max-turns "$MAX_TURNS" \
    --iteration "$j" --seed "$SEED" --out "$rollouts" "${backend_flags[@]}" "${budget_flags[@]}" $ROLLOUT_ARGS
  # ema_lp, as in loop.sh: the checkpoint before the sampler plays the same envs on the same seeds
  lp_flags=()
  if [[ "$SIGNAL" == ema_lp && "$sampler" != "$MODEL" ]]; then
    before_model="$(ckpt_of $((j - STALENESS - 1)))"
    [[ -f "$lp_before.manifest.json" ]] || serve_load "$before_model" "$j"
    # shellcheck disable=SC2086
    stage "$SPADE" rollout --model "$before_model" "${envs[@]}" --k "$K" \
      --max-turns "$MAX_TURNS" --iteration "$j" --seed "$SEED" --out "$lp_before" "${backend_flags[@]}" \
      "${budget_flags[@]}" $ROLLOUT_ARGS
    lp_flags=(--before-rollouts "$lp_before")
  fi
  regret_flags=(--signal "$SIGNAL" --iteration "$j" --memory-out "$next_memory" "${lp_flags[@]}")
  [[ -f "$memory" ]] && regret_flags+=(--memory "$memory")
  ((REPLAY > 0)) && regret_flags+=(--replay "$REPLAY" --replay-out "$replay")
  # shellcheck disable=SC2086
  stage "$SPADE" regret --envs "$validated" "${played[@]}" --rollouts "$rollouts" --out "$scores" \
    "${regret_flags[@]}" $REGRET_ARGS
}
ckpt_of() {  # the checkpoint iteration $1 trains from (MODEL for 0)
  if (($1 == 0)); then echo "$MODEL"; else "$SPADE" paths "$RUN" --iteration "$1" --key ckpt; fi
}
eval_of() {  # eval_of C: evaluate checkpoint C if due (C % EVAL_EVERY == 0, the last one, and MODEL first)
  local c=$1 model out
  ((EVAL_EVERY > 0)) && ((c == 0 || c % EVAL_EVERY == 0 || c == ITERS)) || return 0
  out="$("$SPADE" paths "$RUN" --iteration "$c" --key eval)"
  [[ -f "$out.manifest.json" ]] && return 0
  model="$(ckpt_of "$c")"
  serve_load "$model" "$c"
  # shellcheck disable=SC2086
  stage "$SPADE" eval --model "$model" "${eval_flags[@]}" --out "$out" $EVAL_ARGS
}

# The schedule: generation of iteration 0 (and up to STALENESS) with MODEL; then for every i, update(i)
# in the background beside the evaluation of checkpoint i and the generation of iteration i+STALENESS
# with checkpoint i. Checkpoint i is complete from the end of update(i-1) on (finish_update below),
# so a server loads it only after its update has ended, never while the update writes it.
eval_of 0
for ((j = 0; j < STALENESS && j < ITERS; j++)); do ((stop == 0)) || exit 75; generate "$j" "$MODEL"; done
for ((i = 0; i < ITERS; i++)); do
  ((stop == 0)) || exit 75
  eval "$("$SPADE" paths "$RUN" --iteration "$i" --shell)"
  ((i == 0)) && ckpt="$MODEL"
  if [[ -f "$next_ckpt.manifest.json" ]]; then
    echo "== update of iteration $i: done" >&2
  else
    echo "== update of iteration $i (from $ckpt)" >&2
    update_flags=(--max-staleness "$STALENESS")
    [[ -n "$POOL" || "$FROZEN_DESIGNER" == 1 ]] && update_flags+=(--designer-share 0)
    upd_iter=$i
    ((stop == 0)) || exit 75
    # shellcheck disable=SC2086
    if [[ -n "$TRAIN_DEVICES" ]]; then
      CUDA_VISIBLE_DEVICES="$TRAIN_DEVICES" $UPDATE_CMD update --model "$ckpt" --envs "$validated" \
        --rollouts "$rollouts" --scores "$scores" --out "$next_ckpt" "${update_flags[@]}" $UPDATE_ARGS &
    else
      $UPDATE_CMD update --model "$ckpt" --envs "$validated" --rollouts "$rollouts" --scores "$scores" \
        --out "$next_ckpt" "${update_flags[@]}" $UPDATE_ARGS &
    fi
    upd=$!
  fi
  ((i == 0)) || eval_of "$i"
  j=$((i + STALENESS))
  ((j < ITERS)) && generate "$j" "$(ckpt_of "$i")"
  finish_update
  # shellcheck disable=SC2086  # retention once update(i) is done, as in loop.sh (docs/update.md)
  [[ "$PRUNE" == 0 ]] || stage "$SPADE" prune "$RUN" -i "$i" --eval-every "$EVAL_EVERY" $PRUNE_ARGS
done
eval_of "$ITERS"

[[ "$ENGINE" != serve ]] || stage "$SPADE" serve --run-dir "$RUN" --do stop >/dev/null
stage "$SPADE" report "$RUN"
exit 0
