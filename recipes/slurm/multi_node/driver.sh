#!/usr/bin/env bash
# Multi-node driver: each iteration as Slurm jobs chained by --dependency=afterok,
#   design → validate → rollout array (against a serving fleet) → regret → update → eval,
# waits for them (squeue) and checks that each wrote its output. Run it where jobs can be submitted
# (a login node, in tmux); it holds no resources itself. docs/slurm.md describes the knobs.
#
#   MODEL=/ckpts/Qwen3-8B RUN=runs/big ITERS=400 SHARDS=16 SERVE_NODES=4 UPDATE_NODES=2 \
#     SITE_ENV=recipes/slurm/site.env bash recipes/slurm/multi_node/driver.sh
#   # ENGINE=serve: one `spade serve` fleet for the run, each checkpoint loaded into its engines
#   ENGINE=serve FLEET_ARGS=--time=7-00:00:00 MODEL=/ckpts/Qwen3-8B ... bash recipes/slurm/multi_node/driver.sh
#
# The fleet is a job that holds SERVE_NODES nodes; each load of a checkpoint runs on them as a step of
# that job (node.sh through `srun --jobid FLEET --overlap`), which says "ready" on its stdout once its
# server answers over HTTP; the driver then lists the servers in the job's comment (and in
# RUN/servers-JOB.txt), where the rollout tasks find theirs. Restartable: a stage whose manifest
# exists is not submitted again. With --kill-on-invalid-dep=yes a failed stage cancels its
# dependents and the driver exits 1 naming it. Every job but the fleet requeues itself on SIGTERM.
set -euo pipefail
[[ -z "${CONFIG:-}" ]] || source "$CONFIG"
[[ -z "${SITE_ENV:-}" ]] || source "$SITE_ENV"
export SPADE_REPO="${SPADE_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}"
HERE="$SPADE_REPO/recipes/slurm/multi_node"
EVAL_BACKEND="${EVAL_BACKEND:-${BACKEND:-vllm}}"   # an eval on its own engine (not the fleet's)
# >>> settings: the loop's, resolved by recipes/loop.sh (the Qwen3 sampling included), with the GPU
# recipes' BACKEND and UPDATE_ARGS; the run settings file of `spade plan` replaces this block
settings="$(BACKEND="${BACKEND:-vllm}" UPDATE_ARGS="${UPDATE_ARGS-"--bf16 --gradient-checkpointing"}" ENGINE= \
  PRINT_SETTINGS=1 bash "$SPADE_REPO/recipes/loop.sh")"
eval "$(python3 -c 'import json, shlex, sys
for k, v in json.loads(sys.argv[1]).items():
    print(f"export {k}={shlex.quote(v)}" if k not in ("UPDATE_CMD", "ENGINE", "BASE_URL") else "")' "$settings")"
# <<< settings
SHARDS="${SHARDS:-16}" SERVE="${SERVE:-1}" SERVE_NODES="${SERVE_NODES:-4}" UPDATE_NODES="${UPDATE_NODES:-2}"
ENGINE="${ENGINE:-}" FLEET_ARGS="${FLEET_ARGS:-}" SBATCH_ARGS="${SBATCH_ARGS:-}" POLL_S="${POLL_S:-30}"
PRUNE="${PRUNE:-1}" PRUNE_ARGS="${PRUNE_ARGS:-}"
export RUN="${RUN:-runs/spade}" ROLLOUT_BACKEND="${ROLLOUT_BACKEND:-openai}" SERVER="${SERVER:-vllm}"
export SERVE_WAIT_S="${SERVE_WAIT_S:-1800}"
case "$ENGINE" in   # serve: design, rollout and eval sample through the run's fleet
  "") [[ "$SERVER" != spade ]] || { echo "SERVER=spade is the fleet of ENGINE=serve; set ENGINE=serve" >&2; exit 2; } ;;
  serve) SERVE=1 SERVER=spade ROLLOUT_BACKEND=openai BACKEND=openai ;;
  *) echo "ENGINE must be serve or empty, got '$ENGINE'" >&2; exit 2 ;;
esac
[[ "$PIPELINE" != 1 || "$STALENESS" == 1 ]] || { echo "the driver pipelines with STALENESS=1 only" >&2; exit 2; }
mkdir -p logs "$RUN"
LOOP_MODE_CHECK_ONLY=1 source "$SPADE_REPO/recipes/loop_mode.sh"   # a run dir holds one loop mode
echo "== multi-node driver: RUN=$RUN MODEL=$MODEL ITERS=$ITERS SHARDS=$SHARDS SERVE=$SERVE" \
     "ENGINE=${ENGINE:-per-iteration} BACKEND=$BACKEND POOL=${POOL:-none} PIPELINE=$PIPELINE" >&2

