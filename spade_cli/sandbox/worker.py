"""The code that runs on the far side of the sandbox: the zygote and the env processes it forks.

The supervisor starts one **zygote** per (tier, ``PYTHONHASHSEED``) with a cleared environment.
The zygote is trusted code: it pre-imports the runtime (msgpack, gymnasium, numpy) so a confined
env process costs one ``fork`` instead of a fresh interpreter, then waits on a SOCK_SEQPACKET
control socket for three requests:

* ``spawn`` (with two fds passed by SCM_RIGHTS: the env's protocol socket and the write end of its
  output pipe) forks an **env process**, which confines itself (``confine.py``) and then serves
  exactly one generated source over its own protocol socket;
* ``kill`` SIGKILLs an env process group, reaps it and reports how it ended. The zygote never reaps
  an env process on its own, so a pid the supervisor holds can never name a recycled process;
* ``shutdown`` (or EOF on the control socket, i.e. the supervisor died) kills every env and exits.

An env process answers ``load`` (compile and run the source, find the one ``gymnasium.Env``
subclass), ``reset``, ``step``, ``close`` and ``check_env`` with plain msgpack maps. It checks every
value an env returns before it leaves the process (types, finiteness, sizes, JSON-safety) and the
supervisor checks the decoded values again, because code in this process could forge any frame.
"""

from __future__ import annotations

import errno
import gc
import os
import random
import select
import shutil
import signal
import socket
import sys
import tempfile
import types

from spade_cli.sandbox import confine, protocol
from spade_cli.sandbox.checks import Rejected, check_flag, check_info, check_obs, check_reward, describe

CTRL_MAX = 1 << 16
_UID_DRAW = random.SystemRandom()
ENV_MODULE = "spade_env"


# -- the env process ------------------------------------------------------------------------------

DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # the scratch quota, the inode cap, FSIZE


