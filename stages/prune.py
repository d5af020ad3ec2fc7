"""`spade prune`: the retention of a run's checkpoints and trainer states, so a long run fits its disk.

Each iteration's update writes a served checkpoint (2 bytes a parameter in bf16) and a trainer state
(12-16 bytes a parameter, docs/update.md): kept for all 400 iterations of an 8B run that is about
50 TB. After iteration ``I``'s update (``ckpt/iter_{I+1}``), this keeps

- the trainer state of the latest checkpoint only, plus those whose update count is a multiple of
  ``keep_state_every`` when that is set; a pruned state keeps its counters file marked ``pruned``,
  so a resume from it fails with a message instead of silently starting a new optimizer;
- the served weights of the latest ``keep_ckpts`` checkpoints, of every eval point (iterations that
  are multiples of ``eval_every``), and of every checkpoint a stage that has not finished may still
  read: the update that takes it as ``--model`` (its successor's manifest is missing), the update
  after that (a pipelined loop samples iteration ``j+1`` from ``ckpt/iter_j``). A pruned checkpoint keeps its small files (``update.json``,
  which ``spade report`` reads, the config and the tokenizer) and gains ``pruned.json``.

Manifests are never touched: the loop skips a finished iteration by its checkpoint's manifest, so a
rerun after pruning goes on from the latest checkpoint, whose state is kept. Nothing outside
``ckpt/`` is pruned, and the run's starting model (iteration 0) is not under ``ckpt/``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from spade_cli.core.artifacts import SpadeError, atomic_write_text, manifest_path
from spade_cli.core.layout import RunLayout

WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.safetensors.index.json", "*.bin.index.json")
MARKER = "pruned.json"


def _ckpt_number(p: Path) -> int | None:
    name = p.name
    if p.is_dir() and name.startswith("iter_") and len(name) == 9 and name[5:].isdigit():
        return int(name[5:])
    return None


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _published(layout: RunLayout, j: int) -> bool:
    ck = layout.ckpt(j)
    return ck.is_dir() and manifest_path(ck).exists()


def protected(layout: RunLayout, j: int, latest: int, keep_ckpts: int, eval_every: int) -> str | None:
    """Why the served weights of ``ckpt/iter_j`` must stay, or None."""
    if j > latest - max(keep_ckpts, 1):
        return "recent"
    if eval_every > 0 and j % eval_every == 0:
        return "eval point"
    if not _published(layout, j + 1) or not _published(layout, j + 2):
        return "a pending update reads it"
    return None


def _drop_state(ckpt: Path) -> int:
    """Delete a trainer state but its counters file, marked pruned; returns the bytes freed."""
    from spade_cli.training import trainer_state

    state = trainer_state.find(str(ckpt))
    if state is None or state.get("pruned"):
        return 0
    d = Path(state["path"])
    freed = 0
    for child in d.iterdir():
        if child.name != trainer_state.META:
            freed += _size(child) if child.is_dir() else child.stat().st_size
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    trainer_state.write_meta(d, {**{k: v for k, v in state.items() if k not in ("path", "format")}, "pruned": True})
    return freed


def _drop_weights(ckpt: Path, why: str) -> int:
    freed = 0
    files = sorted({f for pattern in WEIGHTS for f in ckpt.glob(pattern) if f.is_file()})
    if not files:
        return 0
    # the marker first: a kill half-way leaves a checkpoint that says it is pruned, never one that
    # looks whole with a weight file missing
    atomic_write_text(ckpt / MARKER, json.dumps({"pruned": [f.name for f in files], "why": why}, indent=2) + "\n")
    for f in files:
        freed += f.stat().st_size
        f.unlink()
    return freed


def prune(run: str | Path, iteration: int, keep_ckpts: int = 2, keep_state_every: int = 0,
          eval_every: int = 0, dry_run: bool = False) -> dict:
    """Apply the retention after iteration ``iteration``'s update; returns what went and what stayed."""
    if keep_ckpts < 1:
        raise SpadeError(f"--keep-ckpts must be at least 1 (the latest checkpoint), got {keep_ckpts}")
    if keep_state_every < 0 or eval_every < 0:
        raise SpadeError("--keep-state-every and --eval-every must be 0 (off) or positive")
    from spade_cli.training import trainer_state

    layout = RunLayout(run)
    latest = iteration + 1
    if not _published(layout, latest):
        return {"status": "nothing to do", "reason": f"{layout.ckpt(latest)} is not published yet",
                "states": [], "checkpoints": [], "freed_bytes": 0}
    pruned_states, pruned_ckpts, kept, freed = [], [], {}, 0
    root = layout.root / "ckpt"
    for ck in sorted(root.iterdir()) if root.is_dir() else []:
        j = _ckpt_number(ck)
        if j is None or j >= latest:
            continue
        state = trainer_state.find(str(ck))
        if state is not None and not state.get("pruned") and _published(layout, j + 1):
            every = keep_state_every and state.get("updates", 0) % keep_state_every == 0
            if not every:
                pruned_states.append(str(ck))
                freed += 0 if dry_run else _drop_state(ck)
        why = protected(layout, j, latest, keep_ckpts, eval_every)
        if why is not None:
            kept[str(ck)] = why
        elif not (ck / MARKER).exists():
            pruned_ckpts.append(str(ck))
            if not dry_run:
                freed += _drop_weights(ck, f"retention after iteration {iteration}: keep {keep_ckpts} latest, "
                                           f"eval points every {eval_every or 'never'}")
    return {"status": "dry run" if dry_run else "ok", "latest": str(layout.ckpt(latest)),
            "states": pruned_states, "checkpoints": pruned_ckpts, "kept": kept, "freed_bytes": freed}
