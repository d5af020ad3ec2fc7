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

import gc
import math
import numbers
import os
import shutil
import signal
import socket
import sys
import tempfile
import types

from spade_cli.sandbox import confine, protocol

CTRL_MAX = 1 << 16
ENV_MODULE = "spade_env"


# -- value checks (run inside the env process) --------------------------------------------------

class Rejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # an exception whose __str__ raises
        text = type(exc).__name__
    return text[:500]


def json_safe(value: object, depth: int = 0) -> object:
    """A plain-JSON copy of ``value`` (exact builtin types only) or Rejected(info_not_json)."""
    if depth > 32:
        raise Rejected("info_not_json", "info nests deeper than 32 levels")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        if not math.isfinite(value):
            raise Rejected("info_not_json", f"info holds a non-finite float {value!r}")
        return value
    if t is list or t is tuple:
        return [json_safe(v, depth + 1) for v in value]
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise Rejected("info_not_json", f"info has a non-string key of type {type(k).__name__}")
            out[k] = json_safe(v, depth + 1)
        return out
    raise Rejected("info_not_json", f"info holds a {t.__name__}, which is not JSON")


def check_obs(obs: object, max_chars: int) -> str:
    if not isinstance(obs, str):
        raise Rejected("obs_not_str", f"observation is a {type(obs).__name__}, not str")
    obs = str.__str__(obs)  # an exact str, whatever subclass it was
    if len(obs) > max_chars:
        raise Rejected("obs_too_large", f"observation has {len(obs)} characters (cap {max_chars})")
    try:
        obs.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Rejected("obs_not_str", f"observation is not encodable text: {exc.reason}") from None
    return obs


def check_reward(reward: object) -> float:
    if isinstance(reward, bool) or type(reward).__name__ == "bool_" or not isinstance(reward, numbers.Real):
        raise Rejected("reward_not_real", f"reward is a {type(reward).__name__}, not a real number")
    value = float(reward)  # a plain float: defeats subclasses with odd __eq__ or __repr__
    if not math.isfinite(value):
        raise Rejected("reward_not_finite", f"reward is {value}")
    return value


def check_flag(flag: object, name: str) -> bool:
    if type(flag) is bool:
        return flag
    if type(flag).__name__ == "bool_":  # numpy's bool, which gymnasium's own checker accepts
        return bool(flag)
    raise Rejected("flags_not_bool", f"{name} is a {type(flag).__name__}, not bool")


def check_info(info: object) -> dict:
    if type(info) is not dict:
        raise Rejected("info_not_json", f"info is a {type(info).__name__}, not dict")
    return json_safe(info)  # type: ignore[return-value]


# -- the env process ------------------------------------------------------------------------------

