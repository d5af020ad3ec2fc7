#!/usr/bin/env bash
# Multi-node driver: per iteration, submits the stages as Slurm jobs chained by dependencies,
#   design → validate → rollout array (against a serving fleet) → regret → update → eval,
# waits for the chain, and goes on with the next iteration (whose design needs the new checkpoint).
# Run it where jobs can be submitted (a login node, in tmux); it holds no resources itself.
#
#   MODEL=Qwen/Qwen3-8B RUN=runs/big ITERS=400 SHARDS=16 SERVE_NODES=4 UPDATE_NODES=2 \
#   SITE_ENV=recipes/slurm/site.env bash recipes/slurm/multi_node/driver.sh
#   # CPU (what the Slurm test tier runs): a `transformers serve` fleet on 127.0.0.1, hf elsewhere
#   MODEL=ckpt/tiny RUN=runs/cpu POOL=starter ITERS=2 SHARDS=2 SERVE_NODES=1 UPDATE_NODES=1 BACKEND=hf \
#     SERVER=transformers SERVE_HOST=127.0.0.1 SERVE_ARGS="--device cpu --dtype float32" \
#     UPDATE_CMD=spade UPDATE_ARGS= SBATCH_ARGS="--gpus-per-node=0 --cpus-per-task=1" bash recipes/slurm/multi_node/driver.sh
#   # no fleet (SERVE=0): the shards load the model themselves (ROLLOUT_BACKEND=hf or vllm)
#   # PIPELINE=1 (docs/pipeline.md): the design, rollout array and regret of iteration i+1 run with
#   # checkpoint i while the update job of iteration i trains; update(i+1) trains on samples one update old
#   # ENGINE=serve: one `spade serve` fleet for the whole run (below); SERVE_ARGS are its engine flags
#   # (every node's engines: tensor parallel 1 and data parallel over its GPUs; Qwen3-30B-A3B:
#   # SERVE_ARGS="--tensor-parallel-size 2", or TP=2 for the per-iteration vllm fleet)
#   ENGINE=serve MODEL=/ckpts/Qwen3-8B RUN=runs/big ITERS=400 SHARDS=16 SERVE_NODES=4 \
#     FLEET_ARGS=--time=7-00:00:00 bash recipes/slurm/multi_node/driver.sh
#
# The artifacts and the stage flags are those of recipes/loop.sh (the same layout, from
# `spade paths --shell`; the memory by iteration; the same knobs), so a run may move between the two.
# Restartable: a stage whose manifest exists is not submitted again, and a rerun of this script
# after any failure resumes at the first incomplete stage. Do not rerun it while the jobs of an
# earlier run are still queued: their outputs are locked and the new jobs would fail at once.
# Every job is submitted with --kill-on-invalid-dep=yes: when a stage fails, Slurm cancels the
# jobs that depend on it (none is left PENDING forever) and this script exits 1 naming the stage.
# Every job but the fleet has --requeue and --signal: on SIGTERM (time limit, preemption) its stage
# stops at a unit boundary, keeps its partial and the job requeues itself; its dependents wait.
#
# ENGINE=serve (docs/slurm.md): instead of a fleet per iteration, one fleet lives for the whole run
# (serve.sbatch with SERVER=spade: one `spade serve` per node, state in RUN/serve/node-N/). Before
# the generation jobs of an iteration are submitted, the driver has every server load the
# iteration's checkpoint into its running engine and waits until all have; the design, the eval and
# the rollout array then sample through the fleet with --backend openai, and each stage checks that
# its server serves its --model (the manifests record the server and the checkpoint). The update
# trains on other nodes, so the fleet never sleeps. The fleet's job id is kept in
# RUN/serve/fleet/job: a rerun after the driver was killed finds the fleet still running (or submits
# another) and has it load the right checkpoint; the driver cancels the fleet when it ends. MODEL
# must be a local checkpoint directory. With PIPELINE=1 the fleet loads checkpoint i at the start
# of iteration i+1, after everything that sampled checkpoint i-1 has finished (update(i) trains
# meanwhile, elsewhere); the evaluation of checkpoint i+1, which runs while the fleet still serves
# checkpoint i, loads it itself (EVAL_BACKEND, default BACKEND, on one GPU).
set -euo pipefail
[[ -n "${CONFIG:-}" ]] && source "$CONFIG"
[[ -n "${SITE_ENV:-}" ]] && source "$SITE_ENV"
MODEL="${MODEL:?set MODEL to the initial checkpoint (a local directory or a hub id)}"
RUN="${RUN:-runs/spade}"; ITERS="${ITERS:-400}"; SEED="${SEED:-0}"
N_ENVS="${N_ENVS:-24}"; GROUP="${GROUP:-4}"
SHARDS="${SHARDS:-16}"; SERVE="${SERVE:-1}"; SERVE_NODES="${SERVE_NODES:-4}"; UPDATE_NODES="${UPDATE_NODES:-2}"
BACKEND="${BACKEND:-vllm}"               # design and eval, on one GPU each
export ROLLOUT_BACKEND="${ROLLOUT_BACKEND:-openai}"  # openai: the fleet of serve.sbatch (SERVE=1)
# the fleet's server, read by serve.sbatch: vllm (GPUs) or transformers; SERVE_HOST, SERVE_ARGS, TP (1; 2 at 30B-A3B)
export SERVER="${SERVER:-vllm}"
CORPUS="${CORPUS:-}"; GROUNDING="${GROUNDING:-1}"; MEMORY="${MEMORY:-1}"; SIGNAL="${SIGNAL:-regret}"
REPLAY="${REPLAY:-0}"; POOL="${POOL:-}"; FROZEN_DESIGNER="${FROZEN_DESIGNER:-0}"
PIPELINE="${PIPELINE:-0}"; STALENESS="${STALENESS:-1}"  # 1: pipelined iterations, one update behind (loop.sh's knobs)
ENGINE="${ENGINE:-}"                     # serve: one `spade serve` fleet for the run; empty: a fleet per iteration
FLEET_ARGS="${FLEET_ARGS:-}"             # ENGINE=serve: sbatch options of the fleet only (a --time for the run)
export SERVE_WAIT_S="${SERVE_WAIT_S:-1800}"
case "$ENGINE" in
  "") [[ "$SERVER" != spade ]] || { echo "SERVER=spade is the fleet of ENGINE=serve; set ENGINE=serve" >&2; exit 2; } ;;
  serve)
    # pipelined, the evaluation of checkpoint i+1 runs while iteration i+1 samples checkpoint i from
    # the fleet: it loads the checkpoint itself, with EVAL_BACKEND (default: BACKEND, one GPU)
    EVAL_BACKEND="${EVAL_BACKEND:-$BACKEND}"
    # design, rollout and eval sample through the fleet, which the update never shares
    SERVE=1 SERVER=spade ROLLOUT_BACKEND=openai BACKEND=openai ;;
  *) echo "ENGINE must be serve or empty, got '$ENGINE'" >&2; exit 2 ;;
