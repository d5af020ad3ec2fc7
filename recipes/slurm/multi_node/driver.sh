#!/usr/bin/env bash
# Multi-node driver: each iteration as Slurm jobs chained by --dependency=afterok,
#   design → validate → rollout array (against a serving fleet) → regret → update → eval,
# each job running the command `spade plan` gives for it (the loop's schedule and settings, as
# recipes/loop.sh runs them). It waits for the jobs (squeue) and checks that each wrote its output.
# Run it where jobs can be submitted (a login node, in tmux); it holds no resources itself.
#
#   MODEL=/ckpts/Qwen3-8B RUN=runs/big ITERS=400 SHARDS=16 SERVE_NODES=4 UPDATE_NODES=2 \
#     SITE_ENV=recipes/slurm/site.env bash recipes/slurm/multi_node/driver.sh
#   # CPU (the Slurm test tier): a `transformers serve` fleet on 127.0.0.1, hf elsewhere
#   MODEL=ckpt/tiny RUN=runs/cpu POOL=starter ITERS=2 SHARDS=2 SERVE_NODES=1 UPDATE_NODES=1 BACKEND=hf \
#     SERVER=transformers SERVE_HOST=127.0.0.1 SERVE_ARGS="--device cpu --dtype float32" UPDATE_CMD=spade \
#     UPDATE_ARGS= SBATCH_ARGS="--gpus-per-node=0 --cpus-per-task=1" bash recipes/slurm/multi_node/driver.sh
#   # ENGINE=serve: one `spade serve` fleet for the run, each checkpoint loaded into its engines
#   ENGINE=serve FLEET_ARGS=--time=7-00:00:00 MODEL=/ckpts/Qwen3-8B ... bash recipes/slurm/multi_node/driver.sh
#
# The fleet is a job that holds SERVE_NODES nodes; each load of a checkpoint runs on them as a step of
# that job (node.sh through `srun --jobid FLEET --overlap`), which says "ready" on its stdout once its
# server answers over HTTP; the driver then lists the servers in the job's comment (and in
# RUN/servers-JOB.txt), where the rollout tasks find theirs. Restartable: a stage whose manifest
# exists is not submitted again. With --kill-on-invalid-dep=yes a failed stage cancels its
# dependents and the driver exits 1 naming its output. Every job but the fleet requeues itself on
# SIGTERM. docs/slurm.md describes the knobs.
set -euo pipefail
[[ -z "${SITE_ENV:-}" ]] || source "$SITE_ENV"
export SPADE_REPO="${SPADE_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}"
HERE="$SPADE_REPO/recipes/slurm/multi_node"
# the loop's settings, under which the GPU recipes' (vLLM, bf16)
export CONFIG="$SPADE_REPO/recipes/slurm/gpu.toml${CONFIG:+:$CONFIG}" ROLLOUT_SHARDS="${SHARDS:-16}"
SHARDS="$ROLLOUT_SHARDS" SERVE="${SERVE:-1}" SERVE_NODES="${SERVE_NODES:-4}" UPDATE_NODES="${UPDATE_NODES:-2}"
ENGINE="${ENGINE:-}" FLEET_ARGS="${FLEET_ARGS:-}" SBATCH_ARGS="${SBATCH_ARGS:-}" POLL_S="${POLL_S:-30}"
export ROLLOUT_BACKEND="${ROLLOUT_BACKEND:-openai}" SERVER="${SERVER:-vllm}" SERVE_WAIT_S="${SERVE_WAIT_S:-1800}"
# ENGINE=serve: design, rollout and eval sample through the run's fleet of `spade serve` engines
[[ "$ENGINE" != serve ]] || SERVE=1 SERVER=spade ROLLOUT_BACKEND=openai
# the update's launcher is update.sbatch's UPDATE_CMD: the plan gives `spade update ...`
plan() { local out; out="$(UPDATE_CMD=spade spade plan "$@" --shell)" || exit $?; eval "$out"; }
plan --start   # the run directory's mode recorded and checked: a run dir holds one loop mode
((pipeline == 0 || staleness == 1)) || { echo "the driver pipelines with STALENESS=1 only" >&2; exit 2; }
export RUN="$run"
mkdir -p logs
echo "== multi-node driver: $banner SHARDS=$SHARDS SERVE=$SERVE FLEET=${ENGINE:-per-iteration}" >&2

