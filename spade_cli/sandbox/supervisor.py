"""The supervisor: zygotes, env workers, deadlines and every check on what comes back.

``SandboxPool`` owns the tier choice and one zygote per ``PYTHONHASHSEED`` (started lazily; a
zygote is a pre-imported fork server, see ``worker.py``). ``pool.open(code)`` forks one confined
env process for one generated source and returns an ``EnvWorker`` that serves many episodes, one
fresh env instance each::

    with SandboxPool(SandboxConfig(tier="auto")) as pool:
        env = pool.open(code)
        obs, info = env.reset("ep0", seed=1)
        obs, reward, terminated, truncated, info = env.step("ep0", "look")

Every deadline is enforced here, outside the env: a reply that is late, too large, garbled, or
drowned in stdout ends the worker (its process group is SIGKILLed by the zygote, which reaps it)
and raises ``EnvError`` with a DESIGN §5 reason. Decoded values are checked again here, since the
env process could forge any frame. A dead worker stays dead: the caller opens a new one.

Thread safety: each EnvWorker has its own lock and socket, so different workers can be driven
from different threads; the zygote's control socket is guarded by a per-zygote lock.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spade_cli.sandbox import protocol

REASONS = frozenset(
    "no_code syntax_error no_env_class too_large import_error import_timeout reset_exception "
    "reset_bad_return step_exception step_bad_return step_timeout obs_not_str obs_too_large "
    "reward_not_finite reward_not_real flags_not_bool info_not_json memory_limit output_flood crashed "
    "exited_early nondeterministic return_out_of_range hint_leak no_hint trivial duplicate "
    "sandbox_violation".split()
)
TIERS = ("process", "strong")


class EnvError(Exception):
    """An env misbehaved. ``reason`` is a DESIGN §5 code, ``detail`` a short human sentence."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class SandboxUnavailable(RuntimeError):
    """The sandbox itself cannot run here (or not at the required tier): an infrastructure error."""


@dataclass
class SandboxConfig:
    tier: str = "auto"                # auto | process | strong
    min_tier: str = "process"         # fail closed below this
    import_timeout_s: float = 3.0
    reset_timeout_s: float = 2.0
    step_timeout_s: float = 1.0
    episode_timeout_s: float = 60.0   # env time (reset + steps) per episode, not model time
    memory_mb: int = 1024             # RLIMIT_AS of an env process
    cpu_s: int = 300                  # RLIMIT_CPU backstop over a worker's whole life
    fsize_mb: int = 16
    nofile: int = 64
    nproc: int = 1024                 # per uid, threads included; fork is denied by seccomp anyway
    max_obs_chars: int = 65536
    max_action_chars: int = 16384     # longer agent actions are truncated before `step`
    max_output_bytes: int = 1 << 20   # env stdout+stderr per worker before `output_flood`
    max_code_chars: int = 200_000
    seccomp: bool = True
    landlock: bool = True
    extra_warnings: list[str] = field(default_factory=list)

    @property
    def max_frame(self) -> int:
        return 4 * (self.max_obs_chars + self.max_action_chars) + (256 << 10)


