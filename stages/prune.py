"""`spade prune`: the retention of a run's checkpoints and trainer states, so a long run fits its disk.

Each iteration's update writes a served checkpoint (2 bytes a parameter in bf16) and a trainer state
(12-16 bytes a parameter, docs/update.md): kept for all 400 iterations of an 8B run that is about
50 TB. After iteration ``I``'s update (``ckpt/iter_{I+1}``), this keeps

- the trainer state of the latest checkpoint only, plus those whose update count is a multiple of
  ``keep_state_every`` when that is set; a pruned state keeps its counters file marked ``pruned``,
  so a resume from it fails with a message instead of silently starting a new optimizer;
- the served weights of the latest ``keep_ckpts`` checkpoints, of every eval point (iterations that
  are multiples of ``eval_every``), of every checkpoint a stage that has not finished may still
  read (the update that takes it as ``--model``, whose output's manifest is missing, and the update
  after that: a pipelined loop samples iteration ``j+1`` from ``ckpt/iter_j``), and of every
  checkpoint a live ``spade serve`` of the run serves or is loading (``stages.prune_owner``).

It owns only what spade wrote (``stages.prune_owner``): a checkpoint is touched only when it is a
real directory ``RUN/ckpt/iter_NNNN`` (neither it nor ``ckpt/`` a link; the run directory, the
user's name for the run, may be one) beside spade update's manifest naming it; inside, only the weight files a Hugging Face save writes and the
``trainer_state/`` spade's update saves are deleted, never other files, never through a link.

Deletion is crash-safe: ``pruned.json`` is first written as an intent (``"state": "deleting"``, the
files to go), then the files go, then it says ``"done"``. A rerun finishes an intent, also one an
earlier spade wrote (its marker, written before deleting, has no state); after ``done`` weight
files found in the checkpoint were put there by someone else and stay. A trainer state is marked
pruned before its files go (so no update resumes from half a state), and a rerun removes what is
left. A pruned checkpoint keeps its small files (``update.json``, which ``spade report`` reads, the
config and the tokenizer). Manifests are never touched: the loop skips a finished iteration by its
checkpoint's manifest, so a rerun after pruning goes on from the latest checkpoint, whose state is
kept. The run's starting model (iteration 0) is not under ``ckpt/``.

    spade prune runs/demo -i 7 --eval-every 25 --dry-run
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spade_cli.core import locks
from spade_cli.core.artifacts import SpadeError, manifest_path
from spade_cli.core.layout import RunLayout
from stages import prune_owner as owner

MARKER = "pruned.json"
ROUTINE = ("latest", "recent", "eval point", "a pending update reads it")
EVERY = "its update count is a multiple of --keep-state-every"


def _ckpt_number(name: str) -> int | None:
    if name.startswith("iter_") and len(name) == 9 and name[5:].isdigit():
        return int(name[5:])
    return None


def _published(layout: RunLayout, j: int) -> bool:
    return manifest_path(layout.ckpt(j)).exists()


def protected(layout: RunLayout, j: int, latest: int, keep_ckpts: int, eval_every: int) -> str | None:
    """Why the retention keeps the served weights of ``ckpt/iter_j``, or None."""
    if j == latest:
        return "latest"
    if j > latest:
        return "newer than the latest checkpoint of --iteration"
    if j > latest - max(keep_ckpts, 1):
        return "recent"
    if eval_every > 0 and j % eval_every == 0:
        return "eval point"
    if not _published(layout, j + 1) or not _published(layout, j + 2):
        return "a pending update reads it"
    return None


def _weights_to_drop(ck_fd: int) -> list[str] | str:
    """The weight files of an owned checkpoint to delete, or why none may go."""
    marker = owner.read_json_at(ck_fd, MARKER)
    if isinstance(marker, str):
        return f"{MARKER} {marker}"
    if marker is None:
        return [n for n in sorted(os.listdir(ck_fd)) if owner.spade_weight(n) and owner.regular_at(ck_fd, n)]
    if marker.get("state") == "done":
        return []  # weights found after a finished prune were put back by someone: theirs
    listed = marker.get("pruned") if isinstance(marker.get("pruned"), list) else []
    # an intent (or the marker an earlier spade wrote before deleting): finish it, its files only
    return [n for n in listed if isinstance(n, str) and owner.spade_weight(n) and owner.regular_at(ck_fd, n)]


def _drop_weights(ck_fd: int, files: list[str], why: str) -> int:
    intent = {"format": 2, "state": "deleting", "pruned": files, "why": why}
    owner.write_json_at(ck_fd, MARKER, intent)
    freed = sum(owner.remove_at(ck_fd, n) for n in files)
    owner.write_json_at(ck_fd, MARKER, {**intent, "state": "done"})
    return freed


def _state_to_drop(ck_fd: int, keep_state_every: int) -> tuple[dict, list[str]] | str | None:
    """(the state's counters, the entries to delete) when the state goes, why it stays, or None
    when there is no state (or nothing of it is left)."""
    from spade_cli.training import trainer_state

    st_fd = owner.open_dir_at(ck_fd, trainer_state.STATE_DIR)
    if st_fd is None:
        return None
    if isinstance(st_fd, str):
        return f"{trainer_state.STATE_DIR}/ {st_fd}"
    try:
        meta = owner.read_json_at(st_fd, trainer_state.META)
        if meta is None:
            return f"{trainer_state.STATE_DIR}/ has no {trainer_state.META}: not a state spade's update saved"
        if isinstance(meta, str) or meta.get("format") != trainer_state.FORMAT:
            return f"{trainer_state.META} is not spade's ({meta if isinstance(meta, str) else 'another format'})"
        entries = [n for n in sorted(os.listdir(st_fd)) if n != trainer_state.META and owner.real_entry_at(st_fd, n)]
        if not meta.get("pruned"):
            every = keep_state_every and isinstance(meta.get("updates"), int) and meta["updates"] % keep_state_every == 0
            if every:
                return EVERY
        return (meta, entries) if entries else None
    finally:
        os.close(st_fd)


def _drop_state(ck_fd: int, meta: dict, entries: list[str]) -> int:
    """Mark the state pruned (no update resumes from what is left of it), then delete its entries."""
    from spade_cli.training import trainer_state

    st_fd = owner.open_dir_at(ck_fd, trainer_state.STATE_DIR)
    if not isinstance(st_fd, int):
        return 0
    try:
        if not meta.get("pruned"):
            owner.write_json_at(st_fd, trainer_state.META, {**meta, "format": trainer_state.FORMAT, "pruned": True})
        return sum(owner.remove_at(st_fd, n) for n in entries)
    finally:
        os.close(st_fd)


@dataclass(frozen=True)
class Retention:
    latest: int
    keep_ckpts: int
    keep_state_every: int
    eval_every: int
    dry_run: bool

    @property
    def why(self) -> str:
        return (f"retention after iteration {self.latest - 1}: keep {self.keep_ckpts} latest, eval points every "
                f"{self.eval_every or 'never'}")


def prune(run: str | Path, iteration: int, keep_ckpts: int = 2, keep_state_every: int = 0,
          eval_every: int = 0, dry_run: bool = False) -> dict:
    """Apply the retention after iteration ``iteration``'s update; returns what went, what stayed and why."""
    if keep_ckpts < 1:
        raise SpadeError(f"--keep-ckpts must be at least 1 (the latest checkpoint), got {keep_ckpts}")
    if keep_state_every < 0 or eval_every < 0:
        raise SpadeError("--keep-state-every and --eval-every must be 0 (off) or positive")
    layout = RunLayout(Path(run))
    policy = Retention(iteration + 1, keep_ckpts, keep_state_every, eval_every, dry_run)
    if not _published(layout, policy.latest):
        return {"status": "nothing to do", "reason": f"{layout.ckpt(policy.latest)} is not published yet",
                "states": [], "checkpoints": [], "kept": {}, "freed_bytes": 0}
    result = {"status": "dry run" if dry_run else "ok", "latest": str(layout.ckpt(policy.latest)), "states": [],
              "checkpoints": [], "kept": {}, "kept_states": {}, "freed_bytes": 0}
    ckpt_fd = owner.open_ckpt_dir(layout.root)
    if isinstance(ckpt_fd, str):  # a link or no directory: nothing under it is the run's to delete
        result["kept"][str(layout.root / "ckpt")] = ckpt_fd
        return result
    # one prune of a run at a time: a second one fails at once, naming the first
    run_lock = None if dry_run else locks.acquire(layout.root / "ckpt")
    try:
        served = owner.served(layout)
        for name in sorted(os.listdir(ckpt_fd)):
            j = _ckpt_number(name)
            if j is not None:
                _one(layout, ckpt_fd, name, j, policy, served, result)
    except OSError as exc:
        raise _failed(layout.root / "ckpt", exc) from None
    finally:
        os.close(ckpt_fd)
        if run_lock is not None:
            run_lock.release()
    return result


def _one(layout: RunLayout, ckpt_fd: int, name: str, j: int, policy: Retention, served: dict[str, str],
         result: dict) -> None:
    """The retention of one entry ``ckpt/NAME``: its state, then its weights, each only if spade's."""
    ck = layout.root / "ckpt" / name
    ck_fd = owner.open_dir_at(ckpt_fd, name)
    if not isinstance(ck_fd, int):
        result["kept"][str(ck)] = ck_fd or "removed while prune ran"
        return
    lock = None
    try:
        foreign = owner.foreign(layout, ck, ckpt_fd, ck_fd)
        if foreign is not None:
            result["kept"][str(ck)] = foreign
            return
        keep = (protected(layout, j, policy.latest, policy.keep_ckpts, policy.eval_every)
                or served.get(os.path.realpath(ck)))
        superseded = j < policy.latest and _published(layout, j + 1)
        state = _state_to_drop(ck_fd, policy.keep_state_every) if superseded else None
        weights = _weights_to_drop(ck_fd)
        if isinstance(state, str):
            result["kept_states"][str(ck)] = state
        if isinstance(weights, str) or (weights and keep is not None):
            result["kept"][str(ck)] = keep or weights
        drop = weights if keep is None and isinstance(weights, list) else []
        if not drop and not isinstance(state, tuple):
            return
        if not policy.dry_run:
            # an update (re)writing this checkpoint holds its lock: nothing in it is ours meanwhile
            try:
                lock = locks.acquire(ck)
            except locks.LockHeld as exc:
                result["kept"][str(ck)] = f"locked by another stage: {exc}"
                return
            now_served = owner.served(layout).get(os.path.realpath(ck))  # a server started since the first look
            if now_served is not None and drop:
                result["kept"][str(ck)], drop = now_served, []
        if isinstance(state, tuple):
            result["states"].append(str(ck))
            result["freed_bytes"] += 0 if policy.dry_run else _drop_state(ck_fd, *state)
        if drop:
            result["checkpoints"].append(str(ck))
            result["freed_bytes"] += 0 if policy.dry_run else _drop_weights(ck_fd, drop, policy.why)
    except OSError as exc:
        raise _failed(ck, exc) from None
    finally:
        os.close(ck_fd)
        if lock is not None:
            lock.release()


def _failed(where: Path, exc: OSError) -> SpadeError:
    # file names in a checkpoint are relative to it (every step goes through its directory)
    name = f" ({exc.filename})" if exc.filename else ""
    return SpadeError(f"{where}: {exc.strerror or exc} while pruning{name}; a rerun finishes what this one began")


def describe(result: dict) -> list[str]:
    """Lines for stderr: what went, and each checkpoint kept for a reason other than the schedule."""
    verb = "would prune" if result["status"] == "dry run" else "pruned"
    lines = [f"{verb} {len(result['states'])} trainer states, {len(result['checkpoints'])} checkpoints "
             f"({result['freed_bytes'] / 1e9:.2f} GB)"]
    routine = [w for w in result.get("kept", {}).values() if w in ROUTINE]
    if routine:
        lines.append("kept " + ", ".join(f"{routine.count(w)} {w}" for w in ROUTINE if w in routine))
    lines += [f"kept {ck}: {w}" for ck, w in result.get("kept", {}).items() if w not in ROUTINE]
    states = result.get("kept_states", {})
    every = sum(w == EVERY for w in states.values())
    lines += [f"kept {every} trainer states: {EVERY}"] if every else []
    lines += [f"kept the trainer state of {ck}: {w}" for ck, w in states.items() if w != EVERY]
    return lines
