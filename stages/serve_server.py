"""The server a run's ``spade serve`` state file describes: its identity, its HTTP routes, its life.

``stages/serve.py`` decides what to do (start, load, restart, sleep); this module does it to one
server and owns the state file ``RUN/serve[/NAME]/server.json``.

**Identity before any signal.** A state file outlives its server: a requeued job on another node,
a reboot, or plain time gives the recorded pid to an unrelated process. A server counts as running
only when the pid runs on the recorded host and started at the recorded time (``/proc/PID/stat``,
clock ticks since boot), and it is signalled only then. A state file without the host or the start
time (one written by an earlier spade) cannot tell its server from a stranger that took the pid: if
that pid runs, nothing is signalled and the user is told how to check and stop it by hand. spade
starts the server as the leader of a new process group (vLLM's engine and worker processes are its
children), so the group is signalled; a pid that leads no group is signalled alone.

    server = Server("runs/demo")
    server.identity()        # "alive", "gone" or "unknown"
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import SpadeError, atomic_write_text, fingerprint
from spade_cli.core.layout import RunLayout
from spade_cli.core.locks import proc_start as _proc_start
from spade_cli.core.locks import proc_stat as _proc_stat

SERVED_NAME = "spade"


def server_env() -> dict[str, str]:
    # the development routes (sleep, wake_up, collective_rpc, reset_prefix_cache, server_info) are off otherwise
    return {"VLLM_SERVER_DEV_MODE": "1"}


class ReloadUnsupported(SpadeError):
    pass


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
            state = json.loads(self.state_path.read_bytes())
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise SpadeError(f"{self.state_path}: cannot read the server state ({exc.strerror})") from None
        except ValueError as exc:  # not JSON, or not UTF-8
            raise SpadeError(f"{self.state_path}: not a server state file ({exc}); if a server of this run "
                             "still runs, stop it yourself, then remove the file") from None
        if not isinstance(state, dict):
            raise SpadeError(f"{self.state_path}: not a server state file (JSON {type(state).__name__}, not an "
                             "object); if a server of this run still runs, stop it yourself, then remove the file")
        return state

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

    # -- which process ---------------------------------------------------------------------------

    def identity(self) -> str:
        """``alive``: the state's server runs (its pid, on this host, started when the state says);
        ``gone``: nothing of it runs here; ``unknown``: a process has the pid but the state records
        no host or start time to tell whether it is the server."""
        pid = self.state.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:  # 0 and -1 name groups of processes
            return "gone"
        host = self.state.get("host")
        if host is not None and host != socket.gethostname():
            return "gone"  # started on another node, which this one cannot signal: that job is over
        now = _proc_stat(pid)
        if now is None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return "gone"
            except PermissionError:
                pass
            return "unknown"  # no /proc to read its start time from
        state, started = now
        if state == "Z":
            return "gone"  # exited, not yet reaped: it holds nothing
        recorded = self.state.get("proc_start")
        if host is None or not isinstance(recorded, int):
            return "unknown"
        return "alive" if started == recorded else "gone"

    def alive(self) -> bool:
        return self.identity() == "alive"

    def unidentified(self) -> str:
        pid = self.state.get("pid")
        return (f"{self.state_path} names pid {pid} but not the host and start time of the server (a state file "
                "of an earlier spade), so spade cannot tell the server from a process that took the pid since, "
                f"and signals nothing. If pid {pid} is the vLLM server (ps -o pid,lstart,args -p {pid}), stop it "
                f"yourself (kill -TERM -- -{pid}); then remove {self.state_path}")

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, model: Path, cmd: list[str], port: int, host: str, wait_s: float, **record: Any) -> float:
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
                      "sleep_mode": "--enable-sleep-mode" in cmd, "log": str(self.dir / "server.log"), **record}
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
        """Stop the server (TERM, then KILL after 30 s) and remove the state file; False when it was
        gone already. Refuses (SpadeError) a running pid it cannot identify."""
        who = self.identity()
        if who == "unknown":
            raise SpadeError(self.unidentified())
        stopped = False
        if who == "alive":
            pid = self.state["pid"]
            leads = _leads_group(pid)
            _signal(pid, signal.SIGTERM, leads)
            if not _wait(lambda: not self.alive(), 30.0):
                _signal(pid, signal.SIGKILL, leads)
                _wait(lambda: not self.alive(), 10.0)
            _reap(pid)
            if leads:  # what it started (vLLM's engine processes) goes with it
                if not _wait(lambda: not _group_exists(pid), 10.0):
                    _signal(pid, signal.SIGKILL, True)
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
            self.reset_prefix_cache()
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

    def reset_prefix_cache(self, wait_s: float = 60.0) -> None:
        """Drop the cached prefixes (the old weights' keys and values). vLLM answers
        ``{"success": false}`` while running requests hold blocks: retried until they finish."""
        deadline = time.monotonic() + wait_s
        while (answer := self.call("POST", "/reset_prefix_cache", timeout=120)) is not None:
            if not (isinstance(answer, dict) and answer.get("success") is False):
                return
            if time.monotonic() > deadline:
                raise SpadeError(f"{self.root_url}: the prefix cache could not be reset within {wait_s:.0f} s "
                                 "(requests still hold its blocks); the server keeps the old weights' prefixes")
            time.sleep(1.0)


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


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _signal(pid: int, sig: int, group: bool) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait(done: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