class EnvServer:
    """Serves one generated source for exactly one episode: one process, one env instance.

    Nothing about the episode reaches this process except the seed and the actions: no episode
    id, no hinted flag, no stage name. So an env cannot tell validation from rollout, or the
    hinted episode of a pair from the unhinted one, and no state outlives its episode.
    """

    def __init__(self, fd: int, max_obs_chars: int, max_frame: int):
        self.fd, self.max_obs = fd, max_obs_chars
        self.reader = protocol.BlockingReader(fd, max_frame)
        self.cls: type | None = None
        self.env: object | None = None

    def load(self, code: str) -> protocol.Loaded:
        import gymnasium

        module = types.ModuleType(ENV_MODULE)
        module.__file__ = "env.py"
        sys.modules[ENV_MODULE] = module  # dataclasses and typing look the module up by name
        try:
            exec(compile(code, "env.py", "exec"), module.__dict__)
        except SyntaxError as exc:
            raise Rejected("syntax_error", describe(exc)) from None
        except MemoryError:
            raise Rejected("memory_limit", "MemoryError while importing") from None
        except OSError as exc:
            raise Rejected("disk_limit" if exc.errno in DISK_ERRNOS else "import_error", describe(exc)) from None
        except BaseException as exc:
            raise Rejected("import_error", describe(exc)) from None
        found = [v for v in vars(module).values() if isinstance(v, type)
                 and issubclass(v, gymnasium.Env) and v.__module__ == ENV_MODULE]
        leaves = [c for c in found if not any(o is not c and issubclass(o, c) for o in found)]
        if len(leaves) != 1:
            raise Rejected("no_env_class", f"expected one gymnasium.Env subclass, found {len(leaves)}"
                           + (f": {', '.join(c.__name__ for c in leaves)}" if leaves else ""))
        self.cls = leaves[0]
        return protocol.Loaded(cls=self.cls.__name__)

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MemoryError:
            raise Rejected("memory_limit", f"MemoryError in {what}") from None
        except OSError as exc:
            if exc.errno in DISK_ERRNOS:
                raise Rejected("disk_limit", f"{what}: {describe(exc)}") from None
            raise Rejected(f"{what}_exception", describe(exc)) from None
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the env may not exit
            raise Rejected(f"{what}_exception", describe(exc)) from None

    def reset(self, seed: int, options: dict | None) -> protocol.ResetDone:
        if self.env is not None:  # the supervisor never asks twice; one process is one episode
            raise Rejected("sandbox_violation", "a second reset in one env process")
        self.env = env = self._call("reset", self.cls)
        out = self._call("reset", env.reset, seed=seed, options=options)
        if not isinstance(out, tuple) or len(out) != 2:
            raise Rejected("reset_bad_return", f"reset returned {_shape(out)}, not (obs, info)")
        obs = check_obs(out[0], self.max_obs)
        return protocol.ResetDone(obs=obs, info=check_info(out[1]))

    def step(self, action: str) -> protocol.StepDone:
        if self.env is None:
            raise Rejected("step_exception", "step before reset")
        out = self._call("step", self.env.step, action)
        if not isinstance(out, tuple) or len(out) != 5:
            raise Rejected("step_bad_return", f"step returned {_shape(out)}, not a 5-tuple")
        obs = check_obs(out[0], self.max_obs)
        reward = check_reward(out[1])
        term, trunc = check_flag(out[2], "terminated"), check_flag(out[3], "truncated")
        return protocol.StepDone(obs=obs, reward=reward, term=term, trunc=trunc, info=check_info(out[4]))

    def check_env(self) -> protocol.Checked:
        """gymnasium's own checker, when the env declares its spaces; its warnings are advisory."""
        import warnings

        from gymnasium.utils.env_checker import check_env

        env = self._call("reset", self.cls)
        if getattr(env, "observation_space", None) is None or getattr(env, "action_space", None) is None:
            return protocol.Checked(skipped="the env declares no observation/action space")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check_env(env, skip_render_check=True)
                error = None
            except BaseException as exc:
                error = describe(exc)
        return protocol.Checked(error=error, warnings=[str(w.message)[:300] for w in caught][:10])

    def serve(self) -> None:
        while True:
            try:
                req = protocol.unpack(self.reader.recv(), protocol.REQUESTS)
            except protocol.FrameError:
                os._exit(0)  # the supervisor went away (or broke the protocol itself)
            try:
                if type(req) is protocol.Step:
                    reply = self.step(req.action)
                elif type(req) is protocol.Reset:
                    reply = self.reset(req.seed, req.options)
                elif type(req) is protocol.Load:
                    reply = self.load(req.code)
                else:
                    reply = self.check_env()
            except Rejected as rej:
                reply = protocol.Failed(reason=rej.reason, detail=rej.detail)
            reply.n = req.n
            try:
                protocol.send(self.fd, reply)
            except (OSError, ValueError, TypeError, OverflowError) as exc:
                protocol.send(self.fd, protocol.Failed(reason="sandbox_violation", n=req.n,
                                                       detail=f"reply not encodable: {describe(exc)}"))
            if type(reply) is protocol.Failed and reply.reason == "memory_limit":
                os._exit(0)  # after a MemoryError the interpreter's state is not trustworthy


def _shape(value: object) -> str:
    if isinstance(value, tuple):
        return f"a {len(value)}-tuple"
    return f"a {type(value).__name__}"


def _zygote_gone(handoff: socket.socket) -> bool:
    """Whether the zygote closed the hand-off socket without handing anything over (there is no
    parent pid to compare: in a pid namespace of its own the env process sees its parent as 0).
    The zygote closes its end right after the hand-off, so a waiting message means it was there."""
    poller = select.poll()
    poller.register(handoff, select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR) and not ev & select.POLLIN for _fd, ev in poller.poll(0))