esac
EVAL_EVERY="${EVAL_EVERY:-25}"; EVAL_TASKS="${EVAL_TASKS:-rg:basic_arithmetic:50}"; EVAL_LIMIT="${EVAL_LIMIT:-}"
# the Designer's and eval's Qwen3 thinking-mode sampling and budgets, as in loop.sh (which says why)
QWEN3_DESIGN="--thinking --temperature 0.6 --top-p 0.95 --top-k 20 --think-tokens 4096"
QWEN3_DESIGN+=" --answer-tokens 4096 --think-overflow close"
QWEN3_EVAL="--temperature 0.6 --top-p 0.95 --top-k 20"
case ",${EVAL_TASKS// /}" in
  *,lm:* | *,evalscope:*) ;;
  *) QWEN3_EVAL+=" --think-tokens 30720 --answer-tokens 2048 --think-overflow close" ;;
esac
DESIGN_ARGS="${DESIGN_ARGS-$QWEN3_DESIGN}"; VALIDATE_ARGS="${VALIDATE_ARGS:-}"; REGRET_ARGS="${REGRET_ARGS:-}"
EVAL_ARGS="${EVAL_ARGS-$QWEN3_EVAL}"; UPDATE_ARGS_BASE="${UPDATE_ARGS-"--bf16 --gradient-checkpointing"}"
SBATCH_ARGS="${SBATCH_ARGS:-}"           # added to every sbatch, last (they win): account, partition, CPU runs
POLL_S="${POLL_S:-30}"
# read by rollout_array.sbatch and update.sbatch through --export=ALL
# the Agent's Qwen3 thinking-mode sampling and budgets, as in loop.sh (which says why)
QWEN3_ROLLOUT="--temperature 0.6 --top-p 0.95 --top-k 20 --think-tokens 1024 --answer-tokens 512"
QWEN3_ROLLOUT+=" --think-overflow close --think-context auto"
export K="${K:-8}" MAX_TURNS="${MAX_TURNS:-16}" SEED ROLLOUT_ARGS="${ROLLOUT_ARGS-$QWEN3_ROLLOUT}" RUN
# the Agent's budget per iteration, split over the valid envs of all shards, as in loop.sh ("": K per env)
export BUDGET_PAIRS="${BUDGET_PAIRS-$((N_ENVS * K))}"
PRUNE="${PRUNE:-1}"; PRUNE_ARGS="${PRUNE_ARGS:-}"   # retention after each update, as in loop.sh
export SPADE_REPO="${SPADE_REPO:-$(cd "$(dirname "$0")/../../.." && pwd)}"
HERE="$SPADE_REPO/recipes/slurm/multi_node"
echo "== multi-node driver: RUN=$RUN MODEL=$MODEL ITERS=$ITERS SHARDS=$SHARDS SERVE=$SERVE" \
     "ENGINE=${ENGINE:-per-iteration} BACKEND=$BACKEND ROLLOUT_BACKEND=$ROLLOUT_BACKEND POOL=${POOL:-none} EVAL_EVERY=$EVAL_EVERY PIPELINE=$PIPELINE" >&2
