"""The errors a user can act on, and the path checks that raise them before a stage does any work.

- ``SpadeError``: printed as one line without a traceback, exit 1; ``InputError`` names the file
  (and line, and field) of a bad input; ``OutputError`` is a usage error, exit 2.
- ``expand_inputs``: files, comma lists and globs -> existing paths, or an InputError.
- ``check_output``: an output path that is an input, of the wrong kind, or not writable -> an
  OutputError, before hours of rollout are lost to a typo in ``--out``.

``spade_cli.core.artifacts`` re-exports all of them; stages import them from there.

    check_output("validated.jsonl", ["designs.jsonl"])   # raises when the two are one file
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import tempfile
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO


class SpadeError(Exception):
    """An error the user can act on: printed without a traceback, exit code 1."""


class InputError(SpadeError):
    """A bad input row or file; the message names the file and line."""

    def __init__(self, path: str | Path, line: int | None, why: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {why}")
        self.path, self.line = str(path), line


class OutputError(SpadeError):
    """An output path that cannot or must not be written: a usage error, exit 2 (docs/architecture.md, 'Command conventions')."""

    exit_code = 2


class UsageError(SpadeError):
    """An option value a stage cannot honour, found once its inputs are read: a usage error, exit 2."""

    exit_code = 2


# The most rows one stage process lays out before it starts (a rollout's episodes, a design's
# designs, a warm start's samples) and holds until it publishes: a slip of the finger
# (``--budget-pairs 1000000000000``) is refused at once instead of allocating until the machine runs
# out of memory. A million is far beyond one iteration of the paper (a few thousand episodes);
# ``--shard`` spreads more over several processes.
MAX_ROWS = 1_000_000


def check_rows(rows: int, what: str, noun: str, fix: str) -> None:
    """Refuse ``rows`` over ``MAX_ROWS``: ``what`` says which options gave them, ``fix`` how to do less."""
    if rows > MAX_ROWS:
        raise UsageError(f"{what} would lay out {rows:,} {noun} in this process, more than {MAX_ROWS:,}: each "
                         f"is held in memory until the output is published; {fix}")


def _same(a: Path, b: Path) -> bool:
    """One file under two names: equal after resolving symlinks and ``./``, or a hard link."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(out: str | Path, inputs: Iterable[str | Path] = (), *, kind: str = "file",
                 flag: str = "--out", writable: bool = True) -> None:
    """Refuse ``out`` before any work: an input (a stage never overwrites what it reads, docs/architecture.md, 'Write-once files, manifests and resumption'),
    a directory where a file goes or the reverse, a device or other non-regular file (renaming over
    /dev/null would replace the device), or a place that cannot be written. Writability is probed
    by creating and removing a dot-file in the nearest existing directory, because ``os.access``
    says yes to root on read-only mounts and pseudo filesystems (/proc, /sys)."""
    out = Path(out)
    if kind == "file" and out.is_dir():
        raise OutputError(f"{flag} {out} is a directory; give a file path")
    if kind == "file" and out.exists() and not out.is_file():
        raise OutputError(f"{flag} {out} exists and is not a regular file")
    if kind == "dir" and out.exists() and not out.is_dir():
        raise OutputError(f"{flag} {out} is a file; give a directory path for the checkpoint")
    for inp in map(Path, inputs):
        if _same(out, inp):
            raise OutputError(f"{flag} {out} is also an input ({inp}); a stage never overwrites its "
                              "inputs, choose another output path")
        # a checkpoint dir replaces everything under it: an input inside would be deleted
        if kind == "dir" and inp.resolve().is_relative_to(out.resolve()):
            raise OutputError(f"{flag} {out} contains the input {inp}; choose another output directory")
    if not writable:
        return
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {flag} {out}: {parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"cannot write {flag} {out}: {exc.strerror or exc} in {parent}") from None


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Give an OSError raised inside the path it concerns: a write or fsync that fails for a full
    disk says only "No space left on device", and the one line the user sees must say where."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def describe_os_error(exc: OSError) -> str:
    """One line for an OSError: its path(s), the system's words and the errno's name."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    why = exc.strerror or str(exc)
    if exc.errno in errno.errorcode:
        why += f" ({errno.errorcode[exc.errno]})"
    fix = {errno.ENOSPC: "make room", errno.EDQUOT: "make room (a disk quota)",
           errno.EFBIG: "raise the file size limit (ulimit -f)"}.get(exc.errno)
    if fix:
        why += f"; {fix} and rerun the same command: finished work is kept"
    return f"{where}: {why}" if where else why


def os_error_of(exc: BaseException, out: str | Path | None = None) -> OSError | None:
    """``exc`` as the OSError it stands for, or None. The savers of weights raise their own types
    for a failed write: safetensors a ``SafetensorError`` ending in "(os error 28)", ``torch.save``
    a RuntimeError with no errno at all ("unexpected pos ...", "file write failed"). Those two
    are read as a write of ``out`` (the command's output) that failed; any other exception is no
    OSError, and a bug keeps its traceback."""
    if isinstance(exc, OSError):
        return exc
    text = " ".join(str(exc).split())
    if type(exc).__name__ == "SafetensorError" and "I/O error" in text:
        found = re.search(r"\(os error (\d+)\)", text)
        code = int(found.group(1)) if found else None
    elif isinstance(exc, RuntimeError) and any(
            f.f_code.co_name == "save" and f.f_code.co_filename.endswith(os.path.join("torch", "serialization.py"))
            for f, _ in traceback.walk_tb(exc.__traceback__)):
        # a write that fails for want of room leaves the filesystem full: say so only then
        code = errno.ENOSPC if out is not None and _free_bytes(Path(out)) < (1 << 20) else None
    else:
        return None
    err = OSError(code, os.strerror(code) if code else f"saving failed ({text})")
    err.filename = str(out) if out is not None else None
    return err


def _free_bytes(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 1 << 62


def open_input(path: Path) -> BinaryIO:
    """``open(path, "rb")``, with a directory or an unreadable file as an InputError."""
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputError(path, None, f"cannot read it: {exc.strerror or exc}") from None


def expand_inputs(specs: str | Path | Iterable[str | Path]) -> list[Path]:
    """Several files, comma-separated lists or globs (Slurm shards) -> sorted, de-duplicated paths."""
    if isinstance(specs, str | Path):
        specs = [specs]
    out: list[Path] = []
    for spec in specs:
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            if any(ch in part for ch in "*?["):
                hits = sorted(glob.glob(part))
                if not hits:
                    raise InputError(part, None, "the glob matches no file")
                out.extend(Path(h) for h in hits)
            else:
                p = Path(part)
                if not p.exists():
                    raise InputError(p, None, "no such file")
                out.append(p)
    seen: set[Path] = set()
    return [p for p in out if not (p.resolve() in seen or seen.add(p.resolve()))]
