"""One generated source and its episodes: every episode in a fresh confined process.

``EnvWorker`` is what ``SandboxPool.open(code)`` returns. Opening it forks one process that loads
the source (so a source that does not import fails at once) and keeps it for the first episode;
every later episode gets a process of its own, forked from the zygote and loaded again. So no
state, module-level or otherwise, crosses episodes, and the env process learns nothing but the
seed and the actions: the episode id stays here.

Every reply is decoded against the schema of its request (``protocol.REPLIES``), must echo the
request's number, and is checked again with the env process's own value checks (``checks.py``).
Anything else is that env's ``sandbox_violation``. A reply that is late, too large, garbled or
drowned in stdout ends the worker: every process of it is SIGKILLed by the zygote, which reaps it,
and every later call raises the same ``EnvError``. An error inside one episode (``step_exception``,
``obs_not_str``...) ends that episode's process only.

In the process tier, where an env process could not mount its own scratch tmpfs (no
CAP_SYS_ADMIN), the supervisor sums the env's working dir after every reply: ``disk_limit``.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass

from spade_cli.sandbox import protocol
from spade_cli.sandbox.checks import Rejected, check_info, check_obs, check_reward
from spade_cli.sandbox.config import EnvError, SandboxConfig, SandboxUnavailable
from spade_cli.sandbox.envproc import precompiled
from spade_cli.sandbox.zygote import Zygote

ENV_REASONS = frozenset(
    "syntax_error import_error no_env_class memory_limit disk_limit reset_exception reset_bad_return "
    "step_exception step_bad_return obs_not_str obs_too_large reward_not_finite reward_not_real "
    "flags_not_bool info_not_json sandbox_violation".split()
)  # what an env process may say about its own env; any other reason in a reply is a forgery


@dataclass(eq=False)
class _Proc:
    """One confined env process, forked by the zygote: it loads the source and plays one episode."""

    pid: int
    sock: socket.socket
    reader: protocol.FrameReader
    dir: str | None
    scratch: str = "none"
    sent: int = 0  # requests sent so far: the number the next reply must echo


# validate opens three workers per source (two zygotes, the probes): compile it once for all
_precompiled = functools.lru_cache(maxsize=16)(precompiled)


class EnvWorker:
    """One generated source; every episode in a fresh confined process. See the module docstring."""

    def __init__(self, zygote: Zygote, cfg: SandboxConfig, code: str, env_id: str):
        self.zygote, self.cfg, self.code, self.env_id = zygote, cfg, code, env_id
        self.lock = threading.Lock()
        self.alive = True
        self.death: EnvError | None = None
        self.exit: dict | None = None
        self.sink = protocol.OutputSink()
        self.episode_time: dict[str, float] = {}
        self.procs: dict[str, _Proc] = {}
        self.class_name: str | None = None
        self.spec = zygote.env_spec()
        self.compiled = _precompiled(code, cfg.max_frame // 2)
        self.spare: _Proc | None = None
        with self.lock:
            self.spare = self._spawn()  # the import check: a source that does not load fails here

    # -- processes -------------------------------------------------------------------------------
    def _spawn(self) -> _Proc:
        """A fresh process with the source loaded, ready for its one episode."""
        if not self.alive:
            raise self.death or EnvError("crashed", "the env process is gone")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        try:
            # "retry": no confined child was ready. The zygote forks one before its next request,
            # but another thread may take it first: each round serves at least one of them.
            for _ in range(64):
                reply = self.zygote.request({"op": "spawn", "spec": self.spec}, (theirs.fileno(), out_w))
                if "pid" in reply:
                    break
            else:
                raise SandboxUnavailable(f"the sandbox zygote would not start an env process: {reply}")
        except BaseException:
            mine.close()
            os.close(out_r)
            raise
        finally:
            theirs.close()
            os.close(out_w)
        proc = _Proc(reply["pid"], mine, protocol.FrameReader(mine.fileno(), out_r, self.sink, self.cfg.max_frame,
                                                             self.cfg.max_output_bytes), reply.get("dir"))
        deadline = time.monotonic() + self.cfg.import_timeout_s
        load = protocol.Load(code="" if self.compiled else self.code, compiled=self.compiled, n=1)
        try:
            # The source goes out now and waits in the socket: the launcher reads it only after
            # sending its own word, so the first frame is still the launcher's.
            self._send(proc, load, deadline)
            hello = protocol.unpack(proc.reader.read(deadline), protocol.HELLO)
        except protocol.FrameError as err:
            raise self._broken(err, proc, "load", self.cfg.import_timeout_s) from None
        if type(hello) is protocol.SetupFailed:
            self._end(proc)
            raise SandboxUnavailable(f"an env process could not confine itself: {hello.detail[:500]}")
        proc.scratch = hello.scratch
        loaded = self._call(proc, load, max(0.0, deadline - time.monotonic()), "load", sent=True)
        self.class_name = loaded.cls
        return proc

    def _end(self, proc: _Proc, wait: bool = False) -> dict:
        """SIGKILL the process group; with ``wait``, reap it and say how it ended (the zygote
        does both). Without, the zygote reaps it while serving later requests."""
        try:
            if wait:
                status = self.zygote.request({"op": "kill", "pid": proc.pid})
            else:
                self.zygote.notify({"op": "drop", "pid": proc.pid})
                status = {}
        except SandboxUnavailable:
            status = {"gone": True}
        proc.sock.close()
        if proc.reader.out_fd is not None:
            os.close(proc.reader.out_fd)
            proc.reader.out_fd = None
        return status

    def _die(self, reason: str, detail: str, proc: _Proc | None = None, status: dict | None = None) -> EnvError:
        """End every process of this env; the worker stays dead with this error."""
        self.alive = False
        if proc is not None:
            self.exit = status if status is not None else self._end(proc, wait=True)
        for p in [*self.procs.values(), *([self.spare] if self.spare else [])]:
            if p is not proc:
                self._end(p)
        self.procs.clear()
        self.spare = None
        self.death = EnvError(reason, detail)
        return self.death

    # -- transport -----------------------------------------------------------------------------
    def _send(self, proc: _Proc, msg: protocol.msgspec.Struct, deadline: float) -> None:
        frame = protocol.pack(msg)
        try:
            n = os.write(proc.sock.fileno(), frame)  # a request fits the socket buffer at once...
        except BlockingIOError:
            n = 0
        except OSError:
            raise protocol.FrameError("eof") from None
        view = memoryview(frame)[n:]
        while view:  # ...unless it carries a long source or action (each write waits a SLICE at most)
            try:
                n = os.write(proc.sock.fileno(), view)
                view = view[n:]
            except BlockingIOError:
                proc.reader.drain_output()  # an env blocked on its full pipe reads nothing
                if time.monotonic() > deadline:
                    raise protocol.FrameError("timeout") from None
            except OSError:
                raise protocol.FrameError("eof") from None

    def _call(self, proc: _Proc, msg: protocol.msgspec.Struct, timeout: float, phase: str, sent: bool = False):
        """Send one request (unless ``sent`` already) and decode its reply against the only
        schema that request allows."""
        if not self.alive:
            raise self.death or EnvError("crashed", "the env process is gone")
        deadline = time.monotonic() + timeout
        proc.sent += 1
        msg.n = proc.sent
        try:
            # No peek for frames nobody asked for: a frame sent early or twice carries a number that
            # is not this request's, and the read below finds it before the real reply.
            if not sent:
                self._send(proc, msg, deadline)
            reply = protocol.unpack(proc.reader.read(deadline), protocol.REPLIES[type(msg)])
        except protocol.FrameError as err:
            raise self._broken(err, proc, phase, timeout) from None
        if reply.n != proc.sent:
            raise self._die("sandbox_violation", f"a reply numbered {reply.n} to request {proc.sent}", proc)
        if proc.scratch == "budget" and proc.dir and _tree_bytes(proc.dir) > self.cfg.scratch_mb << 20:
            raise self._die("disk_limit", f"the working dir holds more than {self.cfg.scratch_mb} MiB", proc)
        if type(reply) is not protocol.Failed:
            return reply
        reason, detail = reply.reason, reply.detail[:1000]
        if reason not in ENV_REASONS:
            raise self._die("sandbox_violation", f"a reply claims reason {reason[:60]!r}", proc)
        if reason in ("memory_limit", "disk_limit") or phase == "load":
            raise self._die(reason, detail, proc)
        raise EnvError(reason, detail)

    def _broken(self, err: protocol.FrameError, proc: _Proc, phase: str, timeout: float) -> EnvError:
        if err.kind == "timeout":
            reason = "import_timeout" if phase == "load" else "step_timeout"
            return self._die(reason, f"{phase} took longer than {timeout:.3g} s; killed", proc)
        if err.kind == "output_flood":
            return self._die("output_flood", err.detail, proc)
        if err.kind == "too_large":
            return self._die("obs_too_large", err.detail, proc)
        if err.kind == "garbled":
            return self._die("sandbox_violation", f"a frame that is not a valid {phase} reply: {err.detail}", proc)
        status = self._end(proc, wait=True)  # eof: the process ended on its own; ask how
        tail = self.sink.text()[-300:]
        if "signal" in status:
            sig = status["signal"]
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            over_cpu = sig == signal.SIGXCPU or (sig == signal.SIGKILL and status.get("cpu_s", 0) >= self.cfg.cpu_s)
            reason = "step_timeout" if over_cpu else "crashed"
            err2 = EnvError(reason if phase != "load" or reason == "crashed" else "import_timeout",
                            f"killed by {name} during {phase}")
        else:
            err2 = EnvError("import_error" if phase == "load" else "exited_early",
                            f"exited with status {status.get('exit')} during {phase}"
                            + (f"; output: {tail}" if tail else ""))
        return self._die(err2.reason, err2.detail, proc, status)

    # -- the public surface --------------------------------------------------------------------
    def _timed(self, episode: str, proc: _Proc, msg: protocol.msgspec.Struct, timeout: float, phase: str):
        spent = self.episode_time.get(episode, 0.0)
        left = self.cfg.episode_timeout_s - spent
        if left <= 0:
            self.procs.pop(episode, None)
            self._end(proc)
            raise EnvError("step_timeout", f"episode {episode!r} used its {self.cfg.episode_timeout_s} s")
        t0 = time.monotonic()
        try:
            return self._call(proc, msg, min(timeout, left), phase)
        except EnvError:
            if self.procs.pop(episode, None) is proc and self.alive:
                self._end(proc)  # a broken episode is never continued
            raise
        finally:
            self.episode_time[episode] = spent + time.monotonic() - t0

    def _checked(self, proc: _Proc, check, *args):
        """A value check of the shared implementation. The env process made it already, so a
        value that fails it here arrived in a frame the env's code wrote itself."""
        try:
            return check(*args)
        except Rejected as rej:
            raise self._die("sandbox_violation", f"a reply fails the {rej.reason} check: {rej.detail}", proc) from None

    def reset(self, episode: str, seed: int, options: dict | None = None) -> tuple[str, dict]:
        """Start ``episode`` in a fresh process (a reset of a running episode starts it over)."""
        with self.lock:
            old = self.procs.pop(episode, None)
            if old is not None:
                self._end(old)
            proc, self.spare = self.spare or self._spawn(), None
            self.procs[episode] = proc
            self.episode_time[episode] = 0.0
            r = self._timed(episode, proc, protocol.Reset(seed=int(seed), options=options),
                            self.cfg.reset_timeout_s, "reset")
            obs = self._checked(proc, check_obs, r.obs, self.cfg.max_obs_chars)
            return obs, self._checked(proc, check_info, r.info)

    def step(self, episode: str, action: str) -> tuple[str, float, bool, bool, dict]:
        action = str(action)[: self.cfg.max_action_chars]
        if not action.isascii():
            action = action.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates over the wire
        with self.lock:
            if not self.alive:
                raise self.death or EnvError("crashed", "the env process is gone")
            proc = self.procs.get(episode)
            if proc is None:
                raise EnvError("step_exception", f"no open episode {episode!r} (reset it first)")
            r = self._timed(episode, proc, protocol.Step(action=action), self.cfg.step_timeout_s, "step")
            try:  # _checked's rule, in one block on the hot path
                return (check_obs(r.obs, self.cfg.max_obs_chars), check_reward(r.reward), r.term, r.trunc,
                        check_info(r.info))
            except Rejected as rej:
                raise self._die("sandbox_violation", f"a reply fails the {rej.reason} check: {rej.detail}",
                                proc) from None

    def check_env(self, after: str | None = None) -> dict:
        """gymnasium's checker (it builds, resets and steps an instance of its own). With
        ``after``, in the process of that episode once it was played to its end (the episode's
        results are in by then, so what the checker does cannot change them), which saves a
        process; else in a process of its own. The process ends with it."""
        with self.lock:
            proc = self.procs.pop(after, None) if after is not None else None
            if proc is None:
                proc, self.spare = self.spare or self._spawn(), None
            self.episode_time.pop(after, None)
            try:
                r = self._call(proc, protocol.CheckEnv(), self.cfg.reset_timeout_s * 5, "check_env")
            finally:
                if self.alive:
                    self._end(proc)
            return {"error": r.error, "skipped": r.skipped, "warnings": list(r.warnings)}

    def close_episode(self, episode: str) -> None:
        with self.lock:
            self.episode_time.pop(episode, None)
            proc = self.procs.pop(episode, None)
            if proc is not None and self.alive:
                self._end(proc)

    def close(self) -> None:
        with self.lock:
            if self.alive:
                self._die("crashed", "the worker was closed")
            self.death = self.death or EnvError("crashed", "the worker was closed")

    @property
    def output(self) -> str:
        """The last few KB its processes printed (never part of the protocol). A reply can arrive
        before the pipe's last bytes were read (the pipe is drained between read slices), so what
        the live processes' pipes still hold is moved to the sink first: here, not after every
        reply, which keeps the step's round trip free of it."""
        with self.lock:
            for proc in list(self.procs.values()):
                try:
                    proc.reader.drain_output()
                except protocol.FrameError:
                    break  # a flood: the next request to that process reports it
        return self.sink.text()


def _tree_bytes(path: str) -> int:
    """Bytes and inodes under ``path`` (an inode counted as 4 KiB): the process tier's scratch budget."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    total += 4096
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    else:
                        total += e.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total