mkdir -p logs "$RUN"
[[ "$PIPELINE" != 1 || "$STALENESS" == 1 ]] || { echo "the driver pipelines with STALENESS=1 only" >&2; exit 2; }
# the run directory's mode, recorded and checked as recipes/loop.sh does: the two loops never mix
LOOP_MODE_CHECK_ONLY=1 source "$SPADE_REPO/recipes/loop_mode.sh"

# submit [SBATCH OPTIONS...] SCRIPT [ARGS...]: prints the job id
submit() {
  local opts=()
  while [[ "$1" != *.sbatch ]]; do opts+=("$1"); shift; done
  # shellcheck disable=SC2086
  sbatch --parsable --kill-on-invalid-dep=yes --export=ALL "${opts[@]}" $SBATCH_ARGS "$@" | cut -d';' -f1
}
done_() { [[ -f "$1.manifest.json" ]]; }
gone() { [[ -z "$(squeue -h -j "$1" -o %i 2>/dev/null)" ]]; }
wait_gone() { while ! gone "$1"; do sleep "$POLL_S"; done; }
check_written() {  # check_written WHAT OUT...: every OUT has its manifest, or the run stops here
  local what=$1 out; shift
  for out in "$@"; do
    done_ "$out" || { echo "$what: $out was not written (a job failed; its dependents were" \
                           "cancelled); see logs/ and rerun this script to resume" >&2; exit 1; }
  done
}
prune_after() {  # I: retention once iteration I's update (and its eval) are written (docs/update.md)
  # shellcheck disable=SC2086
  [[ "$PRUNE" == 0 ]] || spade prune "$RUN" -i "$1" --eval-every "$EVAL_EVERY" $PRUNE_ARGS >/dev/null
}
pending=() pending_outs=()   # pipelined: the update (and eval) jobs of the iteration before, and their outputs
serve_job=""
trap '[[ -z "$serve_job" ]] || scancel "$serve_job" 2>/dev/null || true' EXIT
eval_flags=(--tasks "$EVAL_TASKS" --backend "$BACKEND")
[[ -n "$EVAL_LIMIT" ]] && eval_flags+=(--limit "$EVAL_LIMIT")
own_eval_flags=("${eval_flags[@]}")   # ENGINE=serve, pipelined: an eval beside the fleet, on its own engine
[[ "$ENGINE" != serve || "$PIPELINE" != 1 ]] || own_eval_flags=(--tasks "$EVAL_TASKS" --backend "$EVAL_BACKEND"
                                                                  ${EVAL_LIMIT:+--limit "$EVAL_LIMIT"})
gpu=(--gpus-per-node=1) cpu=(--gpus-per-node=0 --cpus-per-task=4)
gen=("${gpu[@]}")   # design and eval: a GPU each, or a CPU each when they sample through the fleet
engine_url=()       # ENGINE=serve: --base-url of the fleet's server for design and eval
if [[ "$ENGINE" == serve ]]; then
  gen=("${cpu[@]}")
  fleet_dir="$(spade paths "$RUN" --key serve_fleet)"
