"""The supervisor: the tier, the zygotes and the pool that hands out env workers.

``SandboxPool`` owns the tier choice and one zygote per ``PYTHONHASHSEED`` (started lazily; a
zygote is a pre-imported fork server, see ``worker.py`` and ``envproc.py``). ``pool.open(code)`` returns an
``EnvWorker`` (``envworker.py``) for one generated source; each of its episodes runs in a fresh
confined process forked by the zygote::

    with SandboxPool(SandboxConfig(tier="auto")) as pool:
        env = pool.open(code)
        obs, info = env.reset("ep0", seed=1)
        obs, reward, terminated, truncated, info = env.step("ep0", "look")

Every deadline is enforced outside the env, and a dead worker stays dead: the caller opens a new
one. Thread safety: each EnvWorker has its own lock and sockets, so different workers can be
driven from different threads; the zygote's control socket is guarded by a per-zygote lock.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spade_cli.sandbox import protocol

REASONS = frozenset(
    "no_code syntax_error no_env_class too_large import_error import_timeout reset_exception "
    "reset_bad_return step_exception step_bad_return step_timeout obs_not_str obs_too_large "
    "reward_not_finite reward_not_real flags_not_bool info_not_json memory_limit output_flood crashed "
    "exited_early nondeterministic return_out_of_range hint_leak no_hint trivial duplicate "
    "sandbox_violation disk_limit hint_is_answer format_only".split()
)
TIERS = ("process", "strong")


class EnvError(Exception):
    """An env misbehaved. ``reason`` is a reason code (docs/architecture.md, 'Reason codes'), ``detail`` a short human sentence."""

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
    scratch_mb: int = 64              # total size of an env's working dir (tmpfs size= or a checked budget)
    seccomp: bool = True
    landlock: bool = True
    extra_warnings: list[str] = field(default_factory=list)
    preimport: tuple[str, ...] = ()   # heavy trusted libraries the zygote imports once (see heavy_imports)

    @property
    def max_frame(self) -> int:
        # Not derived from rollout's shorter action cap alone: the env process holds this number,
        # and it must not differ between validation and rollout.
        return 4 * (self.max_obs_chars + max(self.max_action_chars, 16384)) + (256 << 10)


def heavy_imports(codes) -> tuple[str, ...]:
    """The allowlisted heavy libraries (``worker.HEAVY_OK``) that any of ``codes`` imports."""
    from spade_cli.sandbox.worker import HEAVY_OK

    found = set()
    for code in codes:
        for name in HEAVY_OK:
            if isinstance(code, str) and re.search(rf"^\s*(import|from)\s+{name}\b", code, re.M):
                found.add(name)
    return tuple(sorted(found))


class Zygote:
    """One fork server process (optionally inside bubblewrap) and its control socket."""

    def __init__(self, cfg: SandboxConfig, tier: str, hash_seed: int, base: Path, bwrap: str | None):
        self.cfg, self.tier, self.lock = cfg, tier, threading.Lock()
        self.dir = Path(tempfile.mkdtemp(prefix="zyg-", dir=base))
        os.chmod(self.dir, 0o711)  # nobody must reach its own subdir, but not list the others
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pkg_parent = str(Path(__file__).resolve().parents[2])
        boot = (f"import sys; sys.path.insert(0, {pkg_parent!r}); "
                "from spade_cli.sandbox.worker import zygote_main; zygote_main(int(sys.argv[1]), sys.argv[2:])")
        env = {"PYTHONHASHSEED": str(hash_seed), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MALLOC_ARENA_MAX": "2", "CUDA_VISIBLE_DEVICES": ""}
        argv = [sys.executable, "-I", "-c", boot, str(child.fileno()), *cfg.preimport]
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
        # As root every env process gets a uid of its own; where only root can read the runtime it
        # keeps CAP_DAC_READ_SEARCH, which is safe only while Landlock confines what it may read.
        self.read_search = self.uid == 0 and not hello.get("nobody_can_read_runtime")
        self.drop_uid = self.uid == 0 and (not self.read_search or cfg.landlock)
        self.warnings = []
        if self.uid == 0 and not self.drop_uid:
            self.warnings.append("running as root and the interpreter lives where other uids cannot read it: "
                                 "env processes stay uid 0 with every capability dropped (Landlock and "
                                 "seccomp still apply); install Python under a world-readable prefix to "
                                 "get the uid drop")
        self.sock.settimeout(10.0)

    def _log_tail(self) -> str:
        try:
            return (self.dir / "zygote.log").read_text(errors="replace")[-600:].strip() or "no output"
        except OSError:
            return "no log"

    def env_spec(self) -> dict:
        """What every env process of this zygote is confined with: the same for every source,
        stage and episode (the zygote keeps children confined for one spec ready)."""
        cfg = self.cfg
        return {"cpu_s": cfg.cpu_s, "memory_mb": cfg.memory_mb, "fsize_mb": cfg.fsize_mb,
                "nofile": cfg.nofile, "nproc": cfg.nproc, "max_obs_chars": cfg.max_obs_chars,
                "max_frame": cfg.max_frame, "seccomp": cfg.seccomp, "landlock": cfg.landlock,
                "scratch_mb": cfg.scratch_mb, "private_scratch": True,
                "scratch_budget": self.tier == "process", "drop_uid": self.drop_uid,
                "read_search": self.read_search}

    def notify(self, msg: dict) -> None:
        """A request the zygote does not answer (``drop``)."""
        with self.lock:
            try:
                self.sock.send(protocol.pack(msg)[4:])
            except OSError as exc:
                raise SandboxUnavailable(f"the sandbox zygote stopped answering ({exc})") from None

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
        self.workers: list = []  # the EnvWorkers opened, closed with the pool
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

    def prestart(self, hash_seeds: tuple[int, ...] = (0,), episodes: int = 0) -> None:
        """Start several zygotes at once (each pre-imports for ~0.3 s; in parallel they overlap).
        ``episodes``: how many episodes the caller will start at once; the first zygote forks
        that many env processes ahead (at most ``worker.MAX_PREFORK``), which confine themselves
        while the caller does something else (rollout: loading the model)."""
        threads = [threading.Thread(target=self.zygote, args=(s,)) for s in hash_seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if episodes > 1 and hash_seeds:
            z = self.zygote(hash_seeds[0])
            z.request({"op": "prefork", "spec": z.env_spec(), "n": episodes})

    def open(self, code: str, env_id: str = "", hash_seed: int = 0):
        """A confined process running ``code``; raises EnvError when the source does not load."""
        if not isinstance(code, str) or not code.strip():
            raise EnvError("no_code", "the design has no code")
        if len(code) > self.config.max_code_chars:
            raise EnvError("too_large", f"{len(code)} characters (cap {self.config.max_code_chars})")
        from spade_cli.sandbox.envworker import EnvWorker

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
