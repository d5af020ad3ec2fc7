"""What `spade prune` owns in a run, and deletion that never leaves it (docs/update.md, "Retention").

A checkpoint is spade's to prune only when all of these hold:

- it is a real directory ``RUN/ckpt/iter_NNNN``: ``ckpt/`` and the checkpoint are opened without
  following a link (``O_NOFOLLOW``), its real path is the run's real path plus ``ckpt/iter_NNNN``,
  and it lies on the file system of ``ckpt/`` (not something mounted into the run);
- beside it lies spade update's manifest (``iter_NNNN.manifest.json``, a plain file, ``"stage":
  "update"``) whose output path names this checkpoint: an absolute path whose real path is this
  one (or, when that path no longer exists, a run moved since: the same run, ``ckpt`` and
  checkpoint names), a relative one (the loop's ``runs/NAME/...``) whose parts end this path. A
  checkpoint copied in from another run names that run and stays.

Inside one, every step goes through the directory's descriptor: a file is unlinked only when it
is a regular file (a link is never followed nor removed), a directory of the trainer state is
removed by ``shutil.rmtree`` on that descriptor, which does not follow links either, so a
directory swapped for a link while prune runs is not a way out of the run.

What a live server of the run serves: each ``RUN/serve/server.json`` and ``RUN/serve/NAME/
server.json`` (``stages.serve``) whose process is the one that wrote it (its pid runs with the
recorded start time on the recorded host) names a checkpoint it serves (``checkpoint``), one it
may be half-way through loading (``loading``) and its ``current`` link. A state written on another
host, one without a start time (an earlier format) or one that cannot be read cannot be checked
from here: what it names stays, and the report says why.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import stat
from pathlib import Path

from spade_cli.core.artifacts import manifest_path
from spade_cli.core.layout import RunLayout

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# what a Hugging Face save writes (one file or shards, and their index): the served weights
_WEIGHT = re.compile(r"(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)"
                     r"|(model\.safetensors|pytorch_model\.bin)\.index\.json")


def spade_weight(name: str) -> bool:
    return _WEIGHT.fullmatch(name) is not None


def open_dir_at(dir_fd: int, name: str) -> int | str | None:
    """``name`` in ``dir_fd`` opened as a directory, never through a link; None when it is missing;
    else why it is not a directory of the run."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            return f"a link (to {os.readlink(name, dir_fd=dir_fd)}), never followed"
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return "not a directory"
        return f"unreadable ({exc.strerror})"


def open_ckpt_dir(root: Path) -> int | str:
    """``RUN/ckpt`` opened without following a link at it (the run directory itself may be one:
    that is the user's name for the run), or why it cannot be pruned."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return f"the run directory cannot be opened ({exc.strerror})"
    try:
        fd = open_dir_at(root_fd, "ckpt")
    finally:
        os.close(root_fd)
    return "missing" if fd is None else fd


def read_json_at(dir_fd: int, name: str) -> dict | str | None:
    """The JSON object in the plain file ``name`` (never read through a link), None when it is
    missing, else what is wrong with it (a phrase)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return "is a link, never followed" if exc.errno == errno.ELOOP else f"is unreadable ({exc.strerror})"
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return "is not a plain file"
        raw = fh.read()
    try:
        data = json.loads(raw)
    except ValueError:
        return "is not JSON"
    return data if isinstance(data, dict) else "is not a JSON object"


def write_json_at(dir_fd: int, name: str, obj: dict) -> None:
    """Write ``name`` in ``dir_fd`` atomically (a temporary file renamed over it, both synced)."""
    tmp = f".{name}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(obj, indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def regular_at(dir_fd: int, name: str) -> bool:
    st = _lstat_at(dir_fd, name)
    return st is not None and stat.S_ISREG(st.st_mode)


def real_entry_at(dir_fd: int, name: str) -> bool:
    """A regular file or a directory (links, sockets and the like are never spade's)."""
    st = _lstat_at(dir_fd, name)
    return st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))


