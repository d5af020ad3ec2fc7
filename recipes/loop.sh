#!/usr/bin/env bash
# loop.sh — the SPADE loop: design → validate → rollout → regret → update (→ eval) for ITERS iterations.
#
#   MODEL=Qwen/Qwen3-4B RUN=runs/main bash recipes/loop.sh
#   CONFIG=recipes/ablations/no_memory.env MODEL=... bash recipes/loop.sh   # an arm's settings file
#   ENGINE=serve MODEL=Qwen/Qwen3-8B RUN=runs/one bash recipes/loop.sh      # one vLLM server for the run
#   PIPELINE=1 ... bash recipes/loop.sh                                     # recipes/loop_pipelined.sh
#
# The settings (MODEL, RUN, ITERS, N_ENVS, K, ..., DESIGN_ARGS) are declared once, with their
# defaults, in spade_cli/core/run_settings.py: a settings file (CONFIG, TOML) and environment variables of
# the same names set them (docs/cli.md, "The loop's settings and schedule"); PRINT_SETTINGS=1 prints
# them and exits.
# `spade plan` holds the schedule (which checkpoint samples, eval points, ema_lp, replay, retention,
# the server's loads) and gives each iteration's stage calls, empty where there is nothing to run.
#
# Restartable: every stage writes its output atomically with a manifest and a stage whose manifest
# matches its inputs prints "up to date"; no file is changed in place (the memory is a new file per
# iteration). Rerunning after any failure, kill or requeue resumes at the first incomplete stage.
# SIGTERM (Slurm's time limit and preemption) goes to the running stage, which stops at a unit
# boundary and keeps its work as a resumable partial; the loop then exits 75 (EX_TEMPFAIL).
set -euo pipefail
# shellcheck disable=SC1090
[[ -z "${SITE_ENV:-}" ]] || source "$SITE_ENV"   # cluster specifics, see recipes/slurm/site.env.example
SPADE="${SPADE:-spade}"
[[ "${PRINT_SETTINGS:-0}" != 1 ]] || exec "$SPADE" plan --print-settings
plan() { local out; out="$("$SPADE" plan "$@" --shell)" || exit $?; eval "$out"; }

plan --start --lanes   # the run directory's mode recorded and checked: the two loops never mix in one
((pipeline == 0)) || exec bash "$(dirname "${BASH_SOURCE[0]}")/loop_pipelined.sh"
echo "== $banner" >&2

# Each stage runs in the background so that this shell takes SIGTERM while it runs (bash runs a trap
# only between commands) and hands it on; `wait` returns early on a trapped signal, hence the loop.
child="" stop=0
trap 'stop=1; [[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true' TERM
run() {  # ARGV...: one call; nothing when empty
  (($#)) || return 0
  local rc=0
  "$@" &
  child=$!
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
  child=""
  if ((stop)); then echo "== SIGTERM: stopped at a unit boundary; rerun to resume" >&2; exit 75; fi
  return "$rc"
}
stage() {  # NAME: ENGINE=serve's server step first (load the stage's checkpoint, or sleep), then the stage
  local before="before_$1[@]" call="$1[@]"
  run "${!before}" >/dev/null
  run "${!call}"
}

for ((i = 0; i < iters; i++)); do
  ((stop == 0)) || exit 75
  plan --iteration "$i"
  stage eval_model         # iteration 0: MODEL itself, the start of every arm's curve
  echo "== $log" >&2       # a finished iteration has nothing to run
  stage design
  stage validate
  [[ -z "$wait_shards" ]] || { echo "$wait_shards" >&2; exit 3; }   # ROLLOUT_SHARDS: a Slurm array's
  stage rollout
  stage lp_rollout         # ema_lp: the checkpoint before plays the same envs on the same seeds
  stage regret
  stage update
  stage eval               # checkpoint i+1 at the eval points
  stage prune              # retention (docs/update.md)
done
run "${stop_server[@]}" >/dev/null
run "${report[@]}"