class Zygote:
    """One fork server process (optionally inside bubblewrap) and its control socket."""

    def __init__(self, cfg: SandboxConfig, tier: str, hash_seed: int, base: Path, bwrap: str | None):
        self.cfg, self.tier, self.lock = cfg, tier, threading.Lock()
        self.dir = Path(tempfile.mkdtemp(prefix=f"zyg{hash_seed}-", dir=base))
        os.chmod(self.dir, 0o711)  # nobody must reach its own subdir, but not list the others
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pkg_parent = str(Path(__file__).resolve().parents[2])
        boot = (f"import sys; sys.path.insert(0, {pkg_parent!r}); "
                "from spade_cli.sandbox.worker import zygote_main; zygote_main(int(sys.argv[1]))")
        env = {"PYTHONHASHSEED": str(hash_seed), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MALLOC_ARENA_MAX": "2", "CUDA_VISIBLE_DEVICES": ""}
        argv = [sys.executable, "-I", "-c", boot, str(child.fileno())]
        cwd = str(self.dir)
        if tier == "strong":
            from spade_cli.sandbox.probe import bwrap_argv

            argv = bwrap_argv(bwrap, env, pkg_parent) + argv
            cwd = "/"
        self.log = open(self.dir / "zygote.log", "wb")
        self.proc = subprocess.Popen(argv, pass_fds=(child.fileno(),), env=env, cwd=cwd,
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     start_new_session=True)
        child.close()
        self.sock = parent
        self.sock.settimeout(30.0)  # the first start imports gymnasium and numpy
        try:
            hello = protocol.unpack(self.sock.recv(protocol.HEADER.size + 4096))
        except (OSError, protocol.FrameError) as exc:
            self.close()
            raise SandboxUnavailable(f"the {tier} sandbox did not start ({exc}): {self._log_tail()}") from None
        self.pid, self.uid = hello.get("pid"), hello.get("uid")
        self.drop_uid = self.uid == 0 and bool(hello.get("nobody_can_read_runtime"))
        self.warnings = []
        if self.uid == 0 and not self.drop_uid:
            self.warnings.append("running as root and the interpreter lives where uid 65534 cannot read it: "
                                 "env processes stay uid 0 with every capability dropped (Landlock and "
                                 "seccomp still apply); install Python under a world-readable prefix to "
                                 "get the uid drop")
        self.sock.settimeout(10.0)

    def _log_tail(self) -> str:
        try:
            return (self.dir / "zygote.log").read_text(errors="replace")[-600:].strip() or "no output"
        except OSError:
            return "no log"

    def request(self, msg: dict, fds: tuple[int, ...] = ()) -> dict:
        with self.lock:
            try:
                socket.send_fds(self.sock, [protocol.pack(msg)[4:]], list(fds))
                data = self.sock.recv(1 << 16)
            except OSError as exc:
                raise SandboxUnavailable(f"the sandbox zygote stopped answering ({exc})") from None
        if not data:
            raise SandboxUnavailable(f"the sandbox zygote exited: {self._log_tail()}")
        return protocol.unpack(data)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            with self.lock:
                self.sock.send(protocol.pack({"op": "shutdown"})[4:])
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.sock.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class EnvWorker:
    """One confined env process serving one source; see the module docstring."""

    def __init__(self, zygote: Zygote, cfg: SandboxConfig, code: str, env_id: str):
        self.zygote, self.cfg, self.env_id = zygote, cfg, env_id
        self.lock = threading.Lock()
        self.alive = False
        self.death: EnvError | None = None
        self.exit: dict | None = None
        self.sink = protocol.OutputSink()
        self.episode_time: dict[str, float] = {}
        self.class_name: str | None = None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        spec = {"cpu_s": cfg.cpu_s, "memory_mb": cfg.memory_mb, "fsize_mb": cfg.fsize_mb,
                "nofile": cfg.nofile, "nproc": cfg.nproc, "max_obs_chars": cfg.max_obs_chars,
                "max_frame": cfg.max_frame, "seccomp": cfg.seccomp, "landlock": cfg.landlock,
                "drop_uid": zygote.drop_uid, "drop_caps": zygote.uid == 0 and not zygote.drop_uid}
        try:
            reply = zygote.request({"op": "spawn", "spec": spec}, (theirs.fileno(), out_w))
        finally:
            theirs.close()
            os.close(out_w)
        self.pid = reply["pid"]
        self.sock = mine
        self.reader = protocol.FrameReader(mine.fileno(), out_r, self.sink, cfg.max_frame,
                                           cfg.max_output_bytes)
        self.alive = True
        reply = self._call({"op": "load", "code": code}, cfg.import_timeout_s, "load")
        self.class_name = reply.get("cls")

    # -- transport -----------------------------------------------------------------------------
    def _kill(self) -> dict:
        self.alive = False
        try:
            self.exit = self.zygote.request({"op": "kill", "pid": self.pid})
        except SandboxUnavailable:
            self.exit = {"gone": True}
        for closer in (self.sock.close,):
            closer()
        if self.reader.out_fd is not None:
            os.close(self.reader.out_fd)
            self.reader.out_fd = None
        return self.exit

    def _die(self, reason: str, detail: str) -> EnvError:
        self._kill()
        self.death = EnvError(reason, detail)
        return self.death

    def _send(self, msg: dict, deadline: float) -> None:
        view = memoryview(protocol.pack(msg))
        while view:
            try:
                n = os.write(self.sock.fileno(), view)
                view = view[n:]
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise protocol.FrameError("timeout") from None
                time.sleep(0.0005)
            except OSError:
                raise protocol.FrameError("eof") from None

    def _call(self, msg: dict, timeout: float, phase: str) -> dict:
        if not self.alive:
            raise self.death or EnvError("crashed", "the env process is gone")
        deadline = time.monotonic() + timeout
        try:
            self._send(msg, deadline)
            reply = self.reader.read(deadline)
        except protocol.FrameError as err:
            raise self._broken(err, phase, timeout) from None
        if reply.get("ok") is True:
            return reply
        reason, detail = reply.get("reason"), str(reply.get("detail", ""))[:1000]
        if reason == "sandbox_setup":
            self._kill()
            raise SandboxUnavailable(f"an env process could not confine itself: {detail}")
        if reason not in REASONS:
            raise self._die("sandbox_violation", f"unknown reason {reason!r} in a reply")
        if reason in ("memory_limit",) or phase == "load":
            raise self._die(reason, detail)
        raise EnvError(reason, detail)

    def _broken(self, err: protocol.FrameError, phase: str, timeout: float) -> EnvError:
        if err.kind == "timeout":
            reason = "import_timeout" if phase == "load" else "step_timeout"
            return self._die(reason, f"{phase} took longer than {timeout:.3g} s; killed")
        if err.kind == "output_flood":
            return self._die("output_flood", err.detail)
        if err.kind == "too_large":
            return self._die("obs_too_large", err.detail)
        if err.kind == "garbled":
            return self._die("sandbox_violation", f"garbled frame: {err.detail}")
        status = self._kill()  # eof: the process ended on its own; ask how
        tail = self.sink.text()[-300:]
        if "signal" in status:
            sig = status["signal"]
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            reason = "step_timeout" if sig == signal.SIGXCPU else "crashed"
            self.death = EnvError(reason if phase != "load" or reason == "crashed" else "import_timeout",
                                  f"killed by {name} during {phase}")
        else:
            self.death = EnvError("import_error" if phase == "load" else "exited_early",
                                  f"exited with status {status.get('exit')} during {phase}"
                                  + (f"; output: {tail}" if tail else ""))
        return self.death

    # -- the public surface --------------------------------------------------------------------
    def _timed(self, episode: str, msg: dict, timeout: float, phase: str) -> dict:
        with self.lock:
            spent = self.episode_time.get(episode, 0.0)
            left = self.cfg.episode_timeout_s - spent
            if left <= 0:
                raise EnvError("step_timeout", f"episode {episode!r} used its {self.cfg.episode_timeout_s} s")
            t0 = time.monotonic()
            try:
                return self._call(msg, min(timeout, left), phase)
            finally:
                self.episode_time[episode] = spent + time.monotonic() - t0

    def reset(self, episode: str, seed: int, options: dict | None = None) -> tuple[str, dict]:
        self.episode_time[episode] = 0.0
        r = self._timed(episode, {"op": "reset", "episode": episode, "seed": int(seed), "options": options},
                        self.cfg.reset_timeout_s, "reset")
        obs, info = r.get("obs"), r.get("info")
        self._check_obs(obs)
        if type(info) is not dict:
            raise self._die("info_not_json", "info arrived as a non-dict")
        return obs, info

    def step(self, episode: str, action: str) -> tuple[str, float, bool, bool, dict]:
        action = str(action)[: self.cfg.max_action_chars]
        action = action.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates over the wire
        r = self._timed(episode, {"op": "step", "episode": episode, "action": action},
                        self.cfg.step_timeout_s, "step")
        obs, reward, term, trunc, info = (r.get(k) for k in ("obs", "reward", "term", "trunc", "info"))
        self._check_obs(obs)
        # The env process already checked these; a failure here means it forged its reply, so
        # the worker is ended rather than trusted with another episode.
        if type(reward) not in (float, int) or isinstance(reward, bool):
            raise self._die("reward_not_real", f"reward arrived as {type(reward).__name__}")
        if not math.isfinite(reward):
            raise self._die("reward_not_finite", f"reward is {reward}")
        if type(term) is not bool or type(trunc) is not bool:
            raise self._die("flags_not_bool", "terminated/truncated arrived as non-bool")
        if type(info) is not dict:
            raise self._die("info_not_json", "info arrived as a non-dict")
        return obs, float(reward), term, trunc, info

    def _check_obs(self, obs: object) -> None:
        if type(obs) is not str:
            raise self._die("obs_not_str", f"observation arrived as {type(obs).__name__}")
        if len(obs) > self.cfg.max_obs_chars:
            raise self._die("obs_too_large", f"{len(obs)} characters")

    def check_env(self) -> dict:
        with self.lock:
            return self._call({"op": "check_env"}, self.cfg.reset_timeout_s * 5, "check_env")

    def close_episode(self, episode: str) -> None:
        self.episode_time.pop(episode, None)
        if self.alive:
            with self.lock:
                try:
                    self._call({"op": "close", "episode": episode}, self.cfg.step_timeout_s, "close")
                except EnvError:
                    pass  # a close that misbehaves has already marked the worker dead

    def close(self) -> None:
        with self.lock:
            if self.alive:
                self._kill()
            self.death = self.death or EnvError("crashed", "the worker was closed")

    @property
    def output(self) -> str:
        """The last few KB the env printed (never part of the protocol)."""
        return self.sink.text()


class SandboxPool:
    """Tier choice, zygotes and bookkeeping; thread-safe; a context manager."""

    def __init__(self, config: SandboxConfig | None = None):
        from spade_cli.sandbox import probe
        from spade_cli.sandbox.probe import choose_tier

        self.config = config or SandboxConfig()
        self.tier, self.bwrap, self.warnings = choose_tier(self.config.tier, self.config.min_tier)
        self.warnings += list(self.config.extra_warnings)
        if self.config.landlock and probe.probe_landlock()["abi"] < 1:
            self.config.landlock = False  # already warned by choose_tier
        self.lock = threading.Lock()
        self.base = Path(tempfile.mkdtemp(prefix="spade-sandbox-"))
        os.chmod(self.base, 0o711)
        self.zygotes: dict[int, Zygote] = {}
        self.starting: dict[int, threading.Lock] = {}
        self.workers: list[EnvWorker] = []
        self.closed = False

    def zygote(self, hash_seed: int = 0) -> Zygote:
        with self.lock:
            if self.closed:
                raise SandboxUnavailable("the sandbox pool is closed")
            starting = self.starting.setdefault(hash_seed, threading.Lock())
        with starting:  # one start per hash seed; different seeds start concurrently
            with self.lock:
                z = self.zygotes.get(hash_seed)
            if z is None or not z.alive():
                z = Zygote(self.config, self.tier, hash_seed, self.base, self.bwrap)
                with self.lock:
                    self.zygotes[hash_seed] = z
                    self.warnings += [w for w in z.warnings if w not in self.warnings]
            return z

    def prestart(self, hash_seeds: tuple[int, ...] = (0,)) -> None:
        """Start several zygotes at once (each pre-imports for ~0.3 s; in parallel they overlap)."""
        threads = [threading.Thread(target=self.zygote, args=(s,)) for s in hash_seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def open(self, code: str, env_id: str = "", hash_seed: int = 0) -> EnvWorker:
        """A confined process running ``code``; raises EnvError when the source does not load."""
        if not isinstance(code, str) or not code.strip():
            raise EnvError("no_code", "the design has no code")
        if len(code) > self.config.max_code_chars:
            raise EnvError("too_large", f"{len(code)} characters (cap {self.config.max_code_chars})")
        worker = EnvWorker(self.zygote(hash_seed), self.config, code, env_id)
        with self.lock:
            self.workers = [w for w in self.workers if w.alive]
            self.workers.append(worker)
        return worker

    def describe(self) -> dict:
        return {"tier": self.tier, "warnings": list(self.warnings),
                "config": {k: v for k, v in asdict(self.config).items() if k != "extra_warnings"}}

    def close(self) -> None:
        with self.lock:
            self.closed = True
            workers, self.workers = self.workers, []
            zygotes, self.zygotes = list(self.zygotes.values()), {}
        for w in workers:
            try:
                w.close()
            except (OSError, SandboxUnavailable):
                pass
        for z in zygotes:
            z.close()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
