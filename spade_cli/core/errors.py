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

import glob
import os
import tempfile
from collections.abc import Iterable
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