def _confine(spec: dict, workdir: str, handoff: socket.socket) -> str:
    """Every layer, in order; returns how the scratch space is capped (see protocol.Ready)."""
    os.setsid()
    uid = confine.env_uid(spec["uid"]) if spec["drop_uid"] else os.geteuid()
    scratch = "none"
    if spec["private_scratch"] and confine.private_scratch(workdir, spec["scratch_mb"], uid):
        scratch = "tmpfs"
    elif spec["scratch_budget"]:
        scratch = "budget"
    os.chdir(workdir)
    nonroot = os.geteuid() != 0
    fsize = min(spec["fsize_mb"], spec["scratch_mb"])
    confine.apply_rlimits(spec["cpu_s"], spec["memory_mb"], fsize, spec["nofile"],
                          spec["nproc"] if nonroot or spec["drop_uid"] else None)
    if spec["drop_uid"]:  # setuid away from root clears every capability
        confine.drop_privileges(workdir, uid, keep_read_search=spec["read_search"])
    elif os.geteuid() == 0:
        confine.drop_capabilities()  # root that cannot change uid
    else:
        try:  # the capabilities the zygote holds inside bubblewrap's user namespace, if any
            confine.drop_capabilities()
        except confine.ConfineError:
            pass  # an unprivileged process without them: nothing to drop
    confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
    if _zygote_gone(handoff):
        os._exit(1)  # the zygote died between fork and prctl
    if spec["landlock"]:
        confine.apply_landlock(spec["read_paths"], [workdir, os.devnull])
    if spec["seccomp"]:
        confine.apply_seccomp(os.getpid())
    os.environ.clear()
    os.environ.update({"HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
    tempfile.tempdir = workdir
    return scratch


def env_main(handoff: socket.socket, spec: dict, workdir: str) -> None:
    """Child side: confine ahead of time, wait to be handed the env's sockets, say so, serve.

    The zygote forks and confines the next env process while the current episode plays, so an
    episode starts by a hand-off (two fds over ``handoff``) instead of a fork plus confinement.
    Never returns.
    """
    error = None
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        hello = protocol.Ready(scratch=_confine(spec, workdir, handoff))
    except BaseException as exc:  # a setup failure, reported before any env code exists here
        error = describe(exc)
    max_obs, max_frame = spec["max_obs_chars"], spec["max_frame"]
    spec.clear()  # the limits are the kernel's now; the env finds no copy of its config on the stack
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(handoff, 16, 2)
    except OSError:
        os._exit(0)
    handoff.close()
    if len(fds) != 2:
        os._exit(0)  # the zygote is discarding this child
    proto_fd, out_fd = fds
    fds.clear()
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    try:
        protocol.send(proto_fd, hello if error is None else protocol.SetupFailed(detail=error))
        if error is None:
            EnvServer(proto_fd, max_obs, max_frame).serve()
    finally:
        os._exit(0 if error is None else 3)


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


def _status(st: int) -> dict:
    if os.WIFSIGNALED(st):
        return {"signal": os.WTERMSIG(st)}
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
        self.children: dict[int, str] = {}  # env pid -> its private dir
        self.dying: set[int] = set()  # SIGKILLed by "drop", reaped when they are gone
        # one confined child waiting for its sockets: (pid, hand-off socket, dir, its spec's bytes)
        self.ready: tuple[int, socket.socket, str, bytes] | None = None
        self.want: bytes | None = None  # the spec of the last spawn request, packed
        self.uids: dict[int, int] = {}  # env pid -> its uid number (confine.env_uid), while it lives
        self.pidns = confine.own_pid_namespace()  # None where new pid namespaces are not allowed

    def refill(self) -> None:
        """Fork and (in the child) confine the next env process for the last spec asked for."""
        if self.want is None or (self.ready is not None and self.ready[3] == self.want):
            return
        self.discard_ready()
        uid = self.free_uid()
        spec = {**protocol.unpack(self.want), "read_paths": self.read_paths, "uid": uid}
        workdir = tempfile.mkdtemp(prefix="env-", dir=self.base)
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
            if self.pidns is not None:
                os.close(self.pidns)
            self.children.clear()
            self.dying.clear()
            self.ready = self.want = None
            env_main(theirs, spec, workdir)
        theirs.close()
        self.uids[pid] = uid
        self.ready = (pid, mine, workdir, self.want)

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
        if self.ready is not None:
            pid, sock, workdir, _ = self.ready
            self.ready = None
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
            reply = self.drop(req["pid"])
        elif op == "shutdown":
            return False
        else:
            reply = {"error": f"unknown op {op!r}"}
        self.ctrl.send(protocol.pack(reply)[4:])
        return True

    def spawn(self, spec: bytes, fds: list[int]) -> dict:
        """Hand the waiting child its sockets; without one ready for this spec, ask for a retry
        (the main loop forks one before reading the retried request)."""
        self.want = spec
        ready, self.ready = self.ready, None
        if ready is None or ready[3] != spec:
            self.ready = ready
            for fd in fds:
                os.close(fd)
            return {"retry": True}
        pid, sock, workdir, _ = ready
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
            _, st = os.waitpid(pid, 0)
            reply = _status(st)
            self.forget(pid)
        _reap_strays({**self.children, **({self.ready[0]: ""} if self.ready else {})})
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
