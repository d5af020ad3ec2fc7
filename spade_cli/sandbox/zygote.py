"""The supervisor's handle on one fork server (``Zygote``): a pre-imported interpreter, inside
bubblewrap for the strong tier, that forks and confines the env processes of every source handed to
it (its own code: ``worker.py``, ``envproc.py``). ``SandboxPool`` (``supervisor.py``) starts one per
``PYTHONHASHSEED``; each ``EnvWorker`` (``envworker.py``) asks it for its episodes' processes over
the control socket.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from spade_cli.sandbox import protocol
from spade_cli.sandbox.config import SandboxConfig, SandboxUnavailable
from spade_cli.sandbox.probe import bwrap_argv


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
