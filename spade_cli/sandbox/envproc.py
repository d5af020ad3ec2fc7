"""The env process: one confined child of the zygote that serves one source for one episode.

The zygote (``worker.py``) forks it ahead of time; ``env_main`` confines it (every layer of
``confine.py``, in order), waits to be handed its two sockets, sends the launcher's first frame
(``Ready`` or ``SetupFailed``) before any env code exists in the process, and then ``EnvServer``
answers ``load`` (compile and run the source, find the one ``gymnasium.Env`` subclass), ``reset``,
``step`` and ``check_env``. Every value an env returns is checked here before it leaves the process
(types, finiteness, sizes, JSON-safety) and again by the supervisor, because code in this process
could forge any frame.
"""

from __future__ import annotations
import __future__

import errno
import marshal
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import types
import warnings

from spade_cli.sandbox import confine, protocol
from spade_cli.sandbox.checks import Rejected, check_flag, check_info, check_obs, check_reward, describe

ENV_MODULE = "spade_env"
# How a source is compiled, wherever that happens: the flags this module's own ``compile`` call
# inherited before sources were compiled ahead (postponed annotations), and no ``-O``.
_FLAGS = __future__.annotations.compiler_flag
# CPython 3.11 keeps the parser's recursion counter per interpreter, not per thread: parses and
# compiles from concurrent threads corrupt it and raise a spurious SystemError (gh-106905).
PARSE_LOCK = threading.Lock()


def compile_source(code: str) -> types.CodeType:
    return compile(code, "env.py", "exec", flags=_FLAGS, dont_inherit=True, optimize=0)


def precompiled(code: str, cap: int) -> bytes | None:
    """The source compiled by the supervisor, marshalled for ``Load``, so each of its env
    processes (one per episode) unmarshals it in microseconds instead of compiling it again.
    None for a source that does not compile, or compiles past ``cap`` bytes: the env process
    then compiles it itself and reports the error exactly as before. Compiling runs none of the
    source's code; what the supervisor sends its own env processes is trusted."""
    try:
        # the source's SyntaxWarnings (one per line: a 200k-character source writes thousands) would
        # go to the stage's own stderr; compiled in the env process they went to its capped output
        with PARSE_LOCK, warnings.catch_warnings(action="ignore"):
            blob = marshal.dumps(compile_source(code))
    except Exception:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        return None
    return blob if len(blob) <= cap else None

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

    def load(self, code: str, compiled: bytes | None) -> protocol.Loaded:
        import gymnasium

        module = types.ModuleType(ENV_MODULE)
        module.__file__ = "env.py"
        sys.modules[ENV_MODULE] = module  # dataclasses and typing look the module up by name
        try:
            exec(marshal.loads(compiled) if compiled else compile_source(code), module.__dict__)
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
                    reply = self.load(req.code, req.compiled)
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
    own = confine.private_scratch(workdir, spec["scratch_mb"], uid) if spec["private_scratch"] else None
    if own is not None:
        scratch, workdir = "tmpfs", own
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