submit() {  # [SBATCH OPTIONS...] SCRIPT [ARGS...]: prints the job id
  local opts=()
  while [[ "$1" != *.sbatch ]]; do opts+=("$1"); shift; done
  # shellcheck disable=SC2086
  sbatch --parsable --kill-on-invalid-dep=yes "${opts[@]}" $SBATCH_ARGS "$@" | cut -d';' -f1
}
arg_of() { local -n a=$1; local k; for ((k = 1; k < ${#a[@]}; k++)); do [[ "${a[k - 1]}" != "$2" ]] || echo "${a[k]}"; done; }
out_of() { arg_of "$1" --out; }
done_() { [[ -f "$1.manifest.json" ]]; }
todo() { local -n a=$1; ((${#a[@]})) && ! done_ "$(out_of "$1")"; }   # NAME: the plan's call NAME has work
job() {  # NAME [SBATCH OPTIONS...]: the plan's call NAME as a job after $after (NAME.sbatch, or stage.sbatch)
  local -n call=$1
  local name="${1#own_}" script="$HERE/stage.sbatch"
  local opts=(--job-name="spade-${name%_model}")
  [[ ! -f "$HERE/$1.sbatch" ]] || opts=() script="$HERE/$1.sbatch"
  outs+=("$(out_of "$1")")
  shift
  after="$(submit ${after:+"--dependency=afterok:$after"} "${opts[@]}" "$@" "$script" "${call[@]}")"
}
wait_gone() { local j; for j; do while [[ -n "$(squeue -h -j "$j" -o %i 2>/dev/null)" ]]; do sleep "$POLL_S"; done; done; }
check_written() {  # WHAT OUT...: every OUT has its manifest, or the run stops here
  local what=$1 out; shift
  for out; do done_ "$out" || { echo "$what: $out was not written (a job failed; its dependents were" \
                                     "cancelled); see logs/ and rerun this script to resume" >&2; exit 1; }; done
}

# --- the fleet: a job holding the nodes; its servers run as steps of it --------------------------
fleet="" fleet_file="$(spade paths "$RUN" --key serve_fleet)/job" url=""
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
    -N "${st#* }" --ntasks-per-node=1 --kill-on-bad-exit=1 -e "$log" --open-mode=append bash "$HERE/node.sh" </dev/null 2>>"$log")
  while ((${#lines[@]} < ${st#* })) && read -r -u "$fd" line; do lines+=("$line"); done
  exec {fd}<&-
  ((${#lines[@]} == ${st#* })) || { echo "fleet $fleet: a server could not serve $1; see $log" >&2; return 1; }
  printf '%s\n' "${lines[@]}" | sort -n -k2 | cut -d' ' -f3 >"$list.tmp" && mv -f "$list.tmp" "$list"
  scontrol update JobId="$fleet" Comment="$(paste -sd' ' "$list")"
  echo "== $(date -Is) ${#lines[@]} servers answer: $(paste -sd' ' "$list") (in $list)" | tee -a "$log" >&2
  url="http://$(head -n1 "$list")/v1"
  [[ "$ENGINE" != serve ]] || BASE_URL="$url" plan --iteration "$i"   # the sampling calls through it
}
fleet_down() {  # the engines stopped (ENGINE=serve: through their nodes), then the job cancelled
  [[ -n "$fleet" ]] || return 0
  [[ "$SERVER" != spade ]] || srun --jobid="$fleet" --overlap -N "$(squeue -h -j "$fleet" -o %D)" --ntasks-per-node=1 \
    bash -c 'spade serve --run-dir "$RUN" --server "node-$SLURM_NODEID" --do stop' </dev/null &>/dev/null || true
  scancel "$fleet" 2>/dev/null || true
  wait_gone "$fleet"
  fleet=""
}

cpu=(--gpus-per-node=0 --cpus-per-task=4) gpu=(--gpus-per-node=1) gen=(--gpus-per-node=1)
[[ "$ENGINE" != serve ]] || gen=("${cpu[@]}")   # design and eval through the fleet: a CPU each
pending=() pending_outs=() prune_pending=()   # pipelined: update(i-1) beside iteration i's generation
for ((i = 0; i < iters + pipeline; i++)); do
  plan --iteration "$i"
  [[ "$ENGINE" != serve || -z "$url" ]] || BASE_URL="$url" plan --iteration "$i"
  shards=$({ compgen -G "$(arg_of regret --rollouts).manifest.json" || true; } | wc -l)
  play=0 outs=() waits=() after="" pool=""
  [[ " ${design[*]} " != *" --pool "* ]] || pool=1   # a pool samples nothing
  ((shards >= SHARDS || ${#regret[@]} == 0)) || done_ "$(out_of regret)" || play=1
  # (pipelined: not while the update of the iteration before is still pending, which is waited for below)
  if ((done && ${#pending[@]} == 0)) && ! todo eval; then echo "== iteration $i: done" >&2; continue; fi
  ((i == iters)) || echo "== iteration $i (model: $ckpt; sampler: $sampler)" >&2
  if [[ "$ENGINE" == serve ]]; then   # the fleet serves what this iteration samples, before it samples
    if todo design && [[ -z "$pool" && "$designer" != "$sampler" ]]; then   # a frozen Designer: first, alone
      fleet_load "$designer" "$i" || exit 1
      job design "${gen[@]}" && wait_gone "$after" && check_written "iteration $i" "${outs[@]}"
      after="" outs=()
    fi
    if todo eval_model || ((play)) || { todo design && [[ -z "$pool" ]]; }; then fleet_load "$sampler" "$i" || exit 1; fi
    [[ "$ENGINE" != serve || "$pipeline" != 1 || "$i" == 0 ]] || \
      ENGINE= BACKEND="${EVAL_BACKEND:-}" BASE_URL= plan --iteration "$i" --prefix own_   # checkpoint i, not the fleet's
  elif ((play)) && [[ "$SERVE" == 1 ]]; then
    fleet_up   # starts while design and validate run
  fi
  if todo eval_model; then job eval_model "${gen[@]}" && waits+=("$after") && after=""; fi   # MODEL itself
  if ((pipeline)) && todo eval; then   # checkpoint i, once update(i-1) has written it
    after="${pending[0]:-}"
    if declare -p own_eval &>/dev/null; then job own_eval "${gpu[@]}"; else job eval "${gen[@]}"; fi
    waits+=("$after") after=""
  fi
  if todo design && [[ -n "$pool" ]]; then job design "${cpu[@]}"; elif todo design; then job design "${gen[@]}"; fi
  if todo validate; then job validate "${cpu[@]}"; fi
  if todo lp_rollout; then job lp_rollout "${gpu[@]}"; fi   # ema_lp: the checkpoint before, on its own engine
  if ((play)); then
    deps="${after:+afterok:$after}"
    [[ -z "$fleet" || -n "$ENGINE" ]] || deps="${deps:+$deps,}after:$fleet"
    after="$(submit ${deps:+--dependency=$deps} --array=0-$((SHARDS - 1)) --export=ALL,ITER="$i",SERVE_JOB="$fleet" \
      "$HERE/rollout_array.sbatch")"
    array="$after"
  fi
  if todo regret; then job regret "${cpu[@]}"; fi
  if ((!pipeline)) && todo update; then job update --nodes="$UPDATE_NODES"; fi
  if ((!pipeline)) && todo eval && [[ "$ENGINE" != serve ]]; then job eval "${gpu[@]}"; fi
  [[ -z "$after" ]] || waits+=("$after")
  if [[ -n "$fleet" && -z "$ENGINE" ]]; then   # the iteration's fleet: serves its checkpoint while the array runs
    fleet_load "$sampler" "$i" || fleet_down   # (its array then fails at once)
    wait_gone "$array"
    fleet_down
  fi
  wait_gone "${waits[@]}" "${pending[@]}"
  if ((!pipeline)) && [[ "$ENGINE" == serve ]] && todo eval; then   # the new checkpoint, into the fleet
    check_written "iteration $i" "$next_ckpt"
    fleet_load "$next_ckpt" "$((i + 1))" || exit 1
    after="" && job eval "${gen[@]}" && wait_gone "$after"
  fi
  check_written "iteration $i" "${outs[@]}" "${pending_outs[@]}"
  "${prune_pending[@]}" >/dev/null   # retention once the update (and its eval) are written
  prune_pending=() pending=() pending_outs=()
  if ((!pipeline)); then
    "${prune[@]}" >/dev/null
    echo "== iteration $i done" >&2
  elif ((i < iters)); then   # update(i) trains while the next iteration generates
    outs=() after=""
    if todo update; then job update --nodes="$UPDATE_NODES" && pending=("$after") pending_outs=("${outs[@]}"); fi
    prune_pending=("${prune[@]}")
    echo "== iteration $i generated; its update runs beside the next generation" >&2
  fi
done
fleet_down
"${report[@]}"
