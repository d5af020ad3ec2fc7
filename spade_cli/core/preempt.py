"""SIGTERM stops a stage at a unit boundary, keeps its work as a resumable partial, exits 75.

SIGTERM is what Slurm sends at the time limit (early, with ``#SBATCH --signal=B:TERM@300``) and
when it preempts a job; the sbatch recipes answer exit code 75 (``EX_TEMPFAIL``, "try again") with
``scontrol requeue``. Every spade command installs ``install()`` (``spade_cli.cli.command``):

- While a stage streams rows into its partial output (a ``PartialWriter`` is open), the signal only
  sets a flag. The next ``PartialWriter.write`` raises ``Preempted`` instead of writing: the rows
  already in the partial (complete and fsynced) are kept and the rerun resumes after them. The row
  in hand is dropped rather than written, because it may have been finished after the signal (an
  env process of the sandbox that got the same signal reports a crash): it is simply redone.
- ``spade update`` trains inside ``deferred()``: the signal only sets the flag and the trainer
  checks ``requested()`` between optimizer steps, where it saves its state as a partial (see
  ``spade_cli.training.trainer_state.save_partial``) before raising ``Preempted``.
- With nothing open (model loading, one-shot stages) there is no boundary to wait for, and
  ``Preempted`` is raised at once: every output is written atomically, so nothing half-done is
  ever published.
- A second SIGTERM raises at once in any case: the user or Slurm insists.

``Preempted`` is a ``SpadeError`` with ``exit_code`` 75, so the command prints one line and exits 75;
the stage's lock is released on the way out and the partial stays for the rerun.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from spade_cli.core.errors import SpadeError

EXIT_PREEMPTED = 75

_state = {"requested": 0, "writers": 0}


class Preempted(SpadeError):
    """SIGTERM: the stage stopped; rerunning the same command resumes it."""

    exit_code = EXIT_PREEMPTED


def _message() -> str:
    return "SIGTERM: stopped at a unit boundary; the partial output is kept, rerun to resume"


def _handler(signum: int, frame: object) -> None:
    _state["requested"] += 1
    if _state["writers"] == 0 or _state["requested"] > 1:
        raise Preempted(_message())


def install() -> None:
    """Route SIGTERM through ``_handler`` (main thread only: Python's rule for signal handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)


def requested() -> bool:
    return _state["requested"] > 0


def writer_opened() -> None:
    _state["writers"] += 1


def writer_closed() -> None:
    _state["writers"] = max(0, _state["writers"] - 1)


@contextmanager
def deferred() -> Iterator[None]:
    """Inside, a first SIGTERM only sets the flag: for work that checks ``requested()`` at its own
    boundaries (the optimizer steps of ``spade update``)."""
    writer_opened()
    try:
        yield
    finally:
        writer_closed()


def boundary() -> None:
    """Called between units of work: raise ``Preempted`` if a SIGTERM arrived since the last one."""
    if _state["requested"]:
        raise Preempted(_message())
