# Sourced by the sbatch recipes in recipes/slurm/, after which the site's env (SITE_ENV) is read.
# `run_requeueable CMD...` runs CMD so that a SIGTERM
# to the batch shell (`#SBATCH --signal=B:TERM@...`, a preemption) reaches it, and requeues the job
# when CMD stopped on that signal: on exit 75 (a spade stage or loop stopped at a unit boundary and
# kept its partial), or on any failure after the signal (a launcher reports its workers' 75 as its
# own code). CMD runs in the background because bash runs a trap only between commands; `wait`
# returns early on a trapped signal, so it is repeated until CMD has exited.
[[ -z "${SITE_ENV:-}" ]] || source "$SITE_ENV"
run_requeueable() {
  local child="" rc=0 stopped=0 self="${SLURM_JOB_ID:-}"
  echo "== $(date -Is) job ${SLURM_JOB_ID:-local} restart ${SLURM_RESTART_COUNT:-0} on $(hostname): $*" >&2
  trap 'stopped=1; [[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true' TERM
  "$@" &
  child=$!
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
  trap - TERM
  ((rc == 75 || (stopped && rc != 0))) && [[ -n "$self" ]] || return "$rc"
  # an array task by its JOB_TASK id: its SLURM_JOB_ID names the whole array, finished tasks too
  [[ -z "${SLURM_ARRAY_JOB_ID:-}" ]] || self="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  echo "== $(date -Is) stopped on SIGTERM: requeueing job $self (exit $rc)" >&2
  scontrol requeue "$self"
  return 75
}
