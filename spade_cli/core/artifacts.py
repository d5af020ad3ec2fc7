"""Reading and writing artifacts: strict JSONL, atomic outputs, resumable partials, manifests.

Every stage follows one protocol (docs/architecture.md, 'Write-once files, manifests and resumption'):

1. ``Stage.begin`` hashes the inputs and compares them and the resolved config with the sidecar
   ``OUT.manifest.json``. A match means the work is done ("up to date"); a mismatch is refused
   unless ``force``, so a rerun never silently mixes two configurations.
2. Rows go to ``OUT.partial-<confighash>``, appended and flushed one line at a time. A crashed run
   leaves that file behind; the rerun reads back the complete lines (a torn last line is dropped)
   and the stage only does the missing work.
3. ``Stage.commit`` fsyncs, renames the partial onto ``OUT`` and writes the manifest last: the
   manifest's existence means the output is complete.

From the moment ``Stage.check`` finds work to do until the manifest is written, the stage holds
``OUT.lock`` (``spade_cli.core.locks``): a second writer of the same output fails at once naming the
holder, and the up-to-date check is repeated under the lock, so a writer that finished meanwhile is
seen. Rows reach the partial through ``PartialWriter``, which is also where a SIGTERM stops a stage
(``spade_cli.core.preempt``): after a complete, fsynced row, never inside one.

Rows are read with ``read_rows`` (``jsonlines`` splits and numbers the lines, msgspec decodes
them), which names the file and line of any bad row, and written through a ``jsonlines.Writer``
with spade's own ``dumps``. ``Stage.resume`` reads a partial by hand: it needs the byte offset of
the last complete line to cut a torn one. Output
paths are checked by ``check_output`` before any work starts (``Stage.begin`` for the static checks,
``Stage.check`` for writability once there is work to do): an output that is an input, a directory,
a device, or under a path that cannot be written is a usage error, exit 2.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import jsonlines
import msgspec

from spade_cli import __version__
from spade_cli.core import preempt, threads
from spade_cli.core.errors import (  # noqa: F401  (re-exported: stages import them from here)
    InputError,
    OutputError,
    SpadeError,
    check_output,
    expand_inputs,
    naming,
    open_input,
)
from spade_cli.core.locks import describe
from spade_cli.core.records import Record, SchemaError, parse, to_row


def json_line(path: str | Path, lineno: int, raw: bytes) -> Any:
    """Decode one JSONL line; a bad one is an InputError naming the file and line.

    A lone UTF-16 surrogate (the escape ``\\ud800`` without its pair, or its raw bytes, which
    ``json.loads`` lets through) is no text: it would pass here and fail later, as an encode
    error far from its file, where it is written or sent to an env or a tokenizer. msgspec refuses
    such a row outright, so this keeps its fallback readers in step with it."""
    try:
        row = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InputError(path, lineno, f"not valid JSON ({why})") from None
    if (b"\\u" in raw or b"\xed" in raw) and (where := _surrogate(row)):
        raise InputError(path, lineno, f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape), "
                                       "which is not text")
    return row


def _surrogate(value: Any, at: str = "") -> str | None:
    """Where a lone surrogate sits in a decoded row: ``field 'a.b'``, ``a key``, or None."""
    if isinstance(value, str):
        return None if value.isascii() or not _SURROGATE.search(value) else f"field {at or 'value'!r}"
    if isinstance(value, dict):
        for k, v in value.items():
            if _SURROGATE.search(k):
                return f"a key of {at!r}" if at else "a key"
            if found := _surrogate(v, f"{at}.{k}" if at else k):
                return found
    elif isinstance(value, list):
        return next(filter(None, (_surrogate(v, f"{at}[{i}]") for i, v in enumerate(value))), None)
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")
_decode = msgspec.json.Decoder().decode


def read_rows(paths: str | Path | Iterable[str | Path], expect: str | tuple[str, ...] | None = None,
              ) -> Iterator[tuple[Path, int, Record]]:
    """Yield (file, line number, record) from JSONL files; the first bad row raises InputError.

    ``jsonlines`` splits the lines, skips blank ones and reports the line of one that does not
    decode; msgspec decodes (in C, and it refuses a lone surrogate outright). A line msgspec
    refuses goes through ``json_line``, which either raises spade's own message for it (not JSON,
    not UTF-8, a lone surrogate in field ...) or accepts what ``json.loads`` accepts and msgspec
    does not (``NaN``, a number beyond a double), so the set of rows read is json's."""
    for path in expand_inputs(paths):
        with open_input(path) as fh:
            at = [0]  # the line the reader took last: jsonlines numbers lines only in its errors

            def lines(fh: IO[bytes] = fh, at: list[int] = at) -> Iterator[bytes]:
                for at[0], raw in enumerate(fh, 1):  # noqa: B007 (the counter is the point)
                    yield raw

            reader = jsonlines.Reader(lines(), loads=_decode)
            while True:
                try:
                    row = reader.read(allow_none=True, skip_empty=True)  # a null row is parse's to name
                except EOFError:
                    break
                except jsonlines.InvalidLineError as exc:
                    line = exc.line if isinstance(exc.line, bytes) else exc.line.encode("utf-8", "surrogatepass")
                    row = json_line(path, exc.lineno, line)
                try:
                    yield path, at[0], parse(row, expect)
                except (SchemaError, TypeError) as exc:
                    raise InputError(path, at[0], str(exc)) from None