fi

# --- ENGINE=serve: the run's fleet -------------------------------------------------------------
fleet_up() {  # the fleet of this run: the one in RUN/serve/fleet/job while it is queued or running, or a new one
  [[ -z "$serve_job" ]] || return 0
  local job=""
  [[ -f "$fleet_dir/job" ]] && job="$(<"$fleet_dir/job")"
  if [[ -n "$job" && -n "$(squeue -h -j "$job" -t PD,CF,R -o %i 2>/dev/null)" ]]; then
    echo "== the fleet of this run is still up: job $job" >&2
  else
    # shellcheck disable=SC2086
    job="$(submit --nodes="$SERVE_NODES" $FLEET_ARGS "$HERE/serve.sbatch")"
    mkdir -p "$fleet_dir"
    printf '%s\n' "$job" >"$fleet_dir/job.tmp" && mv -f "$fleet_dir/job.tmp" "$fleet_dir/job"
    echo "== fleet: job $job, one spade serve on each of $SERVE_NODES nodes" >&2
  fi
  serve_job="$job"
}
fleet_load() {  # CKPT ITERATION: every server of the fleet serves CKPT before anything samples from it
  fleet_up
  local dir="$fleet_dir/$serve_job" id t=0 n s did st
  id="$(date +%s%N)-$$"
  mkdir -p "$dir"
  printf '%s\t%s\t%s\n' "$id" "$2" "$1" >"$dir/want.tmp" && mv -f "$dir/want.tmp" "$dir/want"
  echo "== fleet $serve_job: every server loads $1 (iteration $2)" >&2
  while :; do
    n=0
    for ((s = 0; s < SERVE_NODES; s++)); do
      [[ -f "$dir/node-$s.done" ]] || continue
      IFS=$'\t' read -r did st <"$dir/node-$s.done"
      [[ "$did" == "$id" ]] || continue
      if [[ "$st" != ok ]]; then
        echo "fleet $serve_job: node $s could not serve $1 ($st); see logs/spade-serve-$serve_job.out" >&2
        exit 1
      fi
      n=$((n + 1))
    done
    ((n < SERVE_NODES)) || [[ ! -s "$RUN/servers-$serve_job.txt" ]] || break
    if gone "$serve_job"; then
      echo "the fleet (job $serve_job) ended; see logs/spade-serve-$serve_job.out; rerun this script to" \
           "submit another" >&2
      exit 1
    fi
    # the bound counts from the fleet's start: a fleet waiting in the queue waits for GPUs, not for us
    [[ -n "$(squeue -h -j "$serve_job" -t PD -o %i 2>/dev/null)" ]] || t=$((t + 2))
    if ((t > SERVE_WAIT_S)); then
      echo "fleet $serve_job: $n of $SERVE_NODES servers serve $1 after ${SERVE_WAIT_S}s" >&2; exit 1
    fi
    sleep 2
  done
  engine_url=(--base-url "http://$(head -n1 "$RUN/servers-$serve_job.txt")/v1")
}
fleet_down() {
  [[ -n "$serve_job" ]] || return 0
  scancel "$serve_job" 2>/dev/null || true
  wait_gone "$serve_job"          # its servers are gone before another fleet starts
  serve_job=""
}
# --- end ENGINE=serve --------------------------------------------------------------------------

submit_design() {  # the design job of iteration $i (after the jobs so far: $after)
  if [[ -n "$POOL" ]]; then
    flags=(--pool "$POOL") res=("${cpu[@]}")
  else
    flags=(--model "$designer" --group "$GROUP" --backend "$BACKEND" "${engine_url[@]}") res=("${gen[@]}")
    if [[ "$GROUNDING" == 1 ]]; then [[ -n "$CORPUS" ]] && flags+=(--corpus "$CORPUS")
    else flags+=(--no-grounding); fi
    [[ "$MEMORY" == 1 && -f "$memory" ]] && flags+=(--memory "$memory")
  fi
  # shellcheck disable=SC2086
  after="$(submit "${res[@]}" $(dep) --job-name=spade-design "$HERE/stage.sbatch" spade design "${flags[@]}" \
    --n "$N_ENVS" --iteration "$i" --seed "$SEED" --out "$designs" $DESIGN_ARGS)"
}

