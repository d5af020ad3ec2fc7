"""The zygote: the trusted fork server on the far side of the sandbox.

The supervisor starts one **zygote** per (tier, ``PYTHONHASHSEED``) with a cleared environment.
It pre-imports the runtime (msgspec, gymnasium, numpy) so a confined env process costs one
``fork`` instead of a fresh interpreter, and forks the next env process (``envproc.py``) ahead of
time, while the current request is served. It waits on a SOCK_SEQPACKET control socket for:

* ``spawn`` (with two fds passed by SCM_RIGHTS: the env's protocol socket and the write end of its
  output pipe) hands the oldest waiting, already confined env process its sockets;
* ``prefork`` (a spec and a count) forks that many env processes ahead, between requests, so a
  stage that starts many episodes at once (rollout's first tick) finds them confined already;
* ``kill`` SIGKILLs an env process group, reaps it and reports how it ended; ``drop`` SIGKILLs it
  and reaps it later, while serving other requests, and is not answered (the supervisor does not
  wait for it). A pid the supervisor holds is only reaped after the supervisor let go of it, so it
  never names a recycled process;
* ``shutdown`` (or EOF on the control socket, i.e. the supervisor died) kills every env and exits.
"""

from __future__ import annotations

import collections
import gc
import os
import random
import select
import shutil
import signal
import socket
import sys
import tempfile

from spade_cli.sandbox import confine, protocol
from spade_cli.sandbox.checks import check_info
from spade_cli.sandbox.envproc import env_main

CTRL_MAX = 1 << 16
# At most this many children forked ahead by one prefork: each holds its copied pages (about
# 2 MiB measured, private to it) while it waits.
MAX_PREFORK = 64
_UID_DRAW = random.SystemRandom()


# -- the zygote -----------------------------------------------------------------------------------

