#!/usr/bin/env bash
# One server of the fleet of serve.sbatch, which runs this on every node through srun.
# Starts SERVER (vllm | transformers) on a free port, waits until it answers a one-token completion
# for the model name CKPT, then reports HOST:PORT as $SERVE_READY_DIR/node-$SLURM_NODEID.addr and
# stays with the server until it exits (scancel of the fleet ends both).
#
# SERVE_HOST: the address the server listens on (default 0.0.0.0, reachable from the rollout nodes;
# the report then names the node by hostname); PORT fixes the port (default: a free one, picked here,
# so two fleets on one node never collide); TP: GPUs an engine (default 1, for Qwen3-4B and 8B; 2 for
# Qwen3-30B-A3B), with data parallel over the node's GPUs (NGPU, default the job's) by TP; the
# rollout shards pin each episode to one engine (X-data-parallel-rank), whose prefix cache holds it;
# SERVE_ARGS: added to the server's command line.
set -euo pipefail
CKPT="${CKPT:?}"; SERVER="${SERVER:-vllm}"; READY="${SERVE_READY_DIR:?}"
SERVE_HOST="${SERVE_HOST:-0.0.0.0}"; SERVE_WAIT_S="${SERVE_WAIT_S:-1800}"; SERVE_ARGS="${SERVE_ARGS:-}"
port="${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}"
addr="$SERVE_HOST"
[[ "$addr" == 0.0.0.0 || "$addr" == "::" ]] && addr="$(hostname)"
TP="${TP:-1}"; NGPU="${NGPU:-${SLURM_GPUS_ON_NODE:-8}}"
DP=$((NGPU / TP > 0 ? NGPU / TP : 1))
case "$SERVER" in
  vllm) cmd=(vllm serve "$CKPT" --host "$SERVE_HOST" --port "$port" --tensor-parallel-size "$TP"
             --data-parallel-size "$DP" --dtype bfloat16 --logprobs-mode processed_logprobs --max-logprobs 1) ;;
  # the positional model pins the server: it answers for that name only, and loads it at start
  transformers) cmd=(transformers serve "$CKPT" --host "$SERVE_HOST" --port "$port") ;;
  *) echo "SERVER=$SERVER: choose vllm or transformers" >&2; exit 2 ;;
esac
# shellcheck disable=SC2206
cmd+=($SERVE_ARGS)
echo "== $(date -Is) $(hostname) node ${SLURM_NODEID:-0}: ${cmd[*]}" >&2
server=""
trap '[[ -z "$server" ]] || kill -TERM "$server" 2>/dev/null || true' TERM INT
"${cmd[@]}" &
server=$!

probe="$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "prompt": "hi", "max_tokens": 1}))' \
         "$CKPT")"
body="$(mktemp)"
for ((t = 0; ; t += 2)); do
  if ! kill -0 "$server" 2>/dev/null; then
    rc=0; wait "$server" || rc=$?
    echo "$SERVER exited with $rc before it answered" >&2; exit $((rc ? rc : 1))
  fi
  code="$(curl -s -o "$body" -w '%{http_code}' -m 60 -H 'Content-Type: application/json' \
          -d "$probe" "http://$addr:$port/v1/completions" || true)"
  [[ "$code" == 200 ]] && break
  if [[ "$code" == 4* ]]; then   # up, but refuses the request the rollouts will send: a setup error
    echo "$SERVER on $addr:$port answers $code to a completion for model '$CKPT': $(head -c 500 "$body")" >&2
    kill -TERM "$server" 2>/dev/null || true
    exit 1
  fi
  ((t < SERVE_WAIT_S)) || { echo "$SERVER on $addr:$port not answering after ${SERVE_WAIT_S}s" >&2; exit 1; }
  sleep 2
done
rm -f "$body"
echo "$addr:$port" > "$READY/node-${SLURM_NODEID:-0}.addr.tmp"
mv "$READY/node-${SLURM_NODEID:-0}.addr.tmp" "$READY/node-${SLURM_NODEID:-0}.addr"
echo "== $(date -Is) $SERVER answers on $addr:$port for '$CKPT'" >&2
rc=0
wait "$server" || rc=$?
while kill -0 "$server" 2>/dev/null; do rc=0; wait "$server" || rc=$?; done
exit "$rc"