class EnvServer:
    """Serves one generated source: one fresh env instance per episode id."""

    def __init__(self, fd: int, max_obs_chars: int, max_frame: int):
        self.fd, self.max_obs, self.max_frame = fd, max_obs_chars, max_frame
        self.cls: type | None = None
        self.envs: dict[str, object] = {}

    def load(self, code: str) -> dict:
        import gymnasium

        module = types.ModuleType(ENV_MODULE)
        module.__file__ = "env.py"
        sys.modules[ENV_MODULE] = module  # dataclasses and typing look the module up by name
        try:
            exec(compile(code, "env.py", "exec"), module.__dict__)
        except SyntaxError as exc:
            raise Rejected("syntax_error", _describe(exc)) from None
        except MemoryError:
            raise Rejected("memory_limit", "MemoryError while importing") from None
        except BaseException as exc:
            raise Rejected("import_error", _describe(exc)) from None
        found = [v for v in vars(module).values() if isinstance(v, type)
                 and issubclass(v, gymnasium.Env) and v.__module__ == ENV_MODULE]
        leaves = [c for c in found if not any(o is not c and issubclass(o, c) for o in found)]
        if len(leaves) != 1:
            raise Rejected("no_env_class", f"expected one gymnasium.Env subclass, found {len(leaves)}"
                           + (f": {', '.join(c.__name__ for c in leaves)}" if leaves else ""))
        self.cls = leaves[0]
        return {"ok": True, "cls": self.cls.__name__}

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MemoryError:
            raise Rejected("memory_limit", f"MemoryError in {what}") from None
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the env may not exit
            raise Rejected(f"{what}_exception", _describe(exc)) from None

    def reset(self, episode: str, seed: int, options: dict | None) -> dict:
        self.close(episode)
        env = self._call("reset", self.cls)  # a fresh instance per episode
        self.envs[episode] = env
        out = self._call("reset", env.reset, seed=seed, options=options)
        if not isinstance(out, tuple) or len(out) != 2:
            raise Rejected("reset_bad_return", f"reset returned {_shape(out)}, not (obs, info)")
        obs = check_obs(out[0], self.max_obs)
        return {"ok": True, "obs": obs, "info": check_info(out[1])}

    def step(self, episode: str, action: str) -> dict:
        env = self.envs.get(episode)
        if env is None:
            raise Rejected("step_exception", f"no open episode {episode!r} (reset it first)")
        out = self._call("step", env.step, action)
        if not isinstance(out, tuple) or len(out) != 5:
            raise Rejected("step_bad_return", f"step returned {_shape(out)}, not a 5-tuple")
        obs = check_obs(out[0], self.max_obs)
        reward = check_reward(out[1])
        term, trunc = check_flag(out[2], "terminated"), check_flag(out[3], "truncated")
        return {"ok": True, "obs": obs, "reward": reward, "term": term, "trunc": trunc,
                "info": check_info(out[4])}

    def close(self, episode: str) -> dict:
        env = self.envs.pop(episode, None)
        if env is not None:
            try:
                env.close()
            except BaseException:
                pass  # closing is best effort; the instance is dropped either way
        return {"ok": True}

    def check_env(self) -> dict:
        """gymnasium's own checker, when the env declares its spaces; its warnings are advisory."""
        import warnings

        from gymnasium.utils.env_checker import check_env

        env = self._call("reset", self.cls)
        if getattr(env, "observation_space", None) is None or getattr(env, "action_space", None) is None:
            return {"ok": True, "skipped": "the env declares no observation/action space", "warnings": []}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check_env(env, skip_render_check=True)
                error = None
            except BaseException as exc:
                error = _describe(exc)
        return {"ok": True, "error": error, "warnings": [str(w.message)[:300] for w in caught][:10]}

    def serve(self) -> None:
        while True:
            try:
                req = protocol.recv_blocking(self.fd, self.max_frame)
            except protocol.FrameError:
                os._exit(0)  # the supervisor went away
            op = req.get("op")
            try:
                if op == "load":
                    reply = self.load(req["code"])
                elif op == "reset":
                    reply = self.reset(req["episode"], req["seed"], req.get("options"))
                elif op == "step":
                    reply = self.step(req["episode"], req["action"])
                elif op == "close":
                    reply = self.close(req["episode"])
                elif op == "check_env":
                    reply = self.check_env()
                else:
                    reply = {"ok": False, "reason": "sandbox_violation", "detail": f"unknown op {op!r}"}
            except Rejected as rej:
                if op in ("reset", "step"):
                    self.envs.pop(req.get("episode"), None)  # a broken episode is never continued
                reply = {"ok": False, "reason": rej.reason, "detail": rej.detail}
            try:
                protocol.send(self.fd, reply)
            except (OSError, ValueError, TypeError, OverflowError) as exc:
                protocol.send(self.fd, {"ok": False, "reason": "sandbox_violation",
                                        "detail": f"reply not encodable: {_describe(exc)}"})
            if reply.get("reason") == "memory_limit":
                os._exit(0)  # after a MemoryError the interpreter's state is not trustworthy


def _shape(value: object) -> str:
    if isinstance(value, tuple):
        return f"a {len(value)}-tuple"
    return f"a {type(value).__name__}"


