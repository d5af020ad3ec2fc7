"""Shared fixtures: caches in tmp dirs, no hub access, one tiny model per test session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# One BLAS/OpenMP thread for torch in this process and in every spade subprocess the tests start:
# on a 2-core machine two threads spin-wait whenever the other core is busy (a test server, a
# sandbox worker, another test's stage), and small matmuls gain nothing from a second thread.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# `spade regret --embedding auto` loads MiniLM (about 12 s a process); the tests of the embeddings
# themselves (test_diversity.py) pass --embedding explicitly, every other regret run uses TF-IDF.
os.environ.setdefault("SPADE_EMBEDDING", "tfidf")
# Subprocesses (`python -m spade_cli`, accelerate, lm-eval) import spade from the checkout under test,
# not from wherever the venv's editable install points: two clones or worktrees may share one venv.
# (Sandbox workers start with `python -I` and ignore this.)
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture(autouse=True, scope="session")
def _offline_caches(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep every cache out of the user's home and forbid hub downloads for the whole session."""
    cache = tmp_path_factory.mktemp("caches")
    os.environ.update({
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(cache / "hf"), "HF_DATASETS_CACHE": str(cache / "datasets"),
        "XDG_CACHE_HOME": str(cache / "xdg"), "TOKENIZERS_PARALLELISM": "false",
        "MPLCONFIGDIR": str(cache / "mpl"),
    })


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, _offline_caches: None) -> Path:
    """A random tiny Qwen3 checkpoint, built once per session through the public core."""
    from spade_cli.models import tinymodel

    out = tmp_path_factory.mktemp("models") / "tiny"
    tinymodel.build(out, size="tiny", seed=0)
    return out


def run_spade(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600,
              ) -> subprocess.CompletedProcess:
    """The real console entry point in a subprocess: exit codes, stdout and stderr as a user sees them."""
    return subprocess.run([sys.executable, "-m", "spade_cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **WIDE, **(env or {})}, timeout=timeout)


# rich wraps an error panel at the terminal width, and a tmp path's length depends on how pytest
# runs (a worker's dir is longer): tests that read a message read it unwrapped.
WIDE = {"COLUMNS": "400"}
