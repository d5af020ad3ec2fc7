# Sourced by the sbatch recipes in recipes/slurm/: `run_requeueable CMD...` runs CMD so that a SIGTERM
# to the batch shell (`#SBATCH --signal=B:TERM@...`, a preemption) reaches it, and requeues the job
# when CMD stopped on that signal. CMD runs in the background because bash runs a trap only between
# commands; `wait` returns early on a trapped signal, so it is repeated until CMD has exited.
#
# Requeued on exit 75 (a spade stage stopped at a unit boundary and kept its partial), or on any
# failure after the signal: a launcher (srun, accelerate launch) reports its workers' 75 as its own
# code. Returns 75 after a requeue, else CMD's exit code.
run_requeueable() {
  local child="" rc=0 stopped=0
  trap 'stopped=1; [[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true' TERM
  "$@" &
  child=$!
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
  trap - TERM
  if ((rc == 75 || (stopped && rc != 0))) && [[ -n "${SLURM_JOB_ID:-}" ]]; then
    # An array task by its own JOB_TASK id: one task's SLURM_JOB_ID is the array's id, and
    # requeueing that requeues every task of the array, finished and running ones alike.
    local self="$SLURM_JOB_ID"
    [[ -n "${SLURM_ARRAY_JOB_ID:-}" ]] && self="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
    echo "== $(date -Is) stopped on SIGTERM (exit $rc): requeueing job $self" >&2
    scontrol requeue "$self"
    return 75
  fi
  return "$rc"
}