for ((i = 0; i < ITERS; i++)); do
  # an assignment, not eval "$(...)": set -e stops on a failure of `spade paths`
  layout="$(spade paths "$RUN" --iteration "$i" --shard "0/$SHARDS" --shell)"
  eval "$layout"
  ((i == 0)) && ckpt="$MODEL"
  # the checkpoint that samples this iteration: its own, or the one before it when pipelined (MODEL
  # for iterations 0 and 1; $prev_ckpt comes from the layout)
  sampler="$ckpt"
  if [[ "$PIPELINE" == 1 ]]; then sampler="$MODEL"; ((i < 2)) || sampler="$prev_ckpt"; fi
  designer="$sampler"; [[ "$FROZEN_DESIGNER" == 1 ]] && designer="$MODEL"
  eval_due=0
  ((EVAL_EVERY > 0)) && (((i + 1) % EVAL_EVERY == 0 || i + 1 == ITERS)) && eval_due=1
  if done_ "$next_ckpt" && { ((eval_due == 0)) || done_ "$next_eval"; } \
      && { ((i > 0 || EVAL_EVERY == 0)) || done_ "$eval"; }; then
    echo "== iteration $i: done" >&2
    continue
  fi
  echo "== iteration $i (model: $ckpt; sampler: $sampler)" >&2
  waits=() after=""   # the jobs to wait for; the last job of the chain so far
  dep() { [[ -z "$after" ]] || echo "--dependency=afterok:$after"; }
  # (the iteration's directory appears only when its design job runs)
  shards_done=$({ compgen -G "$rollout_shards_glob.manifest.json" || true; } | wc -l)
  if [[ "$ENGINE" == serve ]]; then   # the fleet serves what this iteration samples, before it samples
    if [[ -z "$POOL" && "$designer" != "$sampler" ]] && ! done_ "$designs"; then
      fleet_load "$designer" "$i"     # a frozen Designer: the design first, alone on the fleet
      submit_design
      wait_gone "$after"
      check_written "iteration $i" "$designs"
      after=""
    fi
    if { ((i == 0 && EVAL_EVERY > 0)) && ! done_ "$eval"; } || { [[ -z "$POOL" ]] && ! done_ "$designs"; } \
        || { ((shards_done < SHARDS)) && ! done_ "$scores"; }; then
      fleet_load "$sampler" "$i"
    fi
  fi
  if ((i == 0 && EVAL_EVERY > 0)) && ! done_ "$eval"; then   # the curve's starting point: MODEL itself
    # shellcheck disable=SC2086
    waits+=("$(submit "${gen[@]}" --job-name=spade-eval "$HERE/stage.sbatch" \
      spade eval --model "$MODEL" "${eval_flags[@]}" "${engine_url[@]}" --out "$eval" $EVAL_ARGS)")
  fi

  if ! done_ "$designs"; then submit_design; fi   # (not `||`: set -e must hold inside it)
  if ! done_ "$validated"; then
    flags=(); [[ -f "$memory" && -z "$POOL" ]] && flags+=(--memory "$memory")
    # shellcheck disable=SC2086
    after="$(submit "${cpu[@]}" $(dep) --job-name=spade-validate "$HERE/stage.sbatch" \
      spade validate --designs "$designs" --out "$validated" "${flags[@]}" $VALIDATE_ARGS)"
  fi

  # the replays the rollout array plays beside the designs: read by regret, never scored as designs
  played=()
  ((i > 0)) && [[ -f "$prev_replay" ]] && played+=(--played "$prev_replay")
  if ((shards_done < SHARDS)) && ! done_ "$scores"; then
    export ITER="$i" CKPT="$sampler" SERVERS="" SERVE_JOB=""
    serve_dep=()
    if [[ "$ENGINE" == serve ]]; then   # the run's fleet, which fleet_load has made serve $sampler
      SERVERS="$RUN/servers-$serve_job.txt" SERVE_JOB="$serve_job"
    elif [[ "$SERVE" == 1 ]]; then   # the fleet starts while design and validate run
      serve_job="$(submit --nodes="$SERVE_NODES" "$HERE/serve.sbatch")"
      SERVERS="$RUN/servers-$serve_job.txt" SERVE_JOB="$serve_job"
      serve_dep=("--dependency=${after:+afterok:$after,}after:$serve_job")
    fi
    if ((${#serve_dep[@]} == 0)); then serve_dep=($(dep)); fi
    arr="$(submit "${serve_dep[@]}" --array=0-$((SHARDS - 1)) "$HERE/rollout_array.sbatch")"
    after="$arr"
  fi
  if ! done_ "$scores"; then
    flags=(--signal "$SIGNAL" --iteration "$i" --memory-out "$next_memory")
    [[ -f "$memory" ]] && flags+=(--memory "$memory")
    ((REPLAY > 0)) && flags+=(--replay "$REPLAY" --replay-out "$replay")
    # shellcheck disable=SC2086
    after="$(submit "${cpu[@]}" $(dep) --job-name=spade-regret "$HERE/stage.sbatch" \
      spade regret --envs "$validated" "${played[@]}" --rollouts "$rollouts_glob" --out "$scores" "${flags[@]}" $REGRET_ARGS)"
  fi
  # update(i) and the evaluation of its checkpoint; pipelined, they are submitted once regret(i) and
  # update(i-1) are done, and waited for only at the end of iteration i+1, after its generation
  submit_update() {
    if ! done_ "$next_ckpt"; then
      export ITER="$i" CKPT="$ckpt" UPDATE_ARGS="$UPDATE_ARGS_BASE"
      [[ -n "$POOL" || "$FROZEN_DESIGNER" == 1 ]] && UPDATE_ARGS+=" --designer-share 0"
      [[ "$PIPELINE" == 1 ]] && UPDATE_ARGS+=" --max-staleness $STALENESS"
      after="$(submit $(dep) --nodes="$UPDATE_NODES" "$HERE/update.sbatch")"
    fi
    # (ENGINE=serve, sequential: through the fleet once the update is done and its checkpoint loaded)
    if ((eval_due)) && ! done_ "$next_eval" && [[ "$ENGINE" != serve || "$PIPELINE" == 1 ]]; then
      # shellcheck disable=SC2086
      after="$(submit "${gpu[@]}" $(dep) --job-name=spade-eval "$HERE/stage.sbatch" \
        spade eval --model "$next_ckpt" "${own_eval_flags[@]}" --out "$next_eval" $EVAL_ARGS)"
    fi
  }
  [[ "$PIPELINE" == 1 ]] || submit_update
  [[ -n "$after" ]] && waits+=("$after")

  if [[ -n "$serve_job" && "$ENGINE" != serve ]]; then   # the fleet is needed only while the array runs
    wait_gone "$arr"
    fleet_down
  fi
  for j in "${waits[@]}" "${pending[@]}"; do wait_gone "$j"; done
  if [[ "$ENGINE" == serve && "$PIPELINE" != 1 ]] && ((eval_due)) && ! done_ "$next_eval"; then
    # the new checkpoint, once the update has written it, into the fleet, which evaluates it
    check_written "iteration $i" "$next_ckpt"
    fleet_load "$next_ckpt" "$((i + 1))"
    # shellcheck disable=SC2086
    wait_gone "$(submit "${gen[@]}" --job-name=spade-eval "$HERE/stage.sbatch" \
      spade eval --model "$next_ckpt" "${eval_flags[@]}" "${engine_url[@]}" --out "$next_eval" $EVAL_ARGS)"
  fi
  outs=("$designs" "$validated" "$scores" "${pending_outs[@]}")
  if [[ "$PIPELINE" != 1 ]]; then
    outs+=("$next_ckpt")
    ((eval_due)) && outs+=("$next_eval")
  fi
  ((i == 0 && EVAL_EVERY > 0)) && outs+=("$eval")
  check_written "iteration $i" "${outs[@]}"
  if [[ "$PIPELINE" != 1 ]]; then prune_after "$i"; elif ((${#pending_outs[@]})); then prune_after "$((i - 1))"; fi
  pending=() pending_outs=()
  if [[ "$PIPELINE" == 1 ]]; then   # update(i) trains while the next iteration generates
    after=""
    submit_update
    [[ -n "$after" ]] && pending=("$after")
    pending_outs=("$next_ckpt")
    ((eval_due)) && pending_outs+=("$next_eval")
    echo "== iteration $i generated; its update runs beside the next generation" >&2
  else
    echo "== iteration $i done" >&2
  fi
done
for j in "${pending[@]}"; do wait_gone "$j"; done
fleet_down
check_written "the last update" "${pending_outs[@]}"
((${#pending_outs[@]} == 0)) || prune_after "$((ITERS - 1))"
spade report "$RUN"