def _runtime_paths() -> list[str]:
    """Read-only paths an env process needs: system libraries, the stdlib and site-packages.

    Only those: not every ``sys.path`` entry, which would add the checkout of an editable install
    (and with it a run directory inside it, ``.git/config``, ...) or the current directory. spade's
    own modules are imported by the zygote before it forks, so the env process never reads them.
    """
    import site
    import sysconfig

    paths = {"/usr", "/lib", "/lib64", "/bin", "/etc/localtime", "/etc/ld.so.cache", "/dev/urandom"}
    schemes = [sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix,
                                                                 "platbase": sys.base_exec_prefix})]
    roots = [d[k] for d in schemes for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += site.getsitepackages()
    for p in roots:
        paths.add(p)
        paths.add(os.path.realpath(p))
    return sorted(p for p in paths if os.path.exists(p))


def _remove_dir(path: str) -> None:
    """An env's dir. Usually empty here (its files were on a tmpfs in the env's own mount
    namespace): one rmdir, not rmtree's Python walk, which the zygote would pay for in copied
    pages after every fork."""
    try:
        os.rmdir(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _status(st: int, cpu_s: float) -> dict:
    # cpu_s: an env process is pid 1 of its pid namespace, where the kernel drops a default-action
    # SIGXCPU; the RLIMIT_CPU overrun then ends in the hard limit's SIGKILL, told apart by its CPU time
    if os.WIFSIGNALED(st):
        return {"signal": os.WTERMSIG(st), "cpu_s": round(cpu_s, 3)}
    return {"exit": os.WEXITSTATUS(st) if os.WIFEXITED(st) else -1}


def _reap_strays(known: dict[int, str]) -> None:
    """Kill and reap children we did not fork on purpose (orphans re-parented to us)."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as fh:
            kids = [int(x) for x in fh.read().split()]
    except OSError:
        return
    for pid in kids:
        if pid not in known:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass


def _prewarm() -> None:
    """Run the lazy first-use paths once here, so no forked env process pays for them again."""
    import gymnasium

    class Warm(gymnasium.Env):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return str(self.np_random.integers(0, 10)), {}

    Warm().reset(seed=0)
    protocol.unpack(protocol.pack(protocol.Step(action="x"))[4:], protocol.REQUESTS)
    protocol.pack(protocol.StepDone(obs="x", reward=0.0, term=False, trunc=False, info=check_info({"a": [1, 2.0]})))


# What generated envs import most (the bundled pool, the tests' benign set): imported once here,
# an env process finds them in sys.modules instead of spending milliseconds per episode on them.
PREIMPORT = ("gymnasium", "gymnasium.spaces", "gymnasium.utils.env_checker", "numpy", "json", "re", "string",
             "math", "random", "itertools", "collections", "dataclasses", "typing", "functools", "heapq",
             "textwrap", "copy", "enum", "bisect", "statistics", "fractions", "warnings")


class Zygote:
    """The fork server's state. Every env process is forked at one place (``refill``, called from
    the main loop between requests), so an env process, which inherits the zygote's stack, finds on
    it nothing that differs from one episode, stage or pool to the next."""

    def __init__(self, ctrl: socket.socket):
        self.ctrl, self.read_paths, self.base = ctrl, _runtime_paths(), os.getcwd()
        # The env processes' dirs, alone in a dir of their own: an env with its own mount namespace
        # lays a tmpfs over it (confine.private_scratch), which must hide nothing but them (in the
        # strong tier the cwd is bubblewrap's /tmp, where a venv or checkout may be bound).
        self.envs = tempfile.mkdtemp(prefix="envs-", dir=self.base)
        os.chmod(self.envs, 0o711)
        self.children: dict[int, str] = {}  # env pid -> its private dir
        self.dying: set[int] = set()  # SIGKILLed by "drop", reaped when they are gone
        # confined children waiting for their sockets, oldest first: (pid, hand-off socket, dir)
        self.ready: collections.deque[tuple[int, socket.socket, str]] = collections.deque()
        self.want: bytes | None = None  # the spec of the last spawn or prefork request, packed
        self.burst = 0  # children still to fork ahead for a prefork, beyond the one kept ready
        self.pending = select.poll()
        self.pending.register(ctrl, select.POLLIN)
        self.uids: dict[int, int] = {}  # env pid -> its uid number (confine.env_uid), while it lives
        self.pidns = confine.own_pid_namespace()  # None where new pid namespaces are not allowed

    def refill(self) -> None:
        """Fork and (in the child) confine env processes for the last spec asked for: one kept
        ready, and a prefork's burst. A request that arrives meanwhile is served first."""
        if self.want is None:
            return
        while not self.ready or self.burst > 0:
            self.fork_one()
            self.burst = max(0, self.burst - 1)
            if self.pending.poll(0):
                return

    def fork_one(self) -> None:
        uid = self.free_uid()
        spec = {**protocol.unpack(self.want), "read_paths": self.read_paths, "uid": uid}
        workdir = tempfile.mkdtemp(prefix="env-", dir=self.envs)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Pid 1 of a pid namespace of its own, so every env process has the same pid: counted
        # pids would tell it how many episodes of the stage ran before it.
        fresh = self.pidns is not None and confine.new_pid_namespace(self.pidns)
        pid = os.fork()
        if fresh and pid:
            confine.same_pid_namespace(self.pidns)  # the zygote's own again, for every other fork
        if pid == 0:
            self.ctrl.close()
            mine.close()
            for _pid, sock, _dir in self.ready:
                sock.close()
            if self.pidns is not None:
                os.close(self.pidns)
            # This object stays reachable from the env's stack (``self`` of this frame): none of
            # the zygote's bookkeeping may stay in it. How many siblings live (``uids``) or are
            # still to be forked ahead (``burst``, only ever set by rollout's prefork) would tell
            # the env its stage.
            self.__dict__.clear()
            env_main(theirs, spec, workdir)
        theirs.close()
        self.uids[pid] = uid
        self.ready.append((pid, mine, workdir))

    def free_uid(self) -> int:
        """A uid number no live env process holds, drawn from the OS (not ``random``'s shared
        state, which every env process inherits)."""
        while True:
            n = _UID_DRAW.randrange(confine.ENV_UIDS)
            if n not in self.uids.values():
                return n

    def forget(self, pid: int) -> None:
        self.uids.pop(pid, None)
        _remove_dir(self.children.pop(pid))

    def discard_ready(self) -> None:
        while self.ready:
            pid, sock, workdir = self.ready.popleft()
            sock.close()  # the child sees EOF and exits; it is reaped like a dropped one
            self.children[pid] = workdir
            self.drop(pid)

    def serve_one(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.ctrl, CTRL_MAX, 2)
        except OSError:
            return False
        if not data:
            return False
        req = protocol.unpack(data)
        self.reap_dropped()
        op = req.get("op")
        if op == "spawn":
            reply = self.spawn(bytes(protocol.pack(req["spec"])[4:]), fds)
        elif op == "kill":
            reply = self.kill(req["pid"])
        elif op == "drop":
            self.drop(req["pid"])
            return True
        elif op == "prefork":
            reply = self.prefork(bytes(protocol.pack(req["spec"])[4:]), int(req["n"]))
        elif op == "shutdown":
            return False
        else:
            reply = {"error": f"unknown op {op!r}"}
        self.ctrl.send(protocol.pack(reply)[4:])
        return True

    def use_spec(self, spec: bytes) -> None:
        if spec != self.want:  # children confined for another spec are of no use now
            self.discard_ready()
            self.burst = 0
            self.want = spec

    def prefork(self, spec: bytes, n: int) -> dict:
        self.use_spec(spec)
        self.burst = max(0, min(n, MAX_PREFORK) - len(self.ready))
        return {}

    def spawn(self, spec: bytes, fds: list[int]) -> dict:
        """Hand the oldest waiting child its sockets; without one ready for this spec, ask for a
        retry (the main loop forks one before reading the retried request)."""
        self.use_spec(spec)
        if not self.ready:
            for fd in fds:
                os.close(fd)
            return {"retry": True}
        pid, sock, workdir = self.ready.popleft()
        try:
            socket.send_fds(sock, [b"go"], fds)
        except OSError:  # it died while waiting (killed from outside): try again with a new one
            self.children[pid] = workdir
            self.drop(pid)
            return {"retry": True}
        finally:
            sock.close()
            for fd in fds:
                os.close(fd)
        self.children[pid] = workdir
        return {"pid": pid, "dir": workdir}

    def drop(self, pid: int) -> dict:
        """SIGKILL an env process and answer at once: an episode that ended needs no status, and
        its teardown (the exit, the namespaces, the dir) then overlaps the next request."""
        if pid in self.children and pid not in self.dying:
            for target in (-pid, pid):
                try:
                    os.kill(target, signal.SIGKILL)
                except OSError:
                    pass
            self.dying.add(pid)
        return {}

    def reap_dropped(self) -> None:
        for pid in list(self.dying):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.dying.discard(pid)
                self.forget(pid)

    def kill(self, pid: int) -> dict:
        """SIGKILL an env process group, reap it, and say how it ended."""
        reply = {"gone": True}
        self.dying.discard(pid)
        if pid in self.children:
            for target in (-pid, pid):
                try:
                    os.kill(target, signal.SIGKILL)
                except OSError:
                    pass
            _, st, usage = os.wait4(pid, 0)
            reply = _status(st, usage.ru_utime + usage.ru_stime)
            self.forget(pid)
        _reap_strays({**self.children, **{pid: d for pid, _sock, d in self.ready}})
        return reply

    def shutdown(self) -> None:
        self.discard_ready()
        for pid, workdir in self.children.items():
            try:
                os.kill(-pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(self.envs, ignore_errors=True)
        if os.path.basename(self.base).startswith("zyg-"):  # the process tier's own dir, also when spade died
            shutil.rmtree(self.base, ignore_errors=True)


# Libraries too slow to import in every episode (seconds) yet trusted: imported by the zygote only
# when the supervisor names them because the sources it will run import them (reasoning-gym pools).
HEAVY_OK = ("reasoning_gym",)


def zygote_main(ctrl_fd: int, heavy: list[str] | tuple[str, ...] = ()) -> None:
    import importlib

    for name in PREIMPORT:
        importlib.import_module(name)
    for name in heavy:
        if name in HEAVY_OK:  # only the allowlist: the names come from env sources
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # the env's own import fails with import_error, as without the zygote
    confine.filter_for(os.getpid())  # builds the seccomp template once, for every child
    _prewarm()
    # Objects that exist now are shared copy-on-write with every env process; keeping them out of
    # the collector means a child's first garbage collection does not touch (and copy) them all.
    gc.freeze()
    ctrl = socket.socket(fileno=ctrl_fd)
    try:
        confine.prctl(confine.PR_SET_CHILD_SUBREAPER, 1)
    except confine.ConfineError:
        pass
    zygote = Zygote(ctrl)
    # spade's own modules are imported here, before the fork: env processes read only the runtime
    nobody_ok = confine.readable_by_others([sys.base_prefix, sys.prefix])
    ctrl.send(protocol.pack({"op": "ready", "pid": os.getpid(), "uid": os.geteuid(),
                             "nobody_can_read_runtime": nobody_ok})[4:])
    while True:
        zygote.refill()  # the next env process confines itself while this request is served
        if not zygote.serve_one():
            break
    zygote.shutdown()
    os._exit(0)


if __name__ == "__main__":
    zygote_main(int(sys.argv[1]), sys.argv[2:])
