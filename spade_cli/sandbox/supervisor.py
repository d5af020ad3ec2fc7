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
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path

from spade_cli.sandbox import probe
from spade_cli.sandbox.config import (  # noqa: F401  (re-exported: the sandbox's public names)
    REASONS,
    TIERS,
    EnvError,
    SandboxConfig,
    SandboxUnavailable,
)
from spade_cli.sandbox.envworker import EnvWorker
from spade_cli.sandbox.worker import HEAVY_OK
from spade_cli.sandbox.zygote import Zygote


def heavy_imports(codes) -> tuple[str, ...]:
    """The allowlisted heavy libraries (``worker.HEAVY_OK``) that any of ``codes`` imports."""
    found = set()
    for code in codes:
        for name in HEAVY_OK:
            if isinstance(code, str) and re.search(rf"^\s*(import|from)\s+{name}\b", code, re.M):
                found.add(name)
    return tuple(sorted(found))


class SandboxPool:
    """Tier choice, zygotes and bookkeeping; thread-safe; a context manager."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self.tier, self.bwrap, self.warnings = probe.choose_tier(self.config.tier, self.config.min_tier)
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
