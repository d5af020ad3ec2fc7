#!/usr/bin/env bash
# One server of the fleet that lives for a whole multi-node run (driver.sh with ENGINE=serve):
# serve.sbatch runs this on every node through srun when SERVER=spade.
#
# It serves what the driver asks for. The driver writes a request, "ID<TAB>ITERATION<TAB>CKPT", to
# $FLEET_DIR/want (atomically); this script answers each new request by running
#   spade serve --run-dir RUN --server node-N --model CKPT --iteration ITERATION ...
# which starts the node's engine the first time and afterwards loads CKPT into the running engine
# (a timed restart where vLLM can't reload in place; stages/serve.py), and writes the answer to
# $FLEET_DIR/node-N.done: "ID<TAB>ok" (or "ID<TAB>failed RC") and spade serve's JSON summary.
# After its first answer it reports HOST:PORT as $SERVE_READY_DIR/node-N.addr, as serve_node.sh does.
# Each node keeps its server's state in RUN/serve/node-N/ (server.json, server.log, events.jsonl).
#
# The engine is started detached from this script (spade serve returns once it answers), so this
# script stays with it: it ends with exit 1 when the engine dies outside a load (the fleet is then
# broken and the driver says so), and on SIGTERM (scancel of the fleet) it stops the engine itself.
#
# SERVE_HOST (default 0.0.0.0: reachable from the other nodes, reported by hostname), PORT (default:
# a free one, picked once, so a restarted engine keeps the address), SERVE_ARGS (spade serve's
# engine flags, e.g. --tensor-parallel-size 2 for Qwen3-30B-A3B; the default is tensor parallel 1,
# data parallel over the node's GPUs), SERVE_WAIT_S (spade serve --wait).
set -euo pipefail
RUN="${RUN:?}"; REQUESTS="${FLEET_DIR:?}"; READY="${SERVE_READY_DIR:?}"
SERVE_HOST="${SERVE_HOST:-0.0.0.0}"; SERVE_WAIT_S="${SERVE_WAIT_S:-1800}"; SERVE_ARGS="${SERVE_ARGS:-}"
name="node-${SLURM_NODEID:-0}"
port="${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}"
addr="$SERVE_HOST"
[[ "$addr" == 0.0.0.0 || "$addr" == "::" ]] && addr="$(hostname)"
echo "== $(date -Is) $(hostname) $name: spade serve on $addr:$port, requests from $REQUESTS/want" >&2

stop=0 child="" served="" pid="" reported=0
trap 'stop=1; [[ -z "$child" ]] || kill -TERM "$child" 2>/dev/null || true' TERM INT
stop_engine() { spade serve --run-dir "$RUN" --server "$name" --do stop >/dev/null || true; }

while ((stop == 0)); do
  want=""
  [[ -f "$REQUESTS/want" ]] && want="$(<"$REQUESTS/want")"
  if [[ -n "$want" && "$want" != "$served" ]]; then
    IFS=$'\t' read -r id iter ckpt <<<"$want"
    echo "== $(date -Is) $name: request $id: serve $ckpt (iteration $iter)" >&2
    rc=0
    # shellcheck disable=SC2086
    spade serve --run-dir "$RUN" --server "$name" --model "$ckpt" --iteration "$iter" --host "$SERVE_HOST" \
      --port "$port" --wait "$SERVE_WAIT_S" $SERVE_ARGS >"$REQUESTS/$name.out" &
    child=$!
    wait "$child" || rc=$?
    while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
    child=""
    ((stop == 0)) || break
    status=ok
    ((rc == 0)) || status="failed $rc"
    { printf '%s\t%s\n' "$id" "$status"; cat "$REQUESTS/$name.out"; } >"$REQUESTS/$name.done.tmp"
    mv -f "$REQUESTS/$name.done.tmp" "$REQUESTS/$name.done"
    served="$want"
    if ((rc == 0)); then
      # the engine's pid, which a restart changes
      pid="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["pid"])' "$REQUESTS/$name.out")"
      if ((reported == 0)); then   # serve.sbatch lists the fleet once every node has reported
        echo "$addr:$port" >"$READY/node-${SLURM_NODEID:-0}.addr.tmp"
        mv "$READY/node-${SLURM_NODEID:-0}.addr.tmp" "$READY/node-${SLURM_NODEID:-0}.addr"
        reported=1
      fi
      echo "== $(date -Is) $name: serves $ckpt on $addr:$port (pid $pid)" >&2
    fi
  fi
  if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
    echo "$name: the engine (pid $pid) exited outside a load; see its server.log in RUN/serve/$name/" >&2
    stop_engine
    exit 1
  fi
  sleep 1 & child=$!; wait "$child" || true; child=""
done
echo "== $(date -Is) $name: stopping the engine" >&2
stop_engine