def read_records(paths: str | Path | Iterable[str | Path], expect: str | tuple[str, ...] | None = None,
                 ) -> list[Record]:
    return [rec for _, _, rec in read_rows(paths, expect)]


def dumps(row: dict | Record) -> str:
    """One JSONL line. A lone surrogate (text a library decoded with ``surrogateescape``) becomes
    U+FFFD: written raw it fails the UTF-8 encode mid-stage, escaped it is a row readers refuse."""
    if not isinstance(row, dict):
        row = to_row(row)
    text = json.dumps(row, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text if text.isascii() or not _SURROGATE.search(text) else _SURROGATE.sub("\ufffd", text)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside ``path``; on clean exit fsync and rename it over ``path``.

    Readers see either the old file or the complete new one, never a prefix; on an exception (or a
    kill) the temp file is removed or left under a dot-name that no stage reads.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with naming(path), open(tmp, mode, encoding=None if "b" in mode else "utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as fh:
        fh.write(text)


def write_jsonl(path: str | Path, rows: Iterable[dict | Record]) -> int:
    n = 0
    with atomic_open(path) as fh:
        writer = jsonlines.Writer(fh, dumps=dumps)  # the file is atomic_open's to fsync and rename
        for row in rows:
            writer.write(row)
            n += 1
    return n


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# Directory fingerprints read the ends of large files since version 2. A manifest written before
# holds version-1 hashes (no "v"): its outputs and inputs are compared the way they were made, so
# a run in progress resumes across the upgrade instead of calling every checkpoint changed.
DIR_FINGERPRINT = 2


def fingerprint(path: str | Path, version: int = DIR_FINGERPRINT) -> dict:
    """Identity of an input: sha256 and row count of a file; of a directory (a checkpoint), the
    names and sizes of its files, the content of the small ones (config, tokenizer) and the first
    and last MiB of the large ones, so that multi-GB weights are not re-hashed by every stage and
    a checkpoint retrained in place (same files, same sizes, new weights) is still a new input."""
    p = Path(path)
    if p.is_dir():
        h = hashlib.sha256()
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            rel = f.relative_to(p).as_posix()
            if rel.startswith("trainer_state/"):
                continue  # update's resumable state is not the served model, and may be pruned later
            size = f.stat().st_size
            h.update(f"{rel}\0{size}\0".encode())
            if size <= 4 << 20:
                h.update(f.read_bytes())
            elif version >= 2:
                with open(f, "rb") as fh:
                    h.update(fh.read(1 << 20))
                    fh.seek(size - (1 << 20))
                    h.update(fh.read(1 << 20))
        return {"path": str(p), "sha256": h.hexdigest(), "kind": "dir", "v": version}
    rows = 0
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            rows += chunk.count(b"\n")
    return {"path": str(p), "sha256": h.hexdigest(), "rows": rows}


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def library_versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version(), "spade": __version__}
    for name in ("torch", "transformers", "trl", "vllm", "lm_eval", "gymnasium", "datasets"):
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            pass
    return out


def manifest_path(out: str | Path) -> Path:
    return Path(f"{out}.manifest.json")


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


# Options added after runs were made, at the default that keeps the old behaviour: left out of a
# manifest's config at that default, so a stage written before they existed stays "up to date".
LATER_DEFAULTS = {"design": {"contract": "full"},
                  "update": {"agent_credit": "episode", "turn_gamma": 1.0},
                  "warmstart": {"contract": "full", "agent_pool": None, "memory_k": 12}}


# Input roles a stage started to record after runs were made: a manifest without the role is
# compared without it (its config names the same input), so those runs stay "up to date".
LATER_INPUT_ROLES = {"warmstart": {"pool"}}


# Settings renamed so that each is named as its flag (name = flag = `--config` key = manifest key):
# a manifest written before is read with the new names, so its run stays "up to date". None: the
# setting no longer changes the output and left the comparison.
KEYS_RENAMED: dict[str, dict[str, str | None]] = {
    "update": {"importance_sampling": "tis", "max_completion_length": "dr_grpo_length"},
    "rollout": {"max_new_tokens": "max_tokens", "enable_thinking": "thinking"},
    "design": {"enable_thinking": "thinking"},
    "warmstart": {"enable_thinking": "thinking", "agent_episodes": "solver_seeds", "agent_thinking": "agent_think"},
    "validate": {"max_steps": "max_env_steps"},
    "regret": {"audit": "seed_audit"},
    "eval": {"max_steps": "max_messages"},
}
# Settings retired at the value that keeps their effect: an older manifest that recorded that value
# is read without them (design's --no-memory: the ablation is now to leave --memory out).
RETIRED_AT = {"design": {"no_memory": False}}


def later_defaults_dropped(config: dict[str, Any], stage: str) -> dict[str, Any]:
    later = LATER_DEFAULTS.get(stage, {})
    return {k: v for k, v in config.items() if not (k in later and v == later[k])}


def keys_renamed(config: dict[str, Any], stage: str) -> dict[str, Any]:
    """An older manifest's config under today's names (``KEYS_RENAMED``)."""
    renamed, retired = KEYS_RENAMED.get(stage, {}), RETIRED_AT.get(stage, {})
    out = {renamed.get(k, k): v for k, v in config.items()
           if renamed.get(k, k) is not None and not (k in retired and v == retired[k])}
    return later_defaults_dropped(out, stage)


@dataclass
class Stage:
    """One run of one stage over one output path. See the module docstring for the protocol."""

    name: str
    out: Path
    config: dict
    inputs: dict[str, list[dict]] = field(default_factory=dict)
    force: bool = False
    started: float = field(default_factory=time.time)
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    out_kind: str = "file"
    taken_over: dict | None = None  # the dead writer whose lock this run took over
    _lock: Any = None

    @classmethod
    def begin(cls, name: str, out: str | Path, config: dict, inputs: dict[str, Iterable[str | Path]],
              force: bool = False, out_kind: str = "file", hashed: dict[str, list[dict]] | None = None,
              started: float | None = None) -> Stage:
        """Check ``out`` against the inputs and fingerprint them, role by role in the order given.
        ``hashed`` holds a role's fingerprints already taken (a stage that hashes its inputs while
        it scans them, as regret does its rollouts), used instead of hashing the files again;
        ``started``: when the run began, for the manifest's wall time (default: now)."""
        inputs = {role: list(paths) for role, paths in inputs.items()}
        check_output(out, [p for paths in inputs.values() for p in paths], kind=out_kind, writable=False)
        stage = cls(name, Path(out), dict(config), force=force, out_kind=out_kind)
        if started is not None:
            stage.started = started
        hashed = hashed or {}
        stage.inputs = {role: hashed[role] if role in hashed else [fingerprint(p) for p in paths]
                        for role, paths in inputs.items()}
        return stage

    # -- up-to-date check -------------------------------------------------------------------------
    def _key(self, inputs: dict[str, list[dict]], config: dict) -> dict:
        return {"config": json.loads(json.dumps(config, sort_keys=True, default=str)),
                "inputs": {role: sorted(fp["sha256"] for fp in fps) for role, fps in inputs.items()}}

    def _as_made(self, old_inputs: dict) -> dict[str, list[dict]]:
        """This run's input fingerprints, a directory's in the version the old manifest used (and
        without a role the stage recorded only later, when the old manifest lacks it)."""
        out = {}
        for role, fps in self.inputs.items():
            if role in LATER_INPUT_ROLES.get(self.name, ()) and role not in old_inputs:
                continue
            made = {fp.get("v", 1) for fp in old_inputs.get(role, []) if fp.get("kind") == "dir"}
            v = min(made) if made else DIR_FINGERPRINT
            out[role] = [fingerprint(fp["path"], v) if fp.get("kind") == "dir" and v != fp.get("v") else fp
                         for fp in fps]
        return out

    def status(self) -> str:
        """'new', 'up to date', or a sentence saying what changed since the finished run."""
        mpath = manifest_path(self.out)
        if not mpath.exists() or not self.out.exists():
            return "new"
        try:
            old = json.loads(mpath.read_text())
        except (OSError, json.JSONDecodeError):
            return "its manifest is unreadable"
        out_v = old.get("output", {}).get("v", 1) if self.out.is_dir() else DIR_FINGERPRINT
        if old.get("output", {}).get("sha256") not in (None, fingerprint(self.out, out_v)["sha256"]):
            return f"{self.out} was modified after its manifest was written"
        mine, theirs = self._key(self._as_made(old.get("inputs", {})), self.config), \
            self._key(old.get("inputs", {}), keys_renamed(old.get("config", {}), self.name))
        if mine == theirs:
            return "up to date"
        changed = sorted(k for k in set(mine["config"]) | set(theirs["config"])
                         if mine["config"].get(k) != theirs["config"].get(k))
        roles = sorted(r for r in set(mine["inputs"]) | set(theirs["inputs"])
                       if mine["inputs"].get(r) != theirs["inputs"].get(r))
        parts = []
        if changed:
            parts.append("config changed: " + ", ".join(
                f"{k} {theirs['config'].get(k)!r} -> {mine['config'].get(k)!r}" for k in changed))
        if roles:
            parts.append("inputs changed: " + ", ".join(roles))
        return "; ".join(parts) or "the manifest differs"

    def lock(self) -> None:
        """Take OUT's exclusive lock (once); a second writer raises LockHeld naming this one."""
        from spade_cli.core import locks

        if self._lock is None:
            self._lock = locks.acquire(self.out)
            if self._lock is not None and self._lock.replaced:
                # kept apart from warnings and extra, which stages may reassign
                self.taken_over = self._lock.replaced

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def check(self) -> bool:
        """True when the stage should be skipped; raises when finished work would be overwritten."""
        for attempt in ("unlocked", "locked"):
            st = self.status()
            if st == "up to date" and not self.force:
                self.release()
                return True
            if st not in ("new", "up to date") and not self.force:
                self.release()
                raise SpadeError(f"{self.out} exists from another run ({st}); pass --force to overwrite it")
            if attempt == "unlocked":
                # only now, with work to do: a finished run on a read-only mount is still "up to date"
                check_output(self.out, kind=self.out_kind)
                # then again under the lock: the writer that held it may have just finished
                self.lock()
        return False

    # -- resumable output -------------------------------------------------------------------------
    @property
    def partial(self) -> Path:
        return self.out.with_name(f"{self.out.name}.partial-{config_hash(self._key(self.inputs, self.config))}")

    def resume(self) -> list[dict]:
        """Complete rows already written by a crashed run with the same config and inputs."""
        if self.force or not self.partial.exists():
            self.partial.unlink(missing_ok=True)
            return []
        rows, good = [], 0
        with open(self.partial, "rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break  # torn by a kill mid-write
                try:
                    rows.append(json.loads(raw))
                except json.JSONDecodeError:
                    break
                good += len(raw)
        with open(self.partial, "r+b") as fh:
            fh.truncate(good)
        return rows

    def writer(self) -> PartialWriter:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        return PartialWriter(self.partial)

    def commit(self, rows_written: int, summary: dict | None = None) -> dict:
        """Publish the partial as OUT, then write the manifest; returns the manifest."""
        preempt.writer_opened()  # a SIGTERM now waits: OUT without its manifest would be redone
        try:
            return self._commit(rows_written, summary)
        finally:
            preempt.writer_closed()

    def _commit(self, rows_written: int, summary: dict | None) -> dict:
        if self.partial.exists():
            with naming(self.partial), open(self.partial, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(self.partial, self.out)
            _fsync_dir(self.out.parent)
        else:
            # Nothing to write (e.g. no valid environment to play) is still a finished output:
            # the next stage reads an empty file rather than failing on a missing one.
            atomic_write_text(self.out, "")
        for stale in self.out.parent.glob(f"{self.out.name}.partial-*"):
            stale.unlink(missing_ok=True)
        return self.write_manifest(rows_written, summary)

    def write_manifest(self, rows_written: int | None, summary: dict | None = None) -> dict:
        manifest = {
            "stage": self.name,
            "argv": sys.argv,
            "config": self.config,
            "versions": library_versions(),
            "git_commit": _git_commit(),
            "inputs": self.inputs,
            "output": {"path": str(self.out), "rows": rows_written,
                       "sha256": fingerprint(self.out)["sha256"] if self.out.exists() else None,
                       **({"v": DIR_FINGERPRINT} if self.out.is_dir() else {})},
            "timings": {"wall_s": round(time.time() - self.started, 3), **self.timings},
            "warnings": self.warnings + ([f"took over the lock of a dead writer: {describe(self.taken_over)}"]
                                         if self.taken_over else []),
            "summary": summary or {},
            "threads": threads.recorded(),
            **self.extra,  # e.g. the sandbox tier of validate and rollout
        }
        atomic_write_text(manifest_path(self.out), json.dumps(manifest, indent=2, default=str) + "\n")
        self.release()  # the manifest is the last write: the output is published
        return manifest


class PartialWriter:
    """Append-only JSONL with one flushed line per row; fsynced every ``sync_every`` rows."""

    def __init__(self, path: Path, sync_every: int = 64):
        self.path = path
        self.fh = open(path, "a", encoding="utf-8")
        self.rows = jsonlines.Writer(self.fh, dumps=dumps, flush=True)  # each complete line reaches the OS
        self.sync_every, self.n = sync_every, 0
        preempt.writer_opened()

    def write(self, row: dict | Record) -> None:
        preempt.boundary()  # after a SIGTERM: stop here, before a row that may postdate it
        with naming(self.path):
            self.rows.write(row)
            self.n += 1
            if self.n % self.sync_every == 0:
                os.fsync(self.fh.fileno())

    def close(self) -> None:
        if not self.fh.closed:
            with naming(self.path):
                try:
                    self.fh.flush()
                    os.fsync(self.fh.fileno())
                finally:  # a full disk must not leave the file open nor the SIGTERM guard held
                    try:
                        self.fh.close()
                    finally:
                        preempt.writer_closed()

    def __enter__(self) -> PartialWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