def env_main(proto_fd: int, out_fd: int, spec: dict, workdir: str) -> None:
    """Child side of ``spawn``: confine, then serve. Never returns."""
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        for fd in (devnull, out_fd):
            os.close(fd)
        os.chdir(workdir)
        nonroot = os.geteuid() != 0
        confine.apply_rlimits(spec["cpu_s"], spec["memory_mb"], spec["fsize_mb"], spec["nofile"],
                              spec["nproc"] if nonroot or spec["drop_uid"] else None)
        if spec["drop_uid"]:
            confine.drop_privileges(workdir)
        elif spec["drop_caps"]:
            confine.drop_capabilities()
        confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
        if os.getppid() != spec["zygote_pid"]:
            os._exit(1)  # the zygote died between fork and prctl
        if spec["landlock"]:
            confine.apply_landlock(spec["read_paths"], [workdir, os.devnull])
        if spec["seccomp"]:
            confine.apply_seccomp(os.getpid())
        os.environ.clear()
        os.environ.update({"HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
        tempfile.tempdir = workdir
    except BaseException as exc:  # report a setup failure as such: an infrastructure error
        try:
            protocol.send(proto_fd, {"ok": False, "reason": "sandbox_setup", "detail": _describe(exc)})
        finally:
            os._exit(3)
    try:
        EnvServer(proto_fd, spec["max_obs_chars"], spec["max_frame"]).serve()
    finally:
        os._exit(0)


# -- the zygote -----------------------------------------------------------------------------------

def _runtime_paths() -> list[str]:
    """Read-only paths an env process needs: the interpreter, its libraries, spade's own package."""
    paths = {"/usr", "/lib", "/lib64", "/bin", "/etc/localtime", "/etc/ld.so.cache", "/dev/urandom"}
    for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
              *[p for p in sys.path if p]]:
        paths.add(p)
        paths.add(os.path.realpath(p))
    return sorted(p for p in paths if os.path.exists(p))


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
    protocol.unpack(protocol.pack({"warm": [1, 2.0, "x", None, True]})[4:])
    check_info({"a": [1, 2.0]})


def zygote_main(ctrl_fd: int) -> None:
    import gymnasium  # noqa: F401  pre-imported once so every env process starts warm
    import numpy  # noqa: F401
    from gymnasium.utils import env_checker  # noqa: F401

    _prewarm()
    # Objects that exist now are shared copy-on-write with every env process; keeping them out of
    # the collector means a child's first garbage collection does not touch (and copy) them all.
    gc.freeze()
    ctrl = socket.socket(fileno=ctrl_fd)
    try:
        confine.prctl(confine.PR_SET_CHILD_SUBREAPER, 1)
    except confine.ConfineError:
        pass
    read_paths = _runtime_paths()
    base = os.getcwd()
    children: dict[int, str] = {}  # env pid -> its private dir
    nobody_ok = confine.readable_by_others([sys.base_prefix, sys.prefix, os.path.dirname(confine.__file__)])
    ctrl.send(protocol.pack({"op": "ready", "pid": os.getpid(), "uid": os.geteuid(),
                             "nobody_can_read_runtime": nobody_ok})[4:])
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctrl, CTRL_MAX, 2)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        req = protocol.unpack(data)
        op = req.get("op")
        if op == "spawn":
            proto_fd, out_fd = fds
            workdir = tempfile.mkdtemp(prefix="env-", dir=base)
            spec = {**req["spec"], "read_paths": read_paths, "zygote_pid": os.getpid()}
            pid = os.fork()
            if pid == 0:
                ctrl.close()
                env_main(proto_fd, out_fd, spec, workdir)
            os.close(proto_fd)
            os.close(out_fd)
            children[pid] = workdir
            reply = {"pid": pid}
        elif op == "kill":
            pid = req["pid"]
            reply = {"gone": True}
            if pid in children:
                for target in (-pid, pid):
                    try:
                        os.kill(target, signal.SIGKILL)
                    except OSError:
                        pass
                _, st = os.waitpid(pid, 0)
                reply = _status(st)
                shutil.rmtree(children.pop(pid), ignore_errors=True)
            _reap_strays(children)
        elif op == "shutdown":
            break
        else:
            reply = {"error": f"unknown op {op!r}"}
        ctrl.send(protocol.pack(reply)[4:])
    for pid, workdir in children.items():
        try:
            os.kill(-pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        shutil.rmtree(workdir, ignore_errors=True)
    os._exit(0)


if __name__ == "__main__":
    zygote_main(int(sys.argv[1]))