submit() {  # [SBATCH OPTIONS...] SCRIPT [ARGS...]: prints the job id
  local opts=()
  while [[ "$1" != *.sbatch ]]; do opts+=("$1"); shift; done
  # shellcheck disable=SC2086
  sbatch --parsable --kill-on-invalid-dep=yes "${opts[@]}" $SBATCH_ARGS "$@" | cut -d';' -f1
}
job() {  # KIND [SBATCH OPTIONS...] [-- ARGS...]: KIND.sbatch, or stage.sbatch as spade-KIND, after $after
  local opts=() script="$HERE/$1.sbatch"
  [[ -f "$script" ]] || opts=(--job-name="spade-$1") script="$HERE/stage.sbatch"
  shift
  while (($#)) && [[ "$1" != -- ]]; do opts+=("$1"); shift; done
  after="$(submit ${after:+"--dependency=afterok:$after"} "${opts[@]}" "$script" "${@:2}")"
}
done_() { [[ -f "$1.manifest.json" ]]; }
gone() { [[ -z "$(squeue -h -j "$1" -o %i 2>/dev/null)" ]]; }
wait_gone() { local j; for j; do while ! gone "$j"; do sleep "$POLL_S"; done; done; }
check_written() {  # WHAT OUT...: every OUT has its manifest, or the run stops here
  local what=$1 out; shift
  for out; do done_ "$out" || { echo "$what: $out was not written (a job failed; its dependents were" \
                                     "cancelled); see logs/ and rerun this script to resume" >&2; exit 1; }; done
}
prune_after() {  # I: retention once iteration I's update (and its eval) are written (docs/update.md)
  # shellcheck disable=SC2086
  [[ "$PRUNE" == 0 ]] || spade prune "$RUN" -i "$1" --eval-every "$EVAL_EVERY" $PRUNE_ARGS >/dev/null
}

# --- the fleet: a job holding the nodes; its servers run as steps of it --------------------------
fleet="" engine_url=() fleet_file="$(spade paths "$RUN" --key serve_fleet)/job"
trap '[[ -z "$fleet" ]] || scancel "$fleet" 2>/dev/null || true' EXIT
fleet_up() {  # the fleet: ENGINE=serve, the run's one in $fleet_file while it is queued or running; or a new one
  [[ -z "$fleet" ]] || return 0
  [[ "$ENGINE" != serve || ! -f "$fleet_file" ]] || fleet="$(<"$fleet_file")"
  if [[ -n "$fleet" && -n "$(squeue -h -j "$fleet" -t PD,CF,R -o %i 2>/dev/null)" ]]; then
    echo "== the fleet of this run is still up: job $fleet" >&2; return 0
  fi
  # shellcheck disable=SC2086
  fleet="$(submit --nodes="$SERVE_NODES" --export=ALL,CKPT= ${ENGINE:+$FLEET_ARGS} "$HERE/serve.sbatch")"
  echo "== fleet: job $fleet, $SERVER on $SERVE_NODES nodes" >&2
  [[ "$ENGINE" != serve ]] || { mkdir -p "${fleet_file%/*}" && echo "$fleet" >"$fleet_file"; }
}
fleet_load() {  # CKPT ITERATION: every server of the fleet serves CKPT before anything samples it from them
  fleet_up
  echo "== fleet $fleet: every server loads $1 (iteration $2)" >&2
  local st list="$RUN/servers-$fleet.txt" log="logs/spade-serve-$fleet.out" lines=() line fd
  until st="$(squeue -h -j "$fleet" -o '%T %D' 2>/dev/null)"; [[ -z "$st" || "$st" == RUNNING* ]]; do sleep "$POLL_S"; done
  [[ -n "$st" ]] || { echo "the fleet (job $fleet) ended; see $log" >&2; return 1; }
  exec {fd}< <(CKPT="$1" ITER="$2" ADDRS="$(paste -sd' ' "$list" 2>/dev/null || true)" srun --jobid="$fleet" --overlap \
    -N "${st#* }" --ntasks-per-node=1 --kill-on-bad-exit=1 -e "$log" --open-mode=append bash "$HERE/node.sh" </dev/null)
  while ((${#lines[@]} < ${st#* })) && read -r -u "$fd" line; do lines+=("$line"); done
  exec {fd}<&-
  ((${#lines[@]} == ${st#* })) || { echo "fleet $fleet: a server could not serve $1; see $log" >&2; return 1; }
  printf '%s\n' "${lines[@]}" | sort -n -k2 | cut -d' ' -f3 >"$list.tmp" && mv -f "$list.tmp" "$list"
  scontrol update JobId="$fleet" Comment="$(paste -sd' ' "$list")"
  echo "== $(date -Is) ${#lines[@]} servers answer: $(paste -sd' ' "$list") (in $list)" | tee -a "$log" >&2
  engine_url=(--base-url "http://$(head -n1 "$list")/v1")
}
fleet_down() {  # the engines stopped (ENGINE=serve: through their nodes), then the job cancelled
  [[ -n "$fleet" ]] || return 0
  [[ "$SERVER" != spade ]] || srun --jobid="$fleet" --overlap -N "$(squeue -h -j "$fleet" -o %D)" --ntasks-per-node=1 \
    bash -c 'spade serve --run-dir "$RUN" --server "node-$SLURM_NODEID" --do stop' </dev/null >/dev/null || true
  scancel "$fleet" 2>/dev/null || true
  wait_gone "$fleet"
  fleet="" engine_url=()
}

# >>> schedule (recipes/loop.sh decides the same; `spade plan` replaces this block): iteration i's
# paths, the checkpoint it updates ($ckpt), samples ($sampler) and designs with ($designer), and
# whether the checkpoint it writes is evaluated ($eval_due)
schedule() {
  local layout
  layout="$(spade paths "$RUN" --iteration "$i" --shard "0/$SHARDS" --shell)"
  eval "$layout"
  ((i > 0)) || ckpt="$MODEL"
  sampler="$ckpt"
  [[ "$PIPELINE" != 1 ]] || { sampler="$MODEL"; ((i < 2)) || sampler="$prev_ckpt"; }
  designer="$sampler"
  [[ "$FROZEN_DESIGNER" != 1 ]] || designer="$MODEL"
  eval_due=0
  ((EVAL_EVERY == 0 || ((i + 1) % EVAL_EVERY && i + 1 < ITERS))) || eval_due=1
}
# <<< schedule

cpu=(--gpus-per-node=0 --cpus-per-task=4) gpu=(--gpus-per-node=1) gen=(--gpus-per-node=1)
[[ "$ENGINE" != serve ]] || gen=("${cpu[@]}")   # design and eval through the fleet: a CPU each
ev=(--tasks "$EVAL_TASKS" ${EVAL_LIMIT:+--limit "$EVAL_LIMIT"})
design_job() {
  local flags=(--pool "$POOL") res=("${cpu[@]}")
  if [[ -z "$POOL" ]]; then
    flags=(--model "$designer" --group "$GROUP" --backend "$BACKEND" "${engine_url[@]}") res=("${gen[@]}")
    if [[ "$GROUNDING" == 1 ]]; then [[ -z "$CORPUS" ]] || flags+=(--corpus "$CORPUS"); else flags+=(--no-grounding); fi
    [[ "$MEMORY" != 1 || ! -f "$memory" ]] || flags+=(--memory "$memory")
  fi
  # shellcheck disable=SC2086
  job design "${res[@]}" -- spade design "${flags[@]}" --n "$N_ENVS" --iteration "$i" --seed "$SEED" --out "$designs" $DESIGN_ARGS
}
update_and_eval() {  # update(i), and the evaluation of its checkpoint on its own engine
  local extra=""
  [[ -z "$POOL" && "$FROZEN_DESIGNER" != 1 ]] || extra+=" --designer-share 0"
  [[ "$PIPELINE" != 1 ]] || extra+=" --max-staleness $STALENESS"
  # shellcheck disable=SC2086
  done_ "$next_ckpt" || job update --nodes="$UPDATE_NODES" -- spade update --model "$ckpt" --envs "$validated" \
    --rollouts "$rollouts_glob" --scores "$scores" --out "$next_ckpt" $UPDATE_ARGS $extra
  if ((eval_due)) && ! done_ "$next_eval" && [[ "$ENGINE" != serve || "$PIPELINE" == 1 ]]; then
    # shellcheck disable=SC2086
    job eval "${gpu[@]}" -- spade eval --model "$next_ckpt" "${ev[@]}" --backend "$EVAL_BACKEND" --out "$next_eval" $EVAL_ARGS
  fi
}
eval_job() {  # CKPT OUT: an evaluation on BACKEND, through the fleet with ENGINE=serve
  # shellcheck disable=SC2086
  job eval "${gen[@]}" -- spade eval --model "$1" "${ev[@]}" --backend "$BACKEND" "${engine_url[@]}" --out "$2" $EVAL_ARGS
}

pending=() pending_outs=()   # pipelined: the update (and eval) of the iteration before, and their outputs
for ((i = 0; i < ITERS; i++)); do
  schedule
  first_eval=0 design=0 play=0
  ((i > 0 || EVAL_EVERY == 0)) || done_ "$eval" || first_eval=1
  done_ "$designs" || design=1
  shards=$({ compgen -G "$rollout_shards_glob.manifest.json" || true; } | wc -l)
  ((shards >= SHARDS)) || done_ "$scores" || play=1
  if ((!first_eval)) && done_ "$next_ckpt" && { ((!eval_due)) || done_ "$next_eval"; }; then
    echo "== iteration $i: done" >&2
    continue
  fi
  echo "== iteration $i (model: $ckpt; sampler: $sampler)" >&2
  waits=() after=""
  if [[ "$ENGINE" == serve ]]; then   # the fleet serves what this iteration samples, before it samples
    if ((design)) && [[ -z "$POOL" && "$designer" != "$sampler" ]]; then   # a frozen Designer: the design first, alone
      fleet_load "$designer" "$i" || exit 1
      design_job && wait_gone "$after" && check_written "iteration $i" "$designs"
      after="" design=0
    fi
    if ((first_eval || play)) || [[ "$design$POOL" == 1 ]]; then fleet_load "$sampler" "$i" || exit 1; fi
  elif ((play)) && [[ "$SERVE" == 1 ]]; then
    fleet_up   # starts while design and validate run
  fi
  if ((first_eval)); then eval_job "$MODEL" "$eval" && waits+=("$after") && after=""; fi   # MODEL itself
  if ((design)); then design_job; fi
  if ! done_ "$validated"; then
    flags=()
    [[ ! -f "$memory" || -n "$POOL" ]] || flags+=(--memory "$memory")
    # shellcheck disable=SC2086
    job validate "${cpu[@]}" -- spade validate --designs "$designs" --out "$validated" "${flags[@]}" $VALIDATE_ARGS
  fi
  if ((play)); then
    deps="${after:+afterok:$after}"
    [[ -z "$fleet" || -n "$ENGINE" ]] || deps="${deps:+$deps,}after:$fleet"
    after="$(submit ${deps:+--dependency=$deps} --array=0-$((SHARDS - 1)) \
      --export=ALL,ITER="$i",CKPT="$sampler",SERVE_JOB="$fleet" "$HERE/rollout_array.sbatch")"
    array="$after"
  fi
  if ! done_ "$scores"; then
    flags=(--signal "$SIGNAL" --iteration "$i" --memory-out "$next_memory")
    [[ ! -f "$memory" ]] || flags+=(--memory "$memory")
    ((REPLAY == 0)) || flags+=(--replay "$REPLAY" --replay-out "$replay")
    ((i == 0)) || [[ ! -f "$prev_replay" ]] || flags+=(--played "$prev_replay")   # replays: played, not scored
    # shellcheck disable=SC2086
    job regret "${cpu[@]}" -- spade regret --envs "$validated" --rollouts "$rollouts_glob" --out "$scores" \
      "${flags[@]}" $REGRET_ARGS
  fi
  [[ "$PIPELINE" == 1 ]] || update_and_eval
  [[ -z "$after" ]] || waits+=("$after")
  if [[ -n "$fleet" && -z "$ENGINE" ]]; then   # the iteration's fleet: serves its checkpoint while the array runs
    fleet_load "$sampler" "$i" || fleet_down   # (its array then fails at once)
    wait_gone "$array"
    fleet_down
  fi
  wait_gone "${waits[@]}" "${pending[@]}"
  if [[ "$ENGINE" == serve && "$PIPELINE" != 1 ]] && ((eval_due)) && ! done_ "$next_eval"; then
    check_written "iteration $i" "$next_ckpt"   # the new checkpoint into the fleet, which evaluates it
    fleet_load "$next_ckpt" "$((i + 1))" || exit 1
    after="" && eval_job "$next_ckpt" "$next_eval" && wait_gone "$after"
  fi
  outs=("$designs" "$validated" "$scores" "${pending_outs[@]}")
  [[ "$PIPELINE" == 1 ]] || outs+=("$next_ckpt")
  [[ "$PIPELINE" == 1 ]] || ((!eval_due)) || outs+=("$next_eval")
  ((i > 0 || EVAL_EVERY == 0)) || outs+=("$eval")
  check_written "iteration $i" "${outs[@]}"
  if [[ "$PIPELINE" != 1 ]]; then prune_after "$i"; elif ((${#pending_outs[@]})); then prune_after "$((i - 1))"; fi
  pending=() pending_outs=()
  if [[ "$PIPELINE" == 1 ]]; then   # update(i) trains while the next iteration generates
    after="" && update_and_eval
    [[ -z "$after" ]] || pending=("$after")
    pending_outs=("$next_ckpt")
    ((!eval_due)) || pending_outs+=("$next_eval")
    echo "== iteration $i generated; its update runs beside the next generation" >&2
  else
    echo "== iteration $i done" >&2
  fi
done
wait_gone "${pending[@]}"
fleet_down
check_written "the last update" "${pending_outs[@]}"
((${#pending_outs[@]} == 0)) || prune_after "$((ITERS - 1))"
spade report "$RUN"
