"""An exclusive lock per output while it is written (docs/architecture.md, 'Write-once files, manifests and resumption').

Two writers of one output (a requeued Slurm job beside its still-running original, a loop started
twice) would append to one partial file and publish it twice: an interleaved or empty output under
a manifest that describes something else. ``acquire(OUT)`` therefore takes ``OUT.lock`` before a
stage does any work on OUT, and a second writer fails at once with a message naming the holder:
host, pid, Slurm job, command and start time, as written into the lock file by the holder.

The lock is ``flock(2)`` on that file, so the kernel drops it the moment its holder dies (kill -9,
the OOM killer, a node's Slurm step killed): a lock left by a dead process is simply taken over, and
the stage records a warning naming the process it replaced. ``flock`` works on local disks and on
NFS (Linux maps it to NFS byte-range locks); where a filesystem refuses it (Lustre mounted without
``flock``), the lock falls back to its content: a holder on this host whose pid is gone, or an
earlier incarnation of this very Slurm job (requeued, so gone by Slurm's guarantee), is taken over;
anything else is refused. The holder unlinks the file when the output is published.

Ranks other than 0 of a multi-process launch (accelerate, torchrun: ``RANK``) never lock: they do
not write the output, rank 0 does.

    lock = acquire(Path("runs/x/iter_0003/validated.jsonl"))   # raises LockHeld if taken
    ...                                                          # write the partial, publish it
    lock.release()
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from spade_cli.core.errors import SpadeError, naming

_HELD: dict[str, OutputLock] = {}  # locks this process holds, by lock path


class LockHeld(SpadeError):
    """Another process is writing this output."""


def lock_path(out: Path) -> Path:
    return out.with_name(f"{out.name}.lock")


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot): a pid reused later differs."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def proc_stat(pid: int) -> tuple[str, int] | None:
    """The process's state letter and start time in clock ticks since boot (``/proc/PID/stat``
    fields 3 and 22); None where there is no such entry."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None where there is no /proc entry."""
    stat = proc_stat(pid)
    return None if stat is None else stat[1]


def holder() -> dict:
    job = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID')} ({job})"
    return {"host": socket.gethostname(), "pid": os.getpid(), "start_time": _start_time(os.getpid()),
            "slurm_job": job, "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_restart": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": " ".join(sys.argv)[:300]}


def describe(h: dict) -> str:
    job = f", Slurm job {h['slurm_job']}" if h.get("slurm_job") else ""
    return (f"pid {h.get('pid')} on {h.get('host')}{job}, since {h.get('since')}"
            + (f" ({h['argv']})" if h.get("argv") else ""))


def _read(fd: int) -> dict:
    try:
        raw = os.pread(fd, 1 << 16, 0)
        return json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}


def _gone(h: dict, me: dict) -> bool:
    """For filesystems without flock: is the recorded holder certainly not running any more?"""
    if h.get("slurm_job_id") and h.get("slurm_job_id") == me["slurm_job_id"]:
        return int(h.get("slurm_restart") or 0) < me["slurm_restart"]  # a requeued job's old self
    if h.get("host") != me["host"] or not isinstance(h.get("pid"), int):
        return False  # another host: nothing here can tell
    now = _start_time(h["pid"])
    return now is None or now != h.get("start_time")


class OutputLock:
    def __init__(self, path: Path, fd: int, replaced: dict | None):
        self.path, self.fd = path, fd
        self.replaced = replaced  # the holder whose lock was taken over (it died), or None

    def release(self) -> None:
        if self.fd < 0:
            return
        _HELD.pop(str(self.path), None)
        try:
            if os.path.exists(self.path) and os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.path)  # before unlocking: a waiter that got this inode notices (below)
        finally:
            os.close(self.fd)
            self.fd = -1


def release_all() -> None:
    """Drop every lock of this process: a stage that failed leaves its partial, not its lock file."""
    for lock in list(_HELD.values()):
        lock.release()


def acquire(out: Path) -> OutputLock | None:
    if os.environ.get("RANK", "0") != "0":
        return None
    path = lock_path(Path(out))
    if str(path) in _HELD:
        # This process already holds it: an earlier run of a stage here raised and was abandoned
        # (library callers, tests). Stages run one after another, so it is ours to take again.
        _HELD.pop(str(path)).release()
    path.parent.mkdir(parents=True, exist_ok=True)
    me = holder()
    for _ in range(20):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            h = _read(fd)
            os.close(fd)
            raise LockHeld(f"{out} is being written by {describe(h)}; lock {path}. Wait for that run "
                           "or stop it (a lock left by a dead process is taken over).") from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.close(fd)
                raise
            h = _read(fd)  # no flock here: decide from the recorded holder
            if h and not _gone(h, me):
                os.close(fd)
                raise LockHeld(f"{out} is being written by {describe(h)}; lock {path} (this filesystem "
                               "has no flock: remove the lock file if that process is gone)") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the previous holder released (unlinked) it between our open and flock
            os.close(fd)
            continue
        replaced = _read(fd) or None  # a released lock is unlinked: content left means its holder died
        lock = OutputLock(path, fd, replaced)
        try:
            with naming(path):  # a full disk fails here first: the one line must name the place
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
                os.fsync(fd)
        except OSError:
            lock.release()  # and leave no lock file behind
            raise
        _HELD[str(path)] = lock
        return lock
    raise LockHeld(f"{out}: could not take {path} (it keeps being replaced)")
