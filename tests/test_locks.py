"""One writer per output: a second writer fails at once naming the holder, a dead holder's lock is
taken over, and two concurrent `spade validate` runs over one output never publish an empty or
interleaved file (the measured failure: both exited 0, the file was empty, its manifest said 8 rows)."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spade_cli.core import locks
from tests.conftest import REPO, run_spade

HOLD = """
import sys, time
from pathlib import Path
from spade_cli.core import locks
locks.acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def _holder(out: Path, **env: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, **env})
    assert proc.stdout.readline().strip() == b"held"
    return proc


@pytest.mark.unit
def test_a_second_writer_fails_at_once_naming_the_holder_and_a_dead_ones_lock_is_taken_over(tmp_path):
    out = tmp_path / "validated.jsonl"
    proc = _holder(out, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="0")
    try:
        t0 = time.time()
        with pytest.raises(locks.LockHeld) as err:
            locks.acquire(out)
        # at once: a waiting writer would wait for the holder, which holds until the test ends
        assert time.time() - t0 < 10.0
        msg = str(err.value)
        assert f"pid {proc.pid} on {socket.gethostname()}" in msg and "Slurm job 4242" in msg and str(out) in msg
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lock = locks.acquire(out)  # the kernel dropped the dead holder's flock: taken over
    assert lock.replaced["pid"] == proc.pid
    lock.release()
    assert not locks.lock_path(out).exists()
    again = locks.acquire(out)  # a released lock leaves nothing to take over
    assert again.replaced is None
    again.release()


@pytest.mark.unit
def test_without_flock_the_recorded_holder_decides(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "no locks on this filesystem")

    monkeypatch.setattr(locks.fcntl, "flock", no_flock)
    out = tmp_path / "scores.jsonl"
    me = locks.holder()

    def recorded(**h) -> None:
        locks.lock_path(out).write_text(json.dumps({**me, **h}))

    dead = subprocess.Popen(["true"])
    dead.wait()
    for alive in ({"pid": os.getppid(), "start_time": locks._start_time(os.getppid())},
                  {"host": "elsewhere", "pid": dead.pid}):
        recorded(**alive)
        with pytest.raises(locks.LockHeld, match="no flock"):
            locks.acquire(out)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # this job, requeued: its earlier self is gone
    for gone in ({"pid": dead.pid}, {"pid": os.getppid(), "start_time": "1"},  # "1": the pid was reused
                 {"host": "elsewhere", "slurm_job_id": "7", "slurm_restart": 0}):
        recorded(**{"slurm_job_id": None, **gone})
        lock = locks.acquire(out)
        assert lock.replaced is not None
        lock.release()


def _designs(tmp_path: Path, n: int = 4) -> Path:
    out = tmp_path / "designs.jsonl"
    res = run_spade("design", "--pool", "starter", "--n", str(n), "--out", out)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.integration
def test_spade_refuses_an_output_being_written_and_takes_over_a_dead_writers_lock(tmp_path):
    designs, out = _designs(tmp_path), tmp_path / "validated.jsonl"
    proc = _holder(out, SLURM_JOB_ID="99")
    try:
        res = run_spade("validate", "--designs", designs, "--out", out)
        assert res.returncode == 1 and "is being written by" in res.stderr and "Slurm job 99" in res.stderr
        assert not out.exists() and not list(tmp_path.glob("validated.jsonl.partial-*"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    res = run_spade("validate", "--designs", designs, "--out", out)
    assert res.returncode == 0, res.stderr
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert any(f"pid {proc.pid}" in w for w in manifest["warnings"])
    assert not locks.lock_path(out).exists()


@pytest.mark.integration
def test_two_concurrent_writers_never_publish_an_empty_or_interleaved_file(tmp_path):
    designs, out = _designs(tmp_path), tmp_path / "validated.jsonl"
    argv = [sys.executable, "-m", "spade_cli", "validate", "--designs", str(designs), "--out", str(out)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for rc, err in results:  # the loser either saw the lock, or came after the winner: up to date
        assert rc == 0 or (rc == 1 and "is being written by" in err), err
    rows = out.read_text().splitlines()
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    expected = [json.loads(r)["env_id"] for r in designs.read_text().splitlines()]
    assert len(rows) == manifest["output"]["rows"] == len(expected) > 0
    assert [json.loads(r)["env_id"] for r in rows] == expected
    res = run_spade("validate", "--designs", designs, "--out", out)
    assert res.returncode == 0 and json.loads(res.stdout)["status"] == "up to date"
