"""How many CPU threads torch and OpenMP get in a spade command (``--threads``).

On a small CPU machine, torch's default of one thread per core oversubscribes it as soon as
anything else runs: the sandbox workers that validate and rollout start, another stage, another
user. An OpenMP thread whose partner lost its core spin-waits at every barrier, so a small matmul
with 2 threads on 2 busy cores runs tens of times slower than with 1 (``recipes/bench_threads.py``
measures it). Every command therefore takes ``--threads N|auto`` (also ``SPADE_THREADS`` and the
``threads`` key of ``--config``; click's order: flag, environment variable, config file, default).

``auto`` resolves to: ``OMP_NUM_THREADS`` when the user exported it, else the usable cores (CPU
affinity and a cgroup CPU quota, as Slurm and containers set them) minus the sandbox workers the
command runs, at least 1. The count goes to ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` before torch
is imported (commands import it inside their bodies) and to ``torch.set_num_threads`` /
``set_num_interop_threads`` once it is, whichever comes first. The option is non-semantic (a rerun
with another count is still "up to date"), but float reductions may sum in another order with
another count, so the resolved figures are recorded: ``spade init-model`` writes them into
``spade_init.json``, and ``recorded()`` returns them for a stage's manifest.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

# Sandbox workers a command keeps busy beside torch, from its own parsed options. Validate checks
# `--workers` designs at once (default: two per core, see stages.validate.default_workers).
# Rollout steps envs in `--workers` workers, but only continuous batching steps them while the
# in-process model generates: lockstep (the hf and vllm default) generates, then steps, then
# generates, so its torch gets every core (the tiny model's rollout of the quickstart, idle: 53 s
# with one thread, 35 s with two, the same rows; with the other core busy 51 s and 53 s), and the
# openai backend generates in a server. Warmstart's solver episodes (--agent-episodes) run in the
# sandbox before training starts and use no torch, so its training gets every core.
SANDBOX_WORKERS: dict[str, Callable[[dict[str, Any], int], int]] = {
    "rollout": lambda p, cores: (int(p.get("workers") or 8)
                                 if p.get("batching") == "continuous" and p.get("backend") == "hf" else 0),
    "validate": lambda p, cores: int(p.get("workers") or 2 * cores),
}

_state: dict[str, Any] = {}


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def auto_threads(cores: int, sandbox_workers: int) -> int:
    """The auto rule: the cores the sandbox workers leave free, at least 1."""
    return max(1, cores - max(0, sandbox_workers))


def parse(value: str | int | None) -> int | None:
    """``auto`` (or nothing) -> None, else a positive count; ValueError otherwise."""
    if value is None or str(value).strip().lower() in ("", "auto"):
        return None
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a positive integer or 'auto', got {value!r}") from None
    if n < 1:
        raise ValueError(f"expected a positive integer or 'auto', got {value!r}")
    return n


def resolve(requested: int | None, command: str, params: dict[str, Any],
            environ: os._Environ | dict | None = None, cores: int | None = None) -> tuple[int, str]:
    """The count and where it came from: 'option' (flag, SPADE_THREADS or config), 'OMP_NUM_THREADS'
    (exported by the user) or 'auto'."""
    environ = os.environ if environ is None else environ
    if requested is not None:
        return requested, "option"
    try:
        exported = parse(environ.get("OMP_NUM_THREADS"))
    except ValueError:
        exported = None  # a malformed value is OpenMP's business; the auto rule still applies
    if exported is not None:
        return exported, "OMP_NUM_THREADS"
    cores = usable_cores() if cores is None else cores
    workers = SANDBOX_WORKERS[command](params, cores) if command in SANDBOX_WORKERS else 0
    return auto_threads(cores, workers), "auto"


def apply(n: int, source: str = "option") -> dict[str, Any]:
    """Set the count for this process and its children; torch gets it now or right after its import."""
    for var in ENV_VARS:
        os.environ[var] = str(n)
    _state.clear()
    _state.update(requested=n, source=source, cores=usable_cores())
    if "torch" in sys.modules:
        _set_torch(n)
    elif not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())
    return recorded()


def recorded() -> dict[str, Any]:
    """What a manifest records: the count asked for, its source, the cores, and torch's own figures
    when torch is loaded."""
    out = dict(_state)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        out["torch_threads"] = torch.get_num_threads()
        out["torch_interop_threads"] = torch.get_num_interop_threads()
    return out


def _set_torch(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:
        pass  # only settable before the first inter-op work; the intra-op count is what matters here


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Runs ``_set_torch`` once, right after ``import torch`` finishes, wherever a command imports it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_set(module: Any) -> None:
            exec_module(module)
            if _state.get("requested"):
                _set_torch(_state["requested"])

        spec.loader.exec_module = exec_then_set  # type: ignore[method-assign]
        return spec
