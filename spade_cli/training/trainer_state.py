"""The trainer state that survives the stage boundary, and the served checkpoint beside it.

A checkpoint written by ``spade update`` is a plain Hugging Face directory in the serving dtype
(what vLLM, lm-eval, transformers and the next rollout load) plus ``trainer_state/``, which none of
them reads: accelerate's ``save_state`` (fp32 master weights, AdamW moments, the LR scheduler, RNG
states; sharded per rank under DeepSpeed ZeRO or FSDP) and ``spade_state.json`` (spade's counters:
updates and optimizer steps so far, the run's iteration-0 model for the KL reference, the LoRA
shape). Without it every update would restart Adam and round its step into bf16, which at the
usual learning rates loses most of the update (see docs/update.md, "Trainer state").

The next ``spade update`` given this checkpoint as ``--model`` resumes from the state (no flag);
``--fresh-optimizer`` opts out. ``--keep-state-every N`` deletes the superseded state of the input
checkpoint after a successful update unless its update count is a multiple of N; the counters file
stays (marked ``pruned``) so a later resume fails with a message instead of silently starting over.

A SIGTERM between optimizer steps (Slurm's preemption) saves the same accelerate state, plus each
process's progress through the pass (steps done, the old log-probs, the metric sums), as
``OUT.partial-<confighash>/``; the rerun of the same command loads it over the input's state and
takes the remaining steps, which on CPU gives bitwise the weights of an uninterrupted run.

Also here: the served state dict (cast to the input's dtype, tied embeddings left tied, the config
saying the dtype it holds) and the audit of what the served checkpoint kept of the update.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from spade_cli.core.artifacts import SpadeError, atomic_write_text

STATE_DIR = "trainer_state"
META = "spade_state.json"
FORMAT = 1


def find(model: str) -> dict | None:
    """The counters of ``model``'s trainer state (with ``path``), or None (a hub id, an outside
    checkpoint, or a checkpoint from before trainer states)."""
    meta_path = Path(model) / STATE_DIR / META
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise SpadeError(f"{meta_path}: unreadable trainer state ({exc}); pass --fresh-optimizer to start "
                         "from the checkpoint's weights") from exc
    if meta.get("format") != FORMAT:
        raise SpadeError(f"{meta_path}: trainer state format {meta.get('format')!r}, expected {FORMAT}")
    return {**meta, "path": str(meta_path.parent)}


def check_resumable(state: dict, lora: bool, lora_r: int, lora_alpha: int) -> None:
    """Refuse a state this run cannot load, with the way out in the message."""
    if state.get("pruned"):
        raise SpadeError(f"the trainer state in {state['path']} was pruned (--keep-state-every); pass "
                         "--fresh-optimizer to start from the checkpoint's weights with a new optimizer")
    mine = {"lora": lora, "lora_r": lora_r if lora else None, "lora_alpha": lora_alpha if lora else None}
    theirs = {k: state.get(k) for k in mine}
    if mine != theirs:
        raise SpadeError(f"the trainer state in {state['path']} was written with {theirs}, this run has {mine}; "
                         "pass --fresh-optimizer to start over from the checkpoint's weights")


def write_meta(state_dir: Path, meta: dict) -> None:
    atomic_write_text(state_dir / META, json.dumps({"format": FORMAT, **meta}, indent=2) + "\n")


def prune(checkpoint: str, keep_every: int) -> bool:
    """Delete a superseded state unless its update count is a multiple of ``keep_every``; the
    counters stay, marked pruned. Returns whether anything was deleted."""
    state = find(checkpoint)
    if keep_every <= 0 or state is None or state.get("pruned") or state.get("updates", 0) % keep_every == 0:
        return False
    d = Path(state["path"])
    if Path(checkpoint).is_symlink() or d.is_symlink():
        return False  # never delete through a link: what it points at is not this checkpoint's
    for child in d.iterdir():
        if child.name != META:  # a link inside goes, what it points at stays
            child.unlink() if child.is_symlink() or not child.is_dir() else shutil.rmtree(child)
    write_meta(d, {**{k: v for k, v in state.items() if k not in ("path", "format")}, "pruned": True})
    return True


def save_partial(acc: Any, partial: Path, progress: dict) -> None:
    """Save the accelerate state and this process's ``progress`` as ``partial`` (built beside it
    and renamed into place: a kill while saving leaves the previous partial, or none). Collective."""
    tmp = partial.with_name(f"{partial.name}.tmp")
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    acc.save_state(str(tmp / STATE_DIR))
    progress = {"format": FORMAT, "processes": acc.num_processes, **progress}
    atomic_write_text(tmp / f"progress.{acc.process_index}.json", json.dumps(progress) + "\n")
    acc.wait_for_everyone()
    if acc.is_main_process:
        old = partial.with_name(f"{partial.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if partial.exists():
            os.replace(partial, old)
        os.replace(tmp, partial)
        shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


def load_partial(acc: Any, partial: Path) -> dict | None:
    """This process's progress from ``partial`` with the accelerate state loaded, or None when
    there is no usable partial (none, or saved by another number of processes: the plan differs)."""
    path = partial / f"progress.{acc.process_index}.json"
    try:
        progress = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if progress.get("format") != FORMAT or progress.get("processes") != acc.num_processes:
        return None
    acc.load_state(str(partial / STATE_DIR))
    return progress


def size_bytes(state_dir: Path) -> int:
    return sum(f.stat().st_size for f in state_dir.rglob("*") if f.is_file())


def serving_dtype(model: str) -> Any:
    """The dtype the input checkpoint is stored in (the output keeps it), or None."""
    import torch
    from transformers import AutoConfig

    dtype = getattr(AutoConfig.from_pretrained(model), "dtype", None)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def tied_keys(model: Any) -> set[str]:
    """State-dict keys that alias another tensor (``lm_head.weight`` of a tied-embedding model):
    left out on save, so the checkpoint stays tied and transformers re-ties on load."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(cfg, "tie_word_embeddings", False):
        return set()
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if isinstance(tied, dict) else set(tied)


def served(state_dict: dict, dtype: Any, drop: set[str]) -> dict:
    """The master weights cast to the serving dtype (round to nearest), tied aliases dropped."""
    return {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v)
            for k, v in state_dict.items() if k not in drop}


def audit(served_before: dict, master_before: dict | None, master_after: dict, served_after: dict) -> dict:
    """What the served checkpoint kept of this update, per element of the floating tensors.

    ``changed_fraction``: elements whose served value changed. ``master_update_l2``: the L2 norm of
    the fp32 update. ``rounding_lost_fraction``: ||served update - master update|| / ||master
    update|| (0 when serving in fp32; near 1 when the update is rounded away). ``residual_l2``:
    ||masters - served|| after the update, which only the trainer state carries forward.
    The snapshots may be one process's share (``spade_cli.training.masters``): then reduce the sums first.
    """
    from spade_cli.training import masters

    return masters.figures(masters.sums(served_before, master_before, master_after, served_after))


def refuse_nonfinite(names: list[str]) -> None:
    """Refuse to publish weights of which the tensors ``names`` hold NaN or infinity (a blow-up the
    loss guard cannot see, such as a cast to float16 that overflows)."""
    if names:
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        raise SpadeError(f"the updated weights are not finite (NaN or infinite) in {names[0]}{more}; "
                         "nothing was published")