def remove_at(dir_fd: int, name: str) -> int:
    """Delete the regular file or the directory tree ``name``; returns the bytes it frees (a file
    hard-linked elsewhere, as an unchanged update's checkpoint shares its input's, frees none)."""
    st = _lstat_at(dir_fd, name)
    if st is None:
        return 0
    if stat.S_ISREG(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return st.st_size if st.st_nlink == 1 else 0
    if not stat.S_ISDIR(st.st_mode):
        return 0
    freed = 0
    for _root, _dirs, files, root_fd in os.fwalk(name, dir_fd=dir_fd):
        for f in files:
            fst = os.stat(f, dir_fd=root_fd, follow_symlinks=False)
            freed += fst.st_size if stat.S_ISREG(fst.st_mode) and fst.st_nlink == 1 else 0
    shutil.rmtree(name, dir_fd=dir_fd)
    return freed


def names_this(named: str, ck: Path) -> bool:
    """Whether a manifest's output path ``named`` is the checkpoint ``ck`` (see the module docstring)."""
    real = os.path.realpath(ck)
    p = Path(os.path.normpath(named))
    if p.is_absolute():
        if os.path.realpath(p) == real:
            return True
        return not os.path.lexists(p) and p.parts[-3:] == Path(real).parts[-3:]
    parts = tuple(x for x in p.parts if x not in ("..", "."))
    return bool(parts) and any(Path(q).parts[-len(parts):] == parts for q in (real, os.path.abspath(ck)))


def foreign(layout: RunLayout, ck: Path, ckpt_fd: int, ck_fd: int) -> str | None:
    """Why the opened checkpoint ``ck`` is not spade's to prune, or None when it is."""
    real = os.path.realpath(ck)
    if real != os.path.join(os.path.realpath(layout.root), "ckpt", ck.name):
        return f"resolves to {real}, outside the run"
    try:
        if not os.path.samestat(os.stat(real), os.fstat(ck_fd)):
            return "replaced while prune ran"
    except OSError:
        return "replaced while prune ran"
    if os.fstat(ck_fd).st_dev != os.fstat(ckpt_fd).st_dev:
        return "another file system mounted into the run"
    name = manifest_path(ck).name
    manifest = read_json_at(ckpt_fd, name)
    if manifest is None:
        return f"no manifest of spade update ({name}): spade did not write it"
    if isinstance(manifest, str):
        return f"{name} {manifest}"
    if manifest.get("stage") != "update":
        return f"{name} is not spade update's manifest (stage {manifest.get('stage')!r})"
    out = manifest.get("output")
    named = out.get("path") if isinstance(out, dict) else None
    if not isinstance(named, str) or not names_this(named, ck):
        return f"its manifest was written for another checkpoint ({named})"
    return None


def _live(state: dict, where: Path) -> str | None:
    """Who serves, when the state file's server may be running; None when it certainly is not."""
    from spade_cli.core.locks import proc_start

    pid, host = state.get("pid"), state.get("host")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None  # never started (a pid of 0 or below would name a process group)
    if isinstance(host, str) and host != socket.gethostname():
        return f"the server of {where} on host {host} (cannot be checked from here)"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    recorded, now = state.get("proc_start"), proc_start(pid)
    if recorded is None:
        return f"pid {pid} of {where} (no start time recorded: it may be a reused pid)"
    return f"the server of {where} (pid {pid})" if now is None or now == recorded else None


def served(layout: RunLayout) -> dict[str, str]:
    """Real paths of the checkpoints a live server of the run serves or loads, each with who serves it."""
    out: dict[str, str] = {}
    top = layout.serve_dir
    for state_path in [top / "server.json", *sorted(top.glob("*/server.json"))]:
        if not state_path.exists():
            continue
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            state = None
        if isinstance(state, dict):
            who = _live(state, state_path)
            named = [state.get("checkpoint"), state.get("loading")]
        else:  # unreadable: what its link serves stays
            who, named = f"{state_path}, which cannot be read", []
        if who is None:
            continue
        link = state_path.parent / "current"
        if link.is_symlink():
            named.append(os.readlink(link))
        for n in named:
            if isinstance(n, str) and n:
                out.setdefault(os.path.realpath(state_path.parent / n), f"served by {who}")
    return out
