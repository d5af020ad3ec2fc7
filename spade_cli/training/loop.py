"""The update's training loop: from samples to a checkpoint directory, not yet published.

``spade update`` (``stages/update.py``) checks its inputs, reads the samples
(``spade_cli.training.samples``), then calls this module to compute the new checkpoint under a
temporary name, and publishes it. Here:

- ``resolve_state``: the trainer state the update resumes (the input checkpoint's
  ``trainer_state/``, unless ``--fresh-optimizer``) and the run's base model, the KL reference;
- ``train``: set up (``spade_cli.training.trainer.prepare``: model, AdamW, scheduler, the resumed
  state), continue a pass a SIGTERM left in ``OUT.partial-<confighash>/``, and take one pass
  (``trainer.train_pass``);
- ``save``: write the trainer state and the served checkpoint (the input's dtype, built from the
  real fp32 masters one parameter at a time) with the audit of what it kept of the update;
- ``copy_model``: the input model as a plain directory, for an update with nothing to learn.

Every process of an ``accelerate launch`` runs ``train`` and ``save`` (ZeRO-3 and FSDP gather and
save collectively); only the main one writes files. Nothing here prints: messages go to ``log``.

    state, base = loop.resolve_state(cfg)
    trained = loop.train(cfg, samples, log, state, base, partial)
    saved = loop.save(cfg, trained["trainer"], tmp)
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spade_cli.core.artifacts import atomic_write_text
from spade_cli.training import role_balance
from spade_cli.training.config import UpdateConfig

if TYPE_CHECKING:  # spade_cli.training.grpo imports torch: only inside functions here
    from spade_cli.training.grpo import Sample


def model_id(model: str) -> str:
    """How a model is named in the trainer state and update.json: a directory by its absolute path."""
    return str(Path(model).resolve()) if Path(model).is_dir() else model


def resolve_state(cfg: UpdateConfig) -> tuple[dict | None, str]:
    """(the trainer state to resume or None, the run's base model for the KL reference)."""
    from spade_cli.training import trainer_state

    found = trainer_state.find(cfg.model) if Path(cfg.model).is_dir() else None
    base = (found or {}).get("base_model") or model_id(cfg.model)
    if found is None or cfg.fresh_optimizer:
        return None, base
    trainer_state.check_resumable(found, cfg.lora, cfg.lora_r, cfg.lora_alpha)
    return found, base


def train(cfg: UpdateConfig, samples: list[Sample], log: Callable[[str], None], state: dict | None = None,
          base: str | None = None, partial: Path | None = None) -> dict:
    """Set up (resuming ``state`` when given) and take one pass; returns the pass's report plus the
    ``trainer`` that ``save`` writes. With ``partial``, a SIGTERM between optimizer steps saves the
    pass there and raises ``Preempted``, and a partial left by such a run is continued."""
    from spade_cli.training import trainer, trainer_state

    present, beta = {s.role for s in samples}, role_balance.betas(cfg)
    tr = trainer.prepare(cfg, {s.temperature for s in samples}, state, base or model_id(cfg.model),
                         kl=any(beta[r] != 0.0 for r in present))
    resumed = None
    if partial is not None and partial.is_dir():
        resumed = trainer_state.load_partial(tr.accelerator, partial)
        if resumed is None:
            log(f"{partial}: saved by another number of processes or unreadable; starting the pass over")
        else:
            log(f"resuming the preempted pass from {partial} (optimizer step {resumed['step']} done)")
    out = trainer.train_pass(tr, cfg, samples, log, partial, resumed)
    return {**out, "trainer": tr, "resumed_step": resumed["step"] if resumed else None}


def save(cfg: UpdateConfig, tr: Any, tmp: Path) -> dict:
    """Write the trainer state and the served checkpoint (input dtype, tied embeddings tied,
    config dtype = tensor dtype, tokenizer) to ``tmp``; returns the state figures and the audit.
    Every process calls this (ZeRO-3 and FSDP save and gather collectively); the main one writes."""
    import json

    from spade_cli.training import trainer_state

    acc, model = tr.accelerator, tr.model
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    state_dir = tmp / trainer_state.STATE_DIR
    t0 = time.perf_counter()
    acc.save_state(str(state_dir))  # before a LoRA merge below changes the model
    info = {"save_s": round(time.perf_counter() - t0, 3),
            **{k: v for k, v in tr.timings.items() if k != "rss_before_load_mb"}}
    dtype = trainer_state.serving_dtype(cfg.model)
    if cfg.lora:
        state_dict, audit = None, None
    else:
        state_dict, audit = _served_and_audit(acc, model, dtype, tr.snapshots)
    from spade_cli.training import masters

    memory = masters.host_memory(acc, tr.timings.get("rss_before_load_mb", 0.0), tr.snapshots)
    if not acc.is_main_process:
        return info
    trainer_state.write_meta(state_dir, {**tr.counters, "lora": cfg.lora, "lora_r": cfg.lora_r if cfg.lora else None,
                                         "lora_alpha": cfg.lora_alpha if cfg.lora else None,
                                         "processes": acc.num_processes,
                                         "distributed_type": str(acc.distributed_type)})
    info["bytes"] = trainer_state.size_bytes(state_dir)
    unwrapped = acc.unwrap_model(model)
    if cfg.lora:  # merged, so vLLM, lm-eval and the next rollout load it without peft
        unwrapped = unwrapped.merge_and_unload()
        out_sd = trainer_state.served(unwrapped.state_dict(), dtype, trainer_state.tied_keys(unwrapped))
        trainer_state.refuse_nonfinite([k for k, t in out_sd.items() if t.is_floating_point() and not t.isfinite().all()])
    else:
        out_sd = state_dict
    unwrapped.save_pretrained(tmp, state_dict=out_sd)
    if dtype is not None:  # save_pretrained writes the dtype of the fp32 masters, not of the tensors
        config = json.loads((tmp / "config.json").read_text())
        config["dtype"] = str(dtype).removeprefix("torch.")
        atomic_write_text(tmp / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    tr.tokenizer.save_pretrained(tmp)
    if audit is not None:
        info["audit"] = audit
    info["host_memory"] = memory
    return info


def _served_and_audit(acc: Any, model: Any, dtype: Any, snapshots: dict) -> tuple[dict | None, dict | None]:
    """The served state dict (on the main process; None elsewhere) from the real fp32 masters, one
    parameter at a time, and the audit from each process's share of the snapshots. Collective."""
    from spade_cli.training import masters, trainer_state

    out_sd: dict = {}
    local = [0.0] * len(masters.SUMS)
    before, m_before = snapshots.get("served_before"), snapshots.get("master_before")
    bad: list[str] = []
    for i, (name, master) in enumerate(masters.full(acc, model)):
        served = master.to(dtype) if dtype is not None else master
        if not served.isfinite().all():  # every process sees the full tensor: all refuse together
            bad.append(name)
        if acc.is_main_process:
            out_sd[name] = served
        if before is not None and masters.owns(acc, i):
            one = masters.sums({name: before[name]}, None if m_before is None else {name: m_before[name]},
                               {name: master}, {name: served})
            local = [a + b for a, b in zip(local, one, strict=True)]
    trainer_state.refuse_nonfinite(bad)
    audit = masters.figures(masters.reduce(acc, local)) if before is not None else None
    if not acc.is_main_process:
        return None, audit
    unwrapped = acc.unwrap_model(model)
    persistent = set(unwrapped.state_dict().keys())  # buffers saved with the weights (none in Qwen3)
    buffers = {k: b.detach().cpu() for k, b in unwrapped.named_buffers() if k in persistent}
    out_sd.update(trainer_state.served(buffers, dtype, trainer_state.tied_keys(unwrapped)))
    return out_sd, audit


def main_pid(acc: Any) -> int:
    """The main process's pid on every process: one temporary name for the checkpoint they build."""
    if acc.num_processes == 1:
        return os.getpid()
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([os.getpid()], from_process=0)[0]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # checkpoints are large and never modified in place: share the blocks
    except OSError:
        shutil.copy2(src, dst)


def copy_model(model: str, tmp: Path) -> None:
    """The input model as a plain checkpoint directory at ``tmp``: a directory's files hard-linked
    (its manifest and update.json left out: they describe the input), a hub id loaded and saved."""
    shutil.rmtree(tmp, ignore_errors=True)
    if Path(model).is_dir():
        shutil.copytree(model, tmp, copy_function=_link_or_copy,
                        ignore=shutil.ignore_patterns("*.manifest.json", "update.json"))
    else:  # a hub id: load and save it as a plain directory
        from transformers import AutoModelForCausalLM, AutoTokenizer

        AutoModelForCausalLM.from_pretrained(model).save_pretrained(tmp)
        AutoTokenizer.from_pretrained(model).save_pretrained(tmp)
