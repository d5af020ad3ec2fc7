# loop_mode.sh — sourced by recipes/loop.sh after its knobs: which loop a run directory belongs to.
#
# A run is made by the sequential loop (the default, on-policy as in the paper) or by the pipelined
# one (PIPELINE=1, recipes/loop_pipelined.sh: iteration i+1 generates with checkpoint i while
# update(i) trains; docs/pipeline.md). Their artifacts differ from iteration 1 on (the rollouts of
# iteration i+1 are sampled by another checkpoint), so the two must never mix in one run directory:
# the first run writes its mode to RUN/loop_mode ("sequential" or "pipelined S", S the staleness),
# and every later run of either loop refuses a directory whose mode is not its own (exit 2). A run
# directory made before modes were recorded (iterations but no loop_mode) is sequential.
PIPELINE="${PIPELINE:-0}"           # 1: pipelined iterations (off by default: the paper is on-policy)
STALENESS="${STALENESS:-1}"         # with PIPELINE=1: iteration i samples from checkpoint i-STALENESS
case "$PIPELINE" in
  0) loop_mode=sequential ;;
  1) [[ "$STALENESS" =~ ^[1-9][0-9]*$ ]] || { echo "STALENESS must be a whole number >= 1, got '$STALENESS'" >&2; exit 2; }
     loop_mode="pipelined $STALENESS" ;;
  *) echo "PIPELINE must be 0 or 1, got '$PIPELINE'" >&2; exit 2 ;;
esac
mkdir -p "$RUN"
loop_mode_file="$("${SPADE:-spade}" paths "$RUN" --key loop_mode)"
if [[ -f "$loop_mode_file" ]]; then
  recorded="$(<"$loop_mode_file")"
elif compgen -G "$RUN/iter_[0-9]*" >/dev/null || compgen -G "$RUN/ckpt/iter_[0-9]*" >/dev/null; then
  recorded=sequential
else
  recorded="$loop_mode"
fi
if [[ "$recorded" != "$loop_mode" ]]; then
  echo "$RUN was made by the $recorded loop and this is the $loop_mode one (PIPELINE=$PIPELINE" \
       "STALENESS=$STALENESS): the two never mix in one run directory; use another RUN or the same settings" >&2
  exit 2
fi
if [[ ! -f "$loop_mode_file" ]]; then
  printf '%s\n' "$loop_mode" >"$loop_mode_file.tmp-$$" && mv -f "$loop_mode_file.tmp-$$" "$loop_mode_file"
fi
if [[ "$PIPELINE" == 1 && -z "${LOOP_MODE_CHECK_ONLY:-}" ]]; then  # the multi-node driver only checks
  # shellcheck source=recipes/loop_pipelined.sh
  source "$(dirname "${BASH_SOURCE[0]}")/loop_pipelined.sh"
  exit 0   # loop_pipelined.sh exits itself; this line is never reached
fi
