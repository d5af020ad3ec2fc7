#!/usr/bin/env bash
# loop_pipelined.sh — the SPADE loop with pipelined iterations: iteration i+S generates while update(i) trains.
#
#   PIPELINE=1 MODEL=Qwen/Qwen3-4B RUN=runs/piped bash recipes/loop.sh
#   PIPELINE=1 GEN_DEVICES=0,1,2,3 TRAIN_DEVICES=4,5,6,7 ... bash recipes/loop.sh   # one node, GPUs split
#   ENGINE=serve PIPELINE=1 GEN_DEVICES=0,1,2,3,4,5 TRAIN_DEVICES=6,7 ... bash recipes/loop.sh  # one server
#
# docs/pipeline.md: iteration i samples from checkpoint max(i - STALENESS, 0) (`spade plan` says
# which), so update(i+S) trains on samples S updates old, corrected by the update's truncated
# importance sampling and refused beyond --max-staleness. Two lanes: generation (the evaluation of
# checkpoint i, then design → validate → rollout → regret of iteration i+S) in the foreground, on
# GEN_DEVICES, and update(i) in the background, on TRAIN_DEVICES. Every stage reads write-once
# artifacts fixed by the schedule, never by timing, so a rerun after any kill ends with the artifacts
# of an uninterrupted run. SIGTERM goes to both lanes; each stops at a unit boundary; exit 75.
set -euo pipefail
export PIPELINE=1
SPADE="${SPADE:-spade}"
plan() { local out; out="$("$SPADE" plan "$@" --shell)" || exit $?; eval "$out"; }
plan --start --lanes   # the mode, and ENGINE=serve's devices: the server never sleeps beside the update
echo "== $banner" >&2

child="" upd="" stop=0   # the generation stage and the update, both handed SIGTERM
trap 'stop=1; for p in $child $upd; do kill -TERM "$p" 2>/dev/null || true; done' TERM
reap() {  # PID: wait until it has really exited (a trapped signal ends `wait` early); sets rc
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
run() {  # ARGV...: a generation-lane call in the foreground, beside the update
  (($#)) || return 0
  if ((stop)); then finish_update; exit 75; fi
  "$@" &
  child=$!
  reap "$child"
  child=""
  if ((stop || rc != 0)); then
    local code=$rc
    finish_update  # the update's work is kept either way; it exits 75 on a stop
    ((stop == 0)) || { echo "== SIGTERM: stopped at a unit boundary; rerun to resume" >&2; exit 75; }
    exit "$code"
  fi
}
stage() {  # PREFIX NAME: the server's load first (ENGINE=serve), then the stage
  local before="$1before_$2[@]" call="$1$2[@]"
  run "${!before}" >/dev/null
  run "${!call}"
}
generate() {  # design, validate, rollout and regret of the iteration planned as g_, by its sampler
  [[ -z "$g_log" ]] || echo "== $g_log" >&2
  for name in design validate rollout lp_rollout regret; do stage g_ "$name"; done
}

for ((j = 0; j < staleness && j < iters; j++)); do plan --iteration "$j" --prefix g_; generate; done  # MODEL
for ((i = 0; i <= iters; i++)); do   # update(i) beside the evaluation of checkpoint i and generation(i+S)
  ((stop == 0)) || exit 75
  plan --iteration "$i" --prefix u_
  [[ -z "$u_log_update" ]] || echo "== $u_log_update" >&2
  if ((${#u_update[@]})); then upd_iter=$i; "${u_update[@]}" & upd=$!; fi
  plan --iteration $((i + staleness)) --prefix g_   # (past ITERS: nothing to generate)
  stage u_ eval   # checkpoint i is complete: update(i-1), which wrote it, has ended
  generate
  finish_update
  stage u_ prune
done
run "${stop_server[@]}" >/dev/null
run "${report[@]}"
